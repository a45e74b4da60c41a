"""Per-token log-probs of completions under a model, the trainer's side of the engine's numbers."""

from __future__ import annotations

from typing import Sequence

import torch
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


def completion_logprobs(model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                        completions: Sequence[Sequence[int]], pad_id: int,
                        temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T) of each completion token: ([B, C] log-probs, [B, C] mask).

    Only the C positions that predict completion tokens go through the LM head, so
    full-vocabulary logits for the prompt are never materialised.
    """
    ids, attn, pos, cmask, P = pack_batch(prompts, completions, pad_id)
    dev = model.device
    ids, attn, pos = ids.to(dev), attn.to(dev), pos.to(dev)
    C = cmask.shape[1]
    logits = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                   use_cache=False, logits_to_keep=C).logits
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    targets = ids[:, P:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    return logp, cmask.to(dev)
