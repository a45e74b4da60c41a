"""One rollout call for a batch that mixes single-turn tasks and multi-turn ones (tasks with an
`environment`): each kind goes through its own loop, and the trajectories come back in task
order with `group` = the task's index, as if one loop had produced them all."""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from honing.engine.types import Engine, SamplingParams
from honing.rollout.single import rollout
from honing.rollout.types import Trajectory


def is_multiturn(task: Any) -> bool:
    return bool(task.environment)


def rollout_tasks(engine: Engine, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Any], params: SamplingParams,
                  seed: int | None = None, sandbox: Any = None, multiturn: Any = None) -> list[Trajectory]:
    """`params.n` trajectories per task. Multi-turn tasks need `sandbox`; `multiturn` is their
    MultiTurnConfig (None: its defaults)."""
    single_idx = [i for i, t in enumerate(tasks) if not is_multiturn(t)]
    multi_idx = [i for i, t in enumerate(tasks) if is_multiturn(t)]
    out: list[Trajectory] = []
    if single_idx:
        for t in rollout(engine, tokenizer, [tasks[i] for i in single_idx], params, seed=seed):
            t.group = single_idx[t.group]
            out.append(t)
    if multi_idx:
        if sandbox is None:
            raise ValueError("multi-turn tasks need a sandbox")
        from honing.rollout.multiturn import multiturn_rollout

        sub = [tasks[i] for i in multi_idx]
        for t in multiturn_rollout(engine, tokenizer, sub, params, sandbox, multiturn,
                                   seed=None if seed is None else seed + 1):
            t.group = multi_idx[t.group]
            out.append(t)
    out.sort(key=lambda t: t.group)  # stable: samples of a group keep their order
    return out
