"""Single-turn rollouts: render each task's prompt once, generate a group per task, decode."""

from __future__ import annotations

from typing import Sequence

from transformers import PreTrainedTokenizerBase

from honing.engine.types import Engine, SamplingParams
from honing.rollout.types import Trajectory
from honing.tasks.types import Task


def prompt_ids(tokenizer: PreTrainedTokenizerBase, task: Task) -> list[int]:
    """The chat-templated prompt with the assistant turn opened, as token ids."""
    ids = tokenizer.apply_chat_template([dict(m) for m in task.prompt], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def rollout(engine: Engine, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Task],
            params: SamplingParams, seed: int | None = None) -> list[Trajectory]:
    """n = params.n samples per task, groups contiguous, in task order."""
    prompts = [prompt_ids(tokenizer, t) for t in tasks]
    groups = engine.generate(prompts, params, seed=seed)
    out: list[Trajectory] = []
    for g, (task, p, samples) in enumerate(zip(tasks, prompts, groups)):
        for s in samples:
            out.append(Trajectory(
                task_id=task.id, domain=task.domain, prompt_ids=tuple(p), completion_ids=s.token_ids,
                logprobs=s.logprobs, completion_text=tokenizer.decode(s.token_ids, skip_special_tokens=True),
                finish_reason=s.finish_reason, policy_version=engine.version, group=g,
            ))
    return out
