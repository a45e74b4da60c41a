"""Supervised warm start: loss only on assistant tokens, chat-template aware.

A demonstration is (prompt ids, completion ids, loss mask), exactly the token layout of an RL
trajectory (`Trajectory.prompt_ids`, `completion_ids`, `loss_mask`): a multi-turn episode's
completion interleaves assistant replies (mask 1) with the observations inserted after them
(mask 0), so SFT trains on every assistant turn and on nothing the environment wrote. A plain
(prompt, completion) pair is a demonstration with an all-ones mask.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from honing.engine.hf import autocast_ctx, bf16_supported
from honing.rollout.single import prompt_ids
from honing.tasks.types import Task
from honing.train import memory
from honing.train.logprobs import (
    _head_and_decoder,
    completion_logprobs,
    head_logprobs,
    token_budget_batches,
)
from honing.train.losses import token_mean

Demo = tuple[Sequence[int], Sequence[int]]  # (prompt, completion), or with a third item: the loss mask


def demo_parts(d: Any) -> tuple[Sequence[int], Sequence[int], Sequence[int]]:
    """(prompt ids, completion ids, loss mask) of a demonstration: a (prompt, completion) pair, a
    (prompt, completion, mask) triple, or anything with `prompt_ids`, `completion_ids` and
    `loss_mask` (a Trajectory, a demos.Demonstration)."""
    if hasattr(d, "completion_ids"):
        p, c, m = d.prompt_ids, d.completion_ids, d.loss_mask
    elif len(d) == 3:
        p, c, m = d
    else:
        p, c = d
        m = ()
    if not m:
        m = (1,) * len(c)
    if len(m) != len(c):
        raise ValueError(f"loss mask has {len(m)} entries for {len(c)} completion tokens")
    return p, c, m


def loss_tokens(d: Any) -> int:
    """How many tokens of a demonstration the loss is taken on."""
    return int(sum(demo_parts(d)[2]))


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


def pack_demos(demos: Sequence[Demo], pack_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of demonstrations into rows of at most `pack_tokens`
    tokens (prompt + response). Returns rows of demo indices; every index appears exactly once.
    A demo longer than `pack_tokens` gets a row of its own."""
    if pack_tokens <= 0:
        raise ValueError(f"pack_tokens must be > 0, got {pack_tokens}")
    lengths = [len(p) + len(c) for p, c, _ in map(demo_parts, demos)]
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(demos)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        if n <= pack_tokens:
            for r, f in enumerate(free):
                if f >= n:
                    rows[r].append(i)
                    free[r] -= n
                    break
            else:
                rows.append([i])
                free.append(pack_tokens - n)
        else:
            rows.append([i])
            free.append(-1)
    return rows


def packed_layout(demos: Sequence[Demo], rows: Sequence[Sequence[int]],
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay each row's demos end to end: (input_ids [R, L], position_ids [R, L], and for every
    response token in row/demo order: row index [N], column of the position predicting it [N],
    token id [N]; only tokens with loss mask 1). Position ids restart at 0 for each demo and for the padding tail, which is
    what makes transformers (>= 4.54: masking_utils.find_packed_sequence_indices, or the
    flash-attention varlen path) attend only within a demo when attention_mask is None."""
    L = max(sum(len(demo_parts(demos[i])[0]) + len(demo_parts(demos[i])[1]) for i in row) for row in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), L), dtype=torch.long)
    g_row: list[int] = []
    g_col: list[int] = []
    tgt: list[int] = []
    for r, row in enumerate(rows):
        s = 0
        for i in row:
            p, c, m = demo_parts(demos[i])
            if not p:
                raise ValueError(f"demonstration {i} has an empty prompt: its first response token has no context")
            n = len(p) + len(c)
            ids[r, s:s + n] = torch.tensor(list(p) + list(c), dtype=torch.long)
            pos[r, s:s + n] = torch.arange(n)
            keep = [j for j in range(len(c)) if m[j]]  # only the loss-masked tokens are targets
            g_row += [r] * len(keep)
            g_col += [s + len(p) - 1 + j for j in keep]
            tgt += [c[j] for j in keep]
            s += n
        pos[r, s:] = torch.arange(L - s)
    return ids, pos, *(torch.tensor(x, dtype=torch.long) for x in (g_row, g_col, tgt))


def packed_logprobs(model: PreTrainedModel, demos: Sequence[Demo], rows: Sequence[Sequence[int]], pad_id: int,
                    chunk_tokens: int = 0) -> torch.Tensor:
    """log p of every loss-masked response token of the demos packed as `rows` (see pack_demos),
    flattened in row order, then demo order within a row: shape [the rows' loss-token count].

    One forward over [R, L] with no attention across demo boundaries, so each value equals the
    one computed with the demo alone. Only response positions go through the LM head; with
    chunk_tokens > 0 it runs chunk_tokens positions at a time (checkpointed under grad).
    """
    ids, pos, g_row, g_col, tgt = packed_layout(demos, rows, pad_id)
    dev = model.device
    ids, pos, g_row, g_col, tgt = ids.to(dev), pos.to(dev), g_row.to(dev), g_col.to(dev), tgt.to(dev)
    parts = _head_and_decoder(model)
    if parts is None:  # logits are not plain lm_head(hidden): take the full logits and gather
        logits = model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False).logits
        return torch.log_softmax(logits[g_row, g_col].float(), dim=-1).gather(-1, tgt[:, None]).squeeze(-1)
    dec, head = parts
    hidden = dec(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False).last_hidden_state
    return head_logprobs(head, hidden[g_row, g_col], tgt, 1.0, chunk_tokens)


def _row_groups(rows: list[list[int]], lengths: Sequence[int], budget: int) -> list[list[list[int]]]:
    """Rows (longest first, as pack_demos makes them) split into forwards of at most `budget`
    padded tokens (rows x longest row); a row over the budget runs alone. 0: one forward."""
    if budget <= 0:
        return [rows]
    groups: list[list[list[int]]] = []
    cur: list[list[int]] = []
    width = 0
    for row in sorted(rows, key=lambda r: -sum(lengths[i] for i in r)):
        n = sum(lengths[i] for i in row)
        if cur and (len(cur) + 1) * max(width, n) > budget:
            groups.append(cur)
            cur, width = [], 0
        cur.append(row)
        width = max(width, n)
    if cur:
        groups.append(cur)
    return groups


def _batch_losses(model: PreTrainedModel, batch: Sequence[Demo], pad_id: int, autocast: bool,
                  micro_batch_tokens: int, chunk_tokens: int, pack_tokens: int) -> Iterator[torch.Tensor]:
    """The batch's loss (mean NLL over all its response tokens) as parts, one per forward pass,
    each divided by the whole batch's token count: backward on each part accumulates exactly the
    gradient of the full batch. Yielded one at a time so only one forward's graph is alive."""
    parts = [demo_parts(d) for d in batch]
    total = float(sum(sum(m) for _, _, m in parts))
    if pack_tokens > 0:
        lengths = [len(p) + len(c) for p, c, _ in parts]
        for rows in _row_groups(pack_demos(batch, pack_tokens), lengths, micro_batch_tokens):
            with autocast_ctx(autocast, model.device):
                logp = packed_logprobs(model, batch, rows, pad_id, chunk_tokens=chunk_tokens)
            yield -logp.sum() / max(total, 1.0)
        return
    groups = (token_budget_batches([(len(p), len(c)) for p, c, _ in parts], micro_batch_tokens)
              if micro_batch_tokens else [list(range(len(batch)))])
    for idx in groups:
        micro = [parts[i] for i in idx]
        with autocast_ctx(autocast, model.device):
            logp, mask = completion_logprobs(model, [b[0] for b in micro], [b[1] for b in micro], pad_id,
                                             chunk_tokens=chunk_tokens)
        demo_mask = torch.zeros_like(mask)
        for row, (_, _, m) in enumerate(micro):
            demo_mask[row, :len(m)] = torch.tensor(m, dtype=mask.dtype)
        yield -token_mean(logp, mask * demo_mask, total_tokens=total)


def sft(model: PreTrainedModel, demos: Sequence[Any], pad_id: int, steps: int,
        learning_rate: float, batch_size: int, bf16_autocast: bool, seed: int = 0,
        on_step: Callable[[int, float], None] | None = None, micro_batch_tokens: int = 0,
        chunk_tokens: int = 0, pack_tokens: int = 0, start_step: int = 0,
        optimizer_state: dict | None = None,
        on_checkpoint: Callable[[int, dict], None] | None = None, checkpoint_every: int = 0,
        should_stop: Callable[[], bool] | None = None) -> list[float]:
    """Mean token NLL minimised with AdamW over `steps` random batches. Returns the losses of the
    steps run (start_step..steps-1).

    A demonstration is anything `demo_parts` reads; the loss is on its loss-masked completion
    tokens only. micro_batch_tokens > 0 packs each batch into length-bucketed micro-batches of at
    most that many padded tokens (gradients accumulated, divided by the batch's token count: the
    same update); chunk_tokens > 0 computes log-probs in chunks (see completion_logprobs).

    pack_tokens > 0 packs each batch's demonstrations end to end into rows of at most that many
    tokens (pack_demos), attention confined to each demo and position ids restarting per demo,
    so the loss and its gradient equal the unpacked ones with (almost) no padding; with
    micro_batch_tokens > 0 as well, the rows run in forwards of at most that many tokens.

    Resuming: `start_step` > 0 with the `optimizer_state` a checkpoint saved continues exactly
    where that run was (the batch order is a pure function of `seed` and the step).
    `on_checkpoint(step, {"optimizer": ...})` is called every `checkpoint_every` steps and after the last.
    `should_stop()` true after a step (a stop signal) checkpoints that step and returns early.
    """
    rng = random.Random(seed)
    pool = list(demos)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=learning_rate)
    if optimizer_state:
        opt.load_state_dict(optimizer_state)
    autocast = bf16_autocast and bf16_supported(model.device)
    model.train()
    losses = []
    for step in range(steps):
        batch = rng.sample(pool, min(batch_size, len(pool)))
        if step < start_step:  # a resumed run: the same batches in the same order
            continue
        loss = torch.zeros(())
        for part in _batch_losses(model, batch, pad_id, autocast, micro_batch_tokens, chunk_tokens, pack_tokens):
            part.backward()
            loss = loss + part.detach().cpu()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        memory.release_free_memory()  # batches differ in length: without this RSS ratchets up (memory.py)
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, losses[-1])
        stopping = should_stop is not None and step + 1 < steps and should_stop()
        if on_checkpoint and (stopping or checkpoint_every and ((step + 1) % checkpoint_every == 0 or step + 1 == steps)):
            model.eval()
            on_checkpoint(step + 1, {"optimizer": opt.state_dict()})
            model.train()
        if stopping:
            break
    model.eval()
    return losses
