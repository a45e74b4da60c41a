"""Speculative decoding with an n-gram draft (engine/speculative.py, the `ngram-spec` fast variant):
the draft lookup against a naive reference, the acceptance rule's output distribution, and the
engine's speculative path against its plain decode loop on the tiny model (same greedy tokens and
log-probs, drafts actually accepted, EOS and length limits kept)."""

from __future__ import annotations

import random

import pytest
import torch

from honing.engine import SamplingParams, TransformersEngine
from honing.engine.speculative import NgramDraft, ngram_draft, verify_draft
from honing.errors import HoningError
from honing.models import build_tiny_random


def naive_draft(seq: list[int], cfg: NgramDraft) -> list[int]:
    for n in range(cfg.max_ngram, cfg.min_ngram - 1, -1):
        if n > len(seq) - 1:
            continue
        tail = seq[-n:]
        hits = [s for s in range(len(seq) - n) if seq[s:s + n] == tail and s + n < len(seq)]
        if hits:  # the longest continuation, the latest among equals
            s = max(hits, key=lambda s: (len(seq[s + n:s + n + cfg.num_tokens]), s))
            return seq[s + n:s + n + cfg.num_tokens]
    return []


def test_ngram_draft_matches_a_naive_reference() -> None:
    rng = random.Random(0)
    for trial in range(400):
        seq = [rng.randrange(5) for _ in range(rng.randrange(0, 40))]
        cfg = NgramDraft(num_tokens=rng.randrange(1, 6), max_ngram=rng.randrange(1, 4), min_ngram=1)
        assert ngram_draft(seq, cfg) == naive_draft(seq, cfg), (seq, cfg)
    # the longest n-gram wins, and its latest occurrence
    assert ngram_draft([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], NgramDraft(2, 3, 1)) == [9, 2]
    assert ngram_draft([4, 4, 4, 4, 4], NgramDraft(3, 2, 1)) == [4, 4, 4]  # not the latest match's single 4
    assert ngram_draft([5, 6, 7], NgramDraft(4, 3, 2)) == []
    with pytest.raises(ValueError):
        NgramDraft(num_tokens=0)


def test_greedy_verification_keeps_the_argmax_prefix() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    kept, lps, rest = verify_draft(logits, [1, 0, 1], SamplingParams(temperature=0.0), None)
    assert kept == [1, 0]  # the third draft token (1) is not row 2's argmax (2)
    assert lps == pytest.approx([float(torch.log_softmax(logits[0], -1)[1]), float(torch.log_softmax(logits[1], -1)[0])])
    assert rest is not None and int(rest.argmax()) == 2
    kept, _, rest = verify_draft(logits, [1, 0, 2], SamplingParams(temperature=0.0), None)
    assert kept == [1, 0, 2] and rest is None


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (2, 1.0), (0, 0.7)])
def test_sampled_verification_emits_tokens_distributed_as_the_target(top_k: int, top_p: float) -> None:
    """One draft token d: keep it with p(d), else draw from p without d. The emitted token must be
    distributed as p (the filtered, tempered distribution plain decoding samples from), whichever d."""
    logits = torch.log(torch.tensor([[0.45, 0.25, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    from honing.engine.speculative import filtered_logprobs

    target = filtered_logprobs(logits[:1], params)[1][0].exp().double()
    for d in (0, 3, 1):
        gen = torch.Generator().manual_seed(d)
        counts = torch.zeros(4, dtype=torch.float64)
        n = 20_000
        for _ in range(n):
            kept, lps, rest = verify_draft(logits, [d], params, gen)
            if kept:
                counts[kept[0]] += 1
                assert lps[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[d]))
            else:
                assert rest is not None and rest[0, d] == float("-inf")
                counts[int(torch.multinomial(rest.exp(), 1, generator=gen))] += 1
        freq = counts / n
        # 20k draws: each frequency's standard error is < 0.0036; allow 4 sigma
        assert torch.allclose(freq, target, atol=0.015), (d, freq, target)


def _engine(spec: NgramDraft | None) -> tuple[TransformersEngine, object]:
    model, tok = build_tiny_random(seed=0)
    eng = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, speculative=spec)
    return eng, tok


@pytest.mark.parametrize("drafts", ["lookup", "noisy"])
def test_speculative_greedy_equals_plain_greedy_on_the_tiny_model(drafts: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """'noisy': every other draft token is replaced by a random one, so drafts are rejected mid-way
    and the cache is cropped; the tokens must still be plain greedy's."""
    if drafts == "noisy":
        import honing.engine.speculative as sp

        real, rng = sp.ngram_draft, random.Random(1)

        def noisy(seq: list[int], cfg: NgramDraft) -> list[int]:
            d = real(seq, cfg) or [rng.randrange(100) for _ in range(3)]
            return [t if i % 2 == 0 else rng.randrange(100) for i, t in enumerate(d)]

        monkeypatch.setattr(sp, "ngram_draft", noisy)
    plain, _ = _engine(None)
    spec, _ = _engine(NgramDraft(num_tokens=6))
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13] * 5, list(range(20, 60)), [3]]
    params = SamplingParams(max_new_tokens=40, temperature=0.0)
    for p in prompts:
        [[a]] = plain.generate([p], params, seed=0)
        [[b]] = spec.generate([p], params, seed=0)
        assert b.token_ids == a.token_ids
        assert b.finish_reason == a.finish_reason
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4)
    st = spec.spec_stats
    # the path under test was taken, and drafts were accepted (a wrong cache crop would diverge above)
    assert st["forwards"] > 0 and st["accepted"] > 0, st
    if drafts == "noisy":
        assert st["accepted"] < st["drafted"]  # rejections and crops happened


def test_speculative_sampling_keeps_limits_and_reports_log_probs() -> None:
    spec, tok = _engine(NgramDraft(num_tokens=4))
    spec.speculative_max_rows = 8  # every row speculative, as a fast variant's evaluation does
    params = SamplingParams(max_new_tokens=17, temperature=1.0, n=2)
    out = spec.generate([[5, 6, 7, 5, 6, 7], [9, 9, 9, 9]], params, seed=3)
    assert [len(g) for g in out] == [2, 2]
    for g in out:
        for s in g:
            assert 1 <= len(s.token_ids) <= 17 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0 for lp in s.logprobs)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == tok.eos_token_id
                assert tok.eos_token_id not in s.token_ids[:-1]
            else:
                assert len(s.token_ids) == 17
    again = spec.generate([[5, 6, 7, 5, 6, 7], [9, 9, 9, 9]], params, seed=3)
    assert [[s.token_ids for s in g] for g in again] == [[s.token_ids for s in g] for g in out]  # seeded
    batched_before = spec.spec_stats["forwards"]
    spec.speculative_max_rows = 1
    spec.generate([[1, 2, 3], [4, 5, 6]], SamplingParams(max_new_tokens=5), seed=0)
    assert spec.spec_stats["forwards"] == batched_before  # a batch decodes batched, not speculatively


def test_fast_variant_methods_parse_and_configure_the_engine() -> None:
    from honing.release.fast import configure_engine, options, split_method

    assert split_method("int8-dynamic+ngram-spec") == ("int8-dynamic", "ngram-spec")
    assert split_method("ngram-spec") == (None, "ngram-spec")
    assert split_method("standard") == (None, None)
    assert "ngram-spec" in options()
    for bad in ("int4", "ngram-spec+ngram-spec", "int8-dynamic+bf16"):
        with pytest.raises(HoningError, match="unknown fast-variant method"):
            split_method(bad)
    eng, _ = _engine(None)
    configure_engine(eng, "int8-dynamic+ngram-spec")
    assert isinstance(eng.speculative, NgramDraft) and eng.speculative_max_rows == 1
    configure_engine(eng, "int8-dynamic")
    assert eng.speculative is None and eng.prefill_model is None
    assert split_method("int8-decode+ngram-spec") == ("int8-decode", "ngram-spec")
    with pytest.raises(HoningError, match="needs the standard weights"):
        configure_engine(eng, "int8-decode")
    configure_engine(eng, "int8-decode+ngram-spec", standard=eng.model)
    assert eng.prefill_model is eng.model and isinstance(eng.speculative, NgramDraft)
    configure_engine(eng, "ngram-spec")  # reconfigured: the prompt runs the decode weights again
    assert eng.prefill_model is None


@pytest.mark.parametrize("spec", [False, True])
def test_int8_decode_runs_the_prompt_with_the_standard_weights(spec: bool) -> None:
    """int8-decode: the prompt's forward (and so the KV cache and the first token) is the standard
    fp32 model's, bit for bit; the decode steps are the int8 copy's. int8-dynamic quantizes the
    prompt's forward too, so its first token's log-prob is not the standard one."""
    from honing.release.fast import apply_method, engine_for

    model, tok = build_tiny_random(seed=0)
    model.eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12], [3, 1, 4, 1, 5, 9, 2, 6]]
    method = "int8-decode+ngram-spec" if spec else "int8-decode"
    std = engine_for(model, tok, "ngram-spec" if spec else "standard")
    dec = engine_for(apply_method(model, "int8-decode"), tok, method, standard=model)
    dyn = engine_for(apply_method(model, "int8-dynamic"), tok, "int8-dynamic")
    one = SamplingParams(max_new_tokens=1, temperature=0.0)
    for p in prompts:
        [[s_std]], [[s_dec]], [[s_dyn]] = (e.generate([p], one) for e in (std, dec, dyn))
        assert s_dec.token_ids == s_std.token_ids and s_dec.logprobs == s_std.logprobs
        assert s_dyn.logprobs != s_std.logprobs
    many = SamplingParams(max_new_tokens=12, temperature=0.0)
    out_std, out_dec = std.generate(prompts, many), dec.generate(prompts, many)
    lp_std = [lp for g in out_std for s in g for lp in s.logprobs[1:]]
    lp_dec = [lp for g in out_dec for s in g for lp in s.logprobs[1:]]
    assert lp_dec and lp_std != lp_dec  # the steps after the first ran the int8 weights
    assert dec.model is not model and any("quantized" in type(m).__module__ for m in dec.model.modules())
