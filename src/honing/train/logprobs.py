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


def head_logprobs(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  chunk_tokens: int = 0) -> torch.Tensor:
    """log softmax(head(h) / T)[target] for flat hidden states h [N, H] and targets [N], chunk_tokens
    rows at a time (0: all at once); with several chunks under grad each is checkpointed, so at
    most one chunk's [chunk, vocab] logits exist at once, in the forward and the backward pass."""
    N = h.shape[0]
    width = chunk_tokens if chunk_tokens > 0 else max(N, 1)
    recompute = torch.is_grad_enabled() and h.requires_grad and N > width
    out = []
    for c0 in range(0, N, width):
        hc, tc = h[c0:c0 + width], targets[c0:c0 + width]
        out.append(checkpoint(_chunk_logp, head, hc, tc, temperature, use_reentrant=False) if recompute
                   else _chunk_logp(head, hc, tc, temperature))
    return torch.cat(out) if out else h.new_zeros((0,))


def shared_prompt_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                       max_row_tokens: int) -> list[list[int]]:
    """Rows of a shared-prompt layout: sequence indices grouped by identical prompt (first-seen
    order), each group split into consecutive runs whose prompt + completions fit
    max_row_tokens (a run holds at least one completion)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    rows: list[list[int]] = []
    for p, idx in groups.items():
        cur: list[int] = []
        n = len(p)
        for i in idx:
            c = len(completions[i])
            if cur and n + c > max_row_tokens:
                rows.append(cur)
                cur, n = [], len(p)
            cur.append(i)
            n += c
        rows.append(cur)
    return rows


def shared_prompt_supported(model: PreTrainedModel) -> bool:
    """The shared-prompt layout needs plain lm_head logits and an attention that takes a custom
    4D mask (sdpa / eager), with no sliding window that the custom mask would override."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    sliding = (getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True)) or \
        "sliding_attention" in (getattr(cfg, "layer_types", None) or [])
    return (_head_and_decoder(model) is not None and not sliding
            and getattr(cfg, "_attn_implementation", "eager") in ("sdpa", "eager"))


def shared_prompt_logprobs(model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                           completions: Sequence[Sequence[int]], pad_id: int, temperature: float = 1.0,
                           chunk_tokens: int = 0, max_row_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """completion_logprobs with each distinct prompt run once for all of its completions.

    A GRPO group's n samples share their prompt. Each row here is [prompt | c_1 | c_2 | ... | c_k]
    with a 4D mask under which c_j attends to the prompt and to its own earlier tokens only, and
    positions that restart after the prompt for every c_j: every log-prob equals the one computed
    with [prompt | c_j] alone (the prompt's gradient is the sum over its completions, as autograd
    does for the shared activations). The prompt is computed once per row instead of once per
    sample, and completions are packed with no padding between them. Rows are capped at
    max_row_tokens (attention is quadratic in the row). Same outputs as completion_logprobs:
    ([B, C] log-probs, [B, C] mask), C the longest completion.
    """
    parts = _head_and_decoder(model)
    assert parts is not None, "shared_prompt_logprobs needs plain lm_head logits (see shared_prompt_supported)"
    dec, head = parts
    dev = model.device
    B, C = len(prompts), max(max((len(c) for c in completions), default=1), 1)
    rows = [r for r in shared_prompt_rows(prompts, completions, max_row_tokens)
            if any(completions[i] for i in r)]
    cmask = torch.zeros((B, C), dtype=torch.float32)
    for i, c in enumerate(completions):
        cmask[i, :len(c)] = 1.0
    if not rows:
        return torch.zeros((B, C), device=dev), cmask.to(dev)
    lengths = [len(prompts[r[0]]) + sum(len(completions[i]) for i in r) for r in rows]
    R, W = len(rows), max(lengths)
    ids = torch.full((R, W), pad_id, dtype=torch.long)
    pos = torch.zeros((R, W), dtype=torch.long)
    attn = torch.zeros((R, 1, W, W), dtype=torch.bool)
    g_row: list[int] = []
    g_col: list[int] = []
    tgt: list[int] = []
    out_b: list[int] = []
    out_t: list[int] = []
    for r, row in enumerate(rows):
        p = prompts[row[0]]
        P = len(p)
        ids[r, :P] = torch.tensor(list(p), dtype=torch.long)
        pos[r, :P] = torch.arange(P)
        attn[r, 0, :P, :P] = torch.ones((P, P), dtype=torch.bool).tril()
        o = P
        for i in row:
            c = completions[i]
            n = len(c)
            if not n:
                continue
            ids[r, o:o + n] = torch.tensor(list(c), dtype=torch.long)
            pos[r, o:o + n] = torch.arange(P, P + n)
            attn[r, 0, o:o + n, :P] = True
            attn[r, 0, o:o + n, o:o + n] = torch.ones((n, n), dtype=torch.bool).tril()
            g_row += [r] * n
            g_col += [P - 1] + list(range(o, o + n - 1))  # the position that predicts each token
            tgt += list(c)
            out_b += [i] * n
            out_t += range(n)
            o += n
        idx = torch.arange(o, W)
        attn[r, 0, idx, idx] = True  # padding attends to itself (no all-masked rows)
    ids, pos, attn = ids.to(dev), pos.to(dev), attn.to(dev)
    hidden = dec(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    h = hidden[torch.tensor(g_row, device=dev), torch.tensor(g_col, device=dev)]
    lp = head_logprobs(head, h, torch.tensor(tgt, device=dev), temperature, chunk_tokens)
    logp = torch.zeros((B, C), dtype=lp.dtype, device=dev).index_put(
        (torch.tensor(out_b, device=dev), torch.tensor(out_t, device=dev)), lp)
    return logp, cmask.to(dev)


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
