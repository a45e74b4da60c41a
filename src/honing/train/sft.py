"""Supervised warm start: loss only on assistant tokens, chat-template aware."""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from honing.engine.hf import autocast_ctx, bf16_supported
from honing.rollout.single import prompt_ids
from honing.tasks.types import Task
from honing.train.logprobs import completion_logprobs, token_budget_batches
from honing.train.losses import token_mean


def demonstrations(tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Task], template: str,
                   eos_id: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with the assistant turn opened, response ids + end-of-turn) per task.

    The response is tokenised on its own and appended, so the loss mask is exactly the
    assistant's tokens: nothing from the prompt or the template is trained on.
    """
    out = []
    for t in tasks:
        text = template.replace("{answer}", str(t.hidden["answer"]))
        out.append((prompt_ids(tokenizer, t), tokenizer.encode(text, add_special_tokens=False) + [eos_id]))
    return out


def sft(model: PreTrainedModel, demos: Sequence[tuple[list[int], list[int]]], pad_id: int, steps: int,
        learning_rate: float, batch_size: int, bf16_autocast: bool, seed: int = 0,
        on_step: Callable[[int, float], None] | None = None, micro_batch_tokens: int = 0,
        chunk_tokens: int = 0) -> list[float]:
    """Mean token NLL minimised with AdamW over `steps` random batches. Returns the losses.

    micro_batch_tokens > 0 packs each batch into length-bucketed micro-batches of at most that
    many padded tokens (gradients accumulated, divided by the batch's token count: the same
    update); chunk_tokens > 0 computes log-probs in chunks (see completion_logprobs).
    """
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=learning_rate)
    autocast = bf16_autocast and bf16_supported(model.device)
    model.train()
    losses = []
    for step in range(steps):
        batch = rng.sample(list(demos), min(batch_size, len(demos)))
        total = float(sum(len(b[1]) for b in batch))
        groups = (token_budget_batches([(len(p), len(c)) for p, c in batch], micro_batch_tokens)
                  if micro_batch_tokens else [list(range(len(batch)))])
        loss = torch.zeros(())
        for idx in groups:
            micro = [batch[i] for i in idx]
            with autocast_ctx(autocast, model.device):
                logp, mask = completion_logprobs(model, [b[0] for b in micro], [b[1] for b in micro], pad_id,
                                                 chunk_tokens=chunk_tokens)
            part = -token_mean(logp, mask, total_tokens=total)
            part.backward()
            loss = loss + part.detach().cpu()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, losses[-1])
    model.eval()
    return losses
