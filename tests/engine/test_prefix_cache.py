"""Prefix caching in the transformers engine (engine/prefix.py): a prompt that extends one already
prefilled runs only its new tokens, and generates what a fresh prefill generates (same greedy
tokens, log-probs within float rounding), in batches that mix hits of different lengths, misses
and duplicates; the cache never outlives the weights that made it."""

from __future__ import annotations

import random

import pytest
import torch

from honing.engine import SamplingParams, TransformersEngine
from honing.engine.prefix import PrefixCache
from honing.models import build_tiny_random


@pytest.fixture(scope="module")
def tiny() -> tuple:
    torch.manual_seed(0)
    model, tok = build_tiny_random(seed=0)
    return model, tok


def _engine(model, tok) -> TransformersEngine:  # noqa: ANN001
    return TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, False, 16)


def _same(a, b) -> None:  # noqa: ANN001
    for ga, gb in zip(a, b, strict=True):
        for sa, sb in zip(ga, gb, strict=True):
            assert sa.token_ids == sb.token_ids
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-4)


def test_longest_prefix_lookup_against_a_naive_reference() -> None:
    rng = random.Random(0)
    kv = [(torch.zeros(1, 1, 40, 2), torch.zeros(1, 1, 40, 2))]
    for _ in range(300):
        pc = PrefixCache(max_tokens=10_000)
        stored = set()
        for _ in range(rng.randrange(0, 6)):
            key = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 8)))
            pc.put(key, [(k[:, :, :len(key)], v[:, :, :len(key)]) for k, v in kv])
            stored = {s for s in stored if key[:len(s)] != s} | {key}  # a stored prefix of the new key is dropped
        assert set(pc.entries) == stored
        ids = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 10)))
        prefixes = [s for s in stored if ids[:len(s)] == s]
        want = min(max((len(s) for s in prefixes), default=0), len(ids) - 1)
        n, got = pc.longest(ids)
        assert n == want
        assert (got is None) == (want == 0)
        if got is not None:
            assert got[0][0].shape[2] == n


def test_lru_eviction_keeps_the_token_budget() -> None:
    pc = PrefixCache(max_tokens=10)
    kv = lambda n: [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]  # noqa: E731
    pc.put((1, 2, 3, 4), kv(4))
    pc.put((5, 6, 7, 8), kv(4))
    assert pc.longest((1, 2, 3, 4, 9))[0] == 4  # touched: (5, 6, 7, 8) is now the oldest
    pc.put((9, 9, 9, 9), kv(4))
    assert set(pc.entries) == {(1, 2, 3, 4), (9, 9, 9, 9)} and pc.tokens == 8


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_turns_generate_what_a_fresh_prefill_generates(tiny, temperature: float) -> None:  # noqa: ANN001
    model, tok = tiny
    rng = random.Random(1)
    vocab = [i for i in range(len(tok)) if i not in (tok.eos_token_id, tok.pad_token_id)]
    params = SamplingParams(max_new_tokens=12, temperature=temperature, n=1)
    # six "episodes" of different prompt lengths, two of them identical (a GRPO group's turn 0)
    first = [[rng.choice(vocab) for _ in range(rng.randrange(5, 40))] for _ in range(5)]
    first.append(list(first[2]))
    cached, fresh = _engine(model, tok), _engine(model, tok)
    with cached.prefix_caching() as pc:
        histories = [list(p) for p in first]
        for turn in range(3):
            a = cached.generate(histories, params, seed=turn)
            b = fresh.generate(histories, params, seed=turn)
            _same(a, b)
            # the next turn: the reply plus an "observation"; one episode is done, one new one starts
            histories = [h + list(g[0].token_ids) + [rng.choice(vocab) for _ in range(rng.randrange(1, 9))]
                         for h, g in zip(histories, a, strict=True)][1:]
            histories.append([rng.choice(vocab) for _ in range(rng.randrange(3, 20))])
        assert pc.stats["hits"] >= 10 and pc.stats["reused_tokens"] > 0
    assert cached.prefix_cache is None  # the scope closed it


def test_a_weight_load_clears_the_cache(tiny) -> None:  # noqa: ANN001
    model, tok = tiny
    eng = _engine(model, tok)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    with eng.prefix_caching() as pc:
        eng.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))
        assert pc.entries
        eng.load_weights(None, 1)
        assert not pc.entries and pc.tokens == 0
