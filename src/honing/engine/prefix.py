"""Prefix caching for the transformers engine: the KV of prompts already prefilled, per row.

A multi-turn episode sends its whole history every turn (prompt, replies, observations), and all
but the last reply and observation were prefilled the turn before. Re-running that prefill is
most of an agentic rollout's time on a CPU (a repair prompt is ~1-3k tokens; the reply is at
most a few hundred). vLLM caches prefixes by block hash; here the cache holds each prefilled
prompt's KV under its token ids, and a new prompt reuses the longest stored prefix, so only its
new tokens run through the model.

The KV is only valid for the weights that made it: the engine opens a scope per rollout (weights
do not change inside one) and clears it on exit and on any weight load.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, length, head_dim]


class PrefixCache:
    """Token ids -> that prompt's KV, least recently used evicted past `max_tokens`."""

    def __init__(self, max_tokens: int = 65536) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self.tokens = 0
        self.stats = {"lookups": 0, "hits": 0, "reused_tokens": 0, "prompt_tokens": 0}

    def longest(self, ids: Sequence[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of `ids`, at most len(ids) - 1 tokens (the last prompt token
        must run through the model for its logits): (its length, its KV sliced to that length)."""
        self.stats["lookups"] += 1
        self.stats["prompt_tokens"] += len(ids)
        best: tuple[int, ...] | None = None
        ids_t = tuple(ids)
        for key in self.entries:
            if len(key) <= len(ids_t) and (best is None or len(key) > len(best)) and ids_t[:len(key)] == key:
                best = key
        if best is None:
            return 0, None
        self.entries.move_to_end(best)
        n = min(len(best), len(ids_t) - 1)
        if n <= 0:
            return 0, None
        self.stats["hits"] += 1
        self.stats["reused_tokens"] += n
        return n, [(k[:, :, :n], v[:, :, :n]) for k, v in self.entries[best]]

    def put(self, ids: Sequence[int], kv: KV) -> None:
        """Store `kv` for `ids`. An entry that is a prefix of `ids` is dropped: it was the same
        episode's previous turn, and `ids` covers every prompt it could still serve."""
        key = tuple(ids)
        for old in [k for k in self.entries if len(k) <= len(key) and key[:len(k)] == k]:
            self._drop(old)
        self.entries[key] = kv
        self.tokens += len(key)
        while self.tokens > self.max_tokens and len(self.entries) > 1:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        del self.entries[key]
        self.tokens -= len(key)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


def batch_past(kvs: Sequence[KV | None], lengths: Sequence[int], like: KV) -> tuple[KV, torch.Tensor]:
    """Left-padded batch of cached prefixes: per layer [B, heads, max length, head_dim] (zeros where
    a row has less), and the [B, max length] attention mask of the real positions. `like` is any
    stored KV (shapes, dtype, device)."""
    width = max(lengths)
    rows = len(kvs)
    mask = torch.zeros((rows, width), dtype=torch.long, device=like[0][0].device)
    out: KV = []
    for layer, (k0, v0) in enumerate(like):
        k = k0.new_zeros((rows, k0.shape[1], width, k0.shape[3]))
        v = v0.new_zeros((rows, v0.shape[1], width, v0.shape[3]))
        for r, (kv, n) in enumerate(zip(kvs, lengths, strict=True)):
            if kv is not None and n:
                k[r, :, width - n:] = kv[layer][0][0]
                v[r, :, width - n:] = kv[layer][1][0]
        out.append((k, v))
    for r, n in enumerate(lengths):
        if n:
            mask[r, width - n:] = 1
    return out, mask


def row_kv(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], row: int, real: torch.Tensor) -> KV:
    """Row `row` of a batch cache, only its real (unpadded) positions `real` [width] bool (a copy)."""
    return [(k[row:row + 1, :, real], v[row:row + 1, :, real]) for k, v in layers]
