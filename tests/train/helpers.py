"""Shared fixtures for the trainer tests: the tiny random model and trajectories sampled from it."""

from __future__ import annotations

import torch

from honing.config import LoraConfig, TrainConfig
from honing.engine import SamplingParams, TransformersEngine
from honing.rollout.types import Trajectory
from honing.train.trainer import PolicyTrainer

QUESTIONS = ["What is 12 + 30? Answer with a number.", "Calculate 7 + 8.", "hi"]


def prompts(tok) -> list[list[int]]:  # noqa: ANN001
    out = []
    for q in QUESTIONS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False).input_ids)
    return out


def engine(model, tok) -> TransformersEngine:  # noqa: ANN001
    return TransformersEngine(model, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


def sampled_trajectories(model, tok, lengths=(8, 3, 6, 1, 8, 5, 2, 7),  # noqa: ANN001
                         advs=(1.0, -0.5, 0.75, -1.25, -0.3, 0.9, 0.4, 1.1),
                         rewards=(1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 1.0)) -> list[Trajectory]:
    """2 groups of 4 with the engine's sampling log-probs, uneven lengths and prompts, set advantages."""
    ps = prompts(tok)[:2]
    out = engine(model, tok).generate(ps, SamplingParams(n=4, max_new_tokens=8, temperature=1.0), seed=3)
    trajs = []
    for g, (p, group) in enumerate(zip(ps, out)):
        for s in group:
            i = len(trajs)
            ids, lps = s.token_ids[:lengths[i]], s.logprobs[:lengths[i]]
            trajs.append(Trajectory(task_id=f"t{g}", domain="test", prompt_ids=tuple(p), completion_ids=ids,
                                    logprobs=lps, completion_text=tok.decode(ids), finish_reason="length",
                                    policy_version=0, group=g, advantage=advs[i], reward=rewards[i]))
    assert [len(t.completion_ids) for t in trajs] == list(lengths)
    return trajs


def copy_trajs(trajs: list[Trajectory], **changes) -> list[Trajectory]:  # noqa: ANN003
    return [Trajectory(**{**t.__dict__, **changes}) for t in trajs]


def make_trainer(model, tok, lora: LoraConfig | None = None, **train_kw) -> PolicyTrainer:  # noqa: ANN001, ANN003
    cfg = TrainConfig(**{"micro_batch_size": 8, "learning_rate": 1e-3, "max_grad_norm": 1e9, **train_kw})
    return PolicyTrainer(model, tok.pad_token_id, cfg, lora or LoraConfig(), bf16_autocast=False, temperature=1.0)


def first_step_grads(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """The gradient of the first optimizer step, read back from AdamW: exp_avg = (1 - beta1) * grad."""
    b1 = trainer.cfg.betas[0]
    return {n: trainer.opt.state[p]["exp_avg"] / (1 - b1) for n, p in trainer.model.named_parameters()
            if p.requires_grad and p in trainer.opt.state}


def params(model) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {k: v.detach().clone() for k, v in model.named_parameters()}
