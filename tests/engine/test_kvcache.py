"""The in-place KV cache (engine/kvcache.py) against transformers' DynamicCache as the naive
reference: the same sequence of appends, batch selections, repetitions and crops leaves the
same keys and values; an engine generating with it produces what one with DynamicCache does."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

import honing.engine.hf as hf
from honing.engine import SamplingParams, TransformersEngine
from honing.engine.kvcache import GrowingCache, GrowingLayer
from honing.models import build_tiny_random


def _same_caches(a: DynamicCache, b: DynamicCache) -> None:
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert la.get_seq_length() == lb.get_seq_length()
        if la.get_seq_length():
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_leave_what_dynamic_cache_leaves(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    reserve = rng.choice([1, 3, 16])
    ref, got = DynamicCache(), GrowingCache(reserve)
    rows, layers = rng.randint(1, 4), 2
    for _ in range(40):
        op = rng.random()
        if op < 0.6 or ref.get_seq_length() == 0:
            t = rng.choice([1, 1, 1, 5])
            for layer in range(layers):
                k, v = torch.randn(rows, 2, t, 4), torch.randn(rows, 2, t, 4)
                out_ref, out_got = ref.update(k, v, layer), got.update(k, v, layer)
                assert all(torch.equal(x, y) for x, y in zip(out_ref, out_got, strict=True))
        elif op < 0.75:
            idx = torch.tensor(sorted(rng.sample(range(rows), rng.randint(1, rows))))
            ref.batch_select_indices(idx)
            got.batch_select_indices(idx)
            rows = len(idx)
        elif op < 0.85 and rows < 6:
            rep = rng.randint(1, 3)
            ref.batch_repeat_interleave(rep)
            got.batch_repeat_interleave(rep)
            rows *= rep
        else:
            n = -rng.randint(0, ref.get_seq_length())
            ref.crop(n)
            got.crop(n)
        _same_caches(ref, got)


def test_decode_steps_write_in_place_and_outgrow_by_one_copy() -> None:
    layer = GrowingLayer(reserve=4)
    layer.update(torch.randn(2, 1, 3, 2), torch.randn(2, 1, 3, 2))
    buf = layer._k
    for _ in range(4):  # within the reserve: same buffer, no copy
        layer.update(torch.randn(2, 1, 1, 2), torch.randn(2, 1, 1, 2))
        assert layer._k is buf and layer.keys.data_ptr() == buf.data_ptr()
    layer.update(torch.randn(2, 1, 1, 2), torch.randn(2, 1, 1, 2))  # one past it: a larger buffer
    assert layer._k is not buf and layer._k.shape[-2] == 8 + 4 and layer.get_seq_length() == 8


def test_keys_replaced_from_outside_are_taken_as_the_content() -> None:
    layer = GrowingLayer(reserve=2)
    layer.update(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2))
    k, v = torch.randn(3, 1, 5, 2), torch.randn(3, 1, 5, 2)
    layer.keys, layer.values = k, v
    nk, nv = torch.randn(3, 1, 1, 2), torch.randn(3, 1, 1, 2)
    out_k, out_v = layer.update(nk, nv)
    assert torch.equal(out_k, torch.cat([k, nk], -2)) and torch.equal(out_v, torch.cat([v, nv], -2))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_generates_what_it_generated_with_dynamic_cache(monkeypatch, temperature: float) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    model, tok = build_tiny_random(seed=0)
    eng = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, False, 16)
    rng = random.Random(1)
    prompts = [[rng.randrange(5, model.config.vocab_size) for _ in range(rng.randint(3, 30))] for _ in range(5)]
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=24)
    got = eng.generate(prompts, params, seed=7)
    monkeypatch.setattr(hf, "GrowingCache", lambda reserve: DynamicCache())
    ref = eng.generate(prompts, params, seed=7)
    for ga, gb in zip(got, ref, strict=True):
        for sa, sb in zip(ga, gb, strict=True):
            assert sa.token_ids == sb.token_ids
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-5)
