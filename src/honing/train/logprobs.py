"""Per-token log-probs of completions under a model, the trainer's side of the engine's numbers."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel


def pack_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
               pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Lay out [left-padded prompt | right-padded completion] so all completions start at column P.

    Returns input_ids [B, P+C], attention_mask, position_ids, completion_mask [B, C], P.
    """
    P = max(len(p) for p in prompts)
    C = max(max((len(c) for c in completions), default=1), 1)
    B = len(prompts)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    cmask = torch.zeros((B, C), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p):P] = torch.tensor(list(p), dtype=torch.long)
        attn[i, P - len(p):P] = 1
        if c:
            ids[i, P:P + len(c)] = torch.tensor(list(c), dtype=torch.long)
            attn[i, P:P + len(c)] = 1
            cmask[i, :len(c)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, cmask, P


def _head_and_decoder(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, lm_head) when logits are plain lm_head(hidden) (Llama, Qwen, SmolLM, Mistral...);
    None for models that rescale or soft-cap logits (Gemma, Cohere): those use the unchunked path."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1.0):
        return None
    get_dec, head = getattr(base, "get_decoder", None), base.get_output_embeddings()
    dec = get_dec() if get_dec else None
    if dec is None or head is None or dec is base:
        return None
    return dec, head


def _chunk_logp(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = head(hidden).float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def completion_logprobs(model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                        completions: Sequence[Sequence[int]], pad_id: int,
                        temperature: float = 1.0, chunk_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T) of each completion token: ([B, C] log-probs, [B, C] mask).

    Only the C positions that predict completion tokens go through the LM head, so
    full-vocabulary logits for the prompt are never materialised. With `chunk_tokens` > 0 the
    head runs on column chunks of about chunk_tokens (rows x positions) at a time, each under
    activation checkpointing when gradients are on and there is more than one chunk: at most
    one chunk's [rows, w, vocab] logits exist at once, in the forward and in the backward pass
    (the head is then recomputed per chunk in the backward pass).
    """
    ids, attn, pos, cmask, P = pack_batch(prompts, completions, pad_id)
    dev = model.device
    ids, attn, pos = ids.to(dev), attn.to(dev), pos.to(dev)
    B, C = cmask.shape
    targets = ids[:, P:]
    parts = _head_and_decoder(model) if chunk_tokens > 0 else None
    if parts is None:
        logits = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                       use_cache=False, logits_to_keep=C).logits
        logits = logits.float()
        if temperature not in (0.0, 1.0):
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        return logp, cmask.to(dev)
    dec, head = parts
    hidden = dec(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                 use_cache=False).last_hidden_state[:, P - 1:]
    width = max(1, chunk_tokens // B)
    # One chunk within the budget may keep its logits for the backward pass; several are
    # recomputed one at a time (else all of them would be saved for backward at once).
    recompute = torch.is_grad_enabled() and hidden.requires_grad and C > width
    out = []
    for c0 in range(0, C, width):
        h, tg = hidden[:, c0:c0 + width], targets[:, c0:c0 + width]
        if recompute:
            out.append(checkpoint(_chunk_logp, head, h, tg, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logp(head, h, tg, temperature))
    return torch.cat(out, dim=1), cmask.to(dev)


def token_budget_batches(lengths: Sequence[tuple[int, int]], budget: int) -> list[list[int]]:
    """Length-bucketed micro-batches: indices sorted by (prompt + completion, prompt) length and
    packed greedily while rows x (longest prompt + longest completion) <= budget, so little
    compute goes to padding. `lengths` are (prompt, completion) pairs; a sequence longer than
    the budget gets a micro-batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (sum(lengths[i]), lengths[i][0], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    mp = mc = 0
    for i in order:
        p, c = lengths[i]
        np_, nc = max(mp, p), max(mc, c, 1)
        if cur and (len(cur) + 1) * (np_ + nc) > budget:
            batches.append(cur)
            cur, np_, nc = [], p, max(c, 1)
        cur.append(i)
        mp, mc = np_, nc
    if cur:
        batches.append(cur)
    return batches
