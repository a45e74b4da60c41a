"""Speculative decoding with an n-gram draft (prompt lookup), for one stream.

Decoding a small model one token at a time on a CPU is per-step overhead, not arithmetic: a forward
over 1 + k tokens costs little more than over 1. A draft of k tokens is guessed for free from the
sequence itself (the tokens that followed the latest earlier occurrence of its last n-gram: replies
copy their prompt's numbers, names, identifiers and code, and small models repeat themselves), the
target model scores all of them in one forward, and the longest prefix it agrees with is kept, plus
one token of its own. Nothing about the output distribution changes:

- greedy: a draft token is kept iff it is the argmax; the first disagreement is replaced by the
  argmax, so the tokens are those of plain greedy decoding (up to float rounding of a k-token forward);
- sampling: the draft is a point mass q = delta_d, so the standard speculative rule (Leviathan et
  al. 2023) keeps d with probability p(d) and otherwise samples from max(p - q, 0) normalised, which
  is p with d removed: every emitted token is distributed exactly as p (the filtered, tempered
  distribution plain decoding samples from).

Log-probs are those plain decoding records: log softmax(logits / T) of the emitted token (T = 1
when greedy), before top-p/top-k truncation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from honing.engine.hf import truncate
from honing.engine.types import Sample, SamplingParams


@dataclass(frozen=True)
class NgramDraft:
    """`num_tokens`: the longest draft; the last `max_ngram` .. `min_ngram` tokens are looked up.
    With `adaptive`, the draft length follows the acceptance (the heuristic schedule of
    transformers' assisted generation): +2 after a fully accepted draft, -1 after a rejection."""

    num_tokens: int = 8
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.num_tokens < 1 or self.min_ngram < 1 or self.max_ngram < self.min_ngram:
            raise ValueError(f"bad n-gram draft {self}: need num_tokens >= 1 and 1 <= min_ngram <= max_ngram")


def ngram_draft(seq: Sequence[int], draft: NgramDraft) -> list[int]:
    """The tokens that followed an earlier occurrence of `seq`'s last n-gram (longest n first), at
    most `draft.num_tokens` of them: the latest occurrence with the longest continuation (the
    latest one alone, inside a run of repeats, is followed by a single token); [] when none recurs."""
    n_seq = len(seq)
    k = draft.num_tokens
    for n in range(min(draft.max_ngram, n_seq - 1), draft.min_ngram - 1, -1):
        tail = list(seq[n_seq - n:])
        first = tail[0]
        best: list[int] = []
        for start in range(n_seq - n - 1, -1, -1):  # latest first; the tail itself excluded
            if seq[start] == first and list(seq[start:start + n]) == tail:
                follow = list(seq[start + n:start + n + k])
                if len(follow) > len(best):
                    best = follow
                    if len(best) == k:
                        break
        if best:
            return best
    return []


def filtered_logprobs(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(logits / T), the normalised log-probs actually sampled from after top-k/top-p)."""
    logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
    return logp, torch.log_softmax(truncate(logp, params), dim=-1)


def verify_draft(logits: torch.Tensor, draft: Sequence[int], params: SamplingParams,
                 gen: torch.Generator | None) -> tuple[list[int], list[float], torch.Tensor | None]:
    """Accept a prefix of `draft` against the target's `logits` [k + 1, V] (row i predicts the
    token after draft[:i]). Returns (accepted tokens, their log-probs, the distribution to take the
    next token from): None when all k were kept (then row k is sampled as usual); otherwise
    log-probs [1, V] with the rejected token removed (sampling) or row i itself (greedy)."""
    k = len(draft)
    if params.temperature == 0:
        arg = logits[:k].argmax(-1).tolist()
        logp = torch.log_softmax(logits[:k].float(), dim=-1)
        out, lps = [], []
        for i, d in enumerate(draft):
            if arg[i] != d:
                return out, lps, logits[i:i + 1]
            out.append(d)
            lps.append(float(logp[i, d]))
        return out, lps, None
    logp, filt = filtered_logprobs(logits[:k], params)
    out, lps = [], []
    u = torch.rand(k, generator=gen, dtype=torch.float64)
    for i, d in enumerate(draft):
        if float(u[i]) < float(filt[i, d].exp()):
            out.append(d)
            lps.append(float(logp[i, d]))
            continue
        residual = filt[i:i + 1].clone()
        residual[0, d] = float("-inf")  # max(p - delta_d, 0): p without d
        return out, lps, residual
    return out, lps, None


def crop_cache(cache: Any, n: int) -> None:
    """Drop the last `n` positions of a transformers cache (negative `crop` works in 4.x and 5.x)."""
    if n > 0:
        cache.crop(-n)


def speculative_decode(forward: Callable[[torch.Tensor, Any, int], torch.Tensor], prompt: Sequence[int],
                       first_logits: torch.Tensor, cache: Any, params: SamplingParams, draft_cfg: NgramDraft,
                       eos: set[int], gen: torch.Generator | None,
                       sample: Callable[[torch.Tensor], tuple[int, float]],
                       on_token: Callable[[int], None] | None = None) -> tuple[Sample, dict[str, int]]:
    """Decode one stream. `forward(ids [1, m], cache, past_len)` runs the model over m new tokens at
    positions past_len.. and returns logits [m, V]; `first_logits` [1, V] is the prefill's last row;
    `sample(logits [1, V])` draws one token the way plain decoding does, returning (token, log-prob).
    Returns the sample and counters (forwards, drafted, accepted)."""
    seq = list(prompt)
    toks: list[int] = []
    lps: list[float] = []
    stats = {"forwards": 0, "drafted": 0, "accepted": 0}
    past = len(seq)  # positions held by the cache
    k_max = draft_cfg.num_tokens
    nxt, nxt_lp = sample(first_logits)
    pending: list[tuple[int, float]] = [(nxt, nxt_lp)]
    reason = "length"
    while True:
        for t, lp in pending:  # emit what is decided
            toks.append(t)
            lps.append(lp)
            seq.append(t)
            if on_token is not None:
                on_token(t)
            if t in eos:
                return Sample(tuple(toks), tuple(lps), "stop"), stats
            if len(toks) >= params.max_new_tokens:
                return Sample(tuple(toks), tuple(lps), reason), stats
        last = toks[-1]
        room = params.max_new_tokens - len(toks)  # tokens still allowed after `last`
        draft = ngram_draft(seq, draft_cfg)[:max(min(k_max, room - 1), 0)]
        ids = torch.tensor([[last, *draft]], dtype=torch.long)
        logits = forward(ids, cache, past)  # [1 + k, V]
        stats["forwards"] += 1
        stats["drafted"] += len(draft)
        kept, kept_lps, rest = verify_draft(logits, draft, params, gen) if draft else ([], [], logits[:1])
        stats["accepted"] += len(kept)
        if draft and draft_cfg.adaptive:
            k_max = min(k_max + 2, draft_cfg.num_tokens) if len(kept) == len(draft) else max(1, k_max - 1)
        crop_cache(cache, len(draft) - len(kept))  # positions of rejected draft tokens
        past += 1 + len(kept)
        pending = list(zip(kept, kept_lps))
        if rest is None:  # every draft token kept: the target's own next token comes free
            rest = logits[len(kept):len(kept) + 1]
            t, lp = sample(rest)
        elif params.temperature == 0:
            t, lp = sample(rest)
        else:  # draw from the residual; record the log-prob under the full tempered distribution
            t = int(torch.multinomial(rest.exp(), 1, generator=gen))
            full = torch.log_softmax(logits[len(kept):len(kept) + 1].float() / params.temperature, dim=-1)
            lp = float(full[0, t])
        # a token that would break the stream after an EOS in `kept` is never emitted: the emit
        # loop returns at the EOS first
        pending.append((t, lp))
