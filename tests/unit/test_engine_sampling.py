"""The engine's token sampler (inverse CDF) and its private bf16 copy of the policy."""

from __future__ import annotations

import pytest
import torch

from honing.engine import SamplingParams, TransformersEngine, engine_weights_dtype
from honing.engine.hf import bf16_supported, inverse_cdf_sample, sample_tokens
from honing.models import build_tiny_random


def test_inverse_cdf_frequencies_match_the_probabilities() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20_000, 1)
    gen = torch.Generator().manual_seed(0)
    tok = inverse_cdf_sample(probs, gen)
    freq = torch.bincount(tok, minlength=5).double() / len(tok)
    assert freq[1] == 0 and freq[4] == 0  # zero-probability tokens are never drawn
    # 20k draws: the standard error of each frequency is < 0.0036; allow 4 sigma.
    assert torch.allclose(freq, probs[0].double(), atol=0.015), freq
    again = inverse_cdf_sample(probs, torch.Generator().manual_seed(0))
    assert torch.equal(tok, again)  # a seeded generator reproduces the draws


def test_inverse_cdf_handles_unnormalised_rows_and_the_top_edge() -> None:
    probs = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 1e-30, 0.0]])
    for seed in range(20):
        tok = inverse_cdf_sample(probs, torch.Generator().manual_seed(seed))
        assert tok.tolist() == [0, 2, 1]


@pytest.mark.parametrize("top_k,top_p", [(2, 1.0), (0, 0.6)])
def test_sample_tokens_respects_top_k_and_top_p(top_k: int, top_p: float) -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).repeat(4000, 1)
    tok, lp = sample_tokens(logits, SamplingParams(1, 1.0, top_p, top_k, 1), torch.Generator().manual_seed(1))
    assert set(tok.tolist()) == {0, 1}  # top-2; top-p 0.6 keeps 0.4 + 0.3 (the one that crosses)
    assert torch.allclose(lp, torch.log(torch.tensor([0.4, 0.3]))[tok], atol=1e-6)  # unfiltered log-probs
    share = float((tok == 0).double().mean())
    assert abs(share - 0.4 / 0.7) < 0.04


def test_weights_dtype_choice() -> None:
    assert engine_weights_dtype("shared", True) is None
    assert engine_weights_dtype("bf16", False) is torch.bfloat16
    assert engine_weights_dtype("auto", False) is None
    assert engine_weights_dtype("auto", True) is (torch.bfloat16 if bf16_supported("cpu") else None)


def test_bf16_copy_generates_and_follows_the_trainer() -> None:
    model, tok = build_tiny_random(seed=0)
    eng = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, True, 64, torch.bfloat16)
    assert eng.model is not model and eng.model.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert not eng.autocast  # native bf16 weights, no per-call casts
    prompt = tok("hello there", add_special_tokens=False).input_ids
    out = eng.generate([prompt], SamplingParams(8, 1.0, 1.0, 0, 2), seed=0)
    assert len(out[0]) == 2 and all(s.token_ids for s in out[0])
    with torch.no_grad():  # the trainer updates its fp32 module...
        for p in model.parameters():
            p.add_(0.01)
    w = next(model.parameters())
    assert not torch.equal(next(eng.model.parameters()), w.to(torch.bfloat16))
    eng.load_weights(None, version=1)  # ...and the engine's copy follows
    assert eng.version == 1
    for a, b in zip(eng.model.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16))
    state = {k: v + 1 for k, v in model.state_dict().items()}  # a pushed state dict loads into the copy
    eng.load_weights(state, version=2)
    assert torch.equal(next(eng.model.parameters()), next(iter(state.values())).to(torch.bfloat16))
    same = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, False, 64, None)
    assert same.model is model  # 'shared': no copy
