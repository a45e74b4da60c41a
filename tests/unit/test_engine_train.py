"""The transformers engine and the policy trainer on the tiny random model (fp32, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from honing.config import LoraConfig, TrainConfig
from honing.engine import SamplingParams, TransformersEngine
from honing.models import build_tiny_random
from honing.rollout.types import Trajectory
from honing.train.logprobs import completion_logprobs
from honing.train.trainer import PolicyTrainer

QUESTIONS = ["hi", "What is 12 + 30? Answer with a number.", "Calculate 7 + 8."]


def _prompts(tok) -> list[list[int]]:  # noqa: ANN001
    out = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        out.append(tok(ids, add_special_tokens=False).input_ids)
    return out


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The model is tiny: intra-op threads only add synchronisation (100x slower on a busy 2-core box)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny(_one_thread):  # noqa: ANN001
    model, tok = build_tiny_random(seed=0)
    return model, tok, _prompts(tok)


def _engine(model, tok) -> TransformersEngine:  # noqa: ANN001
    return TransformersEngine(model, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


# --- engine --------------------------------------------------------------------------------------


def test_generate_shapes_determinism_and_finish_reason(tiny) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    assert len({len(p) for p in prompts}) == 3  # three different prompt lengths
    eng = _engine(model, tok)
    params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0)
    out = eng.generate(prompts, params, seed=123)
    assert len(out) == 3 and all(len(g) == 4 for g in out)
    for group in out:
        for s in group:
            assert 1 <= len(s.token_ids) <= 8 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0.0 and math.isfinite(lp) for lp in s.logprobs)
            assert (s.finish_reason == "stop") == (s.token_ids[-1] == tok.eos_token_id)
            assert tok.eos_token_id not in s.token_ids[:-1]  # nothing after the end of turn
            if s.finish_reason == "length":
                assert len(s.token_ids) == 8
    again = eng.generate(prompts, params, seed=123)
    assert again == out  # same seed, same samples (ids, log-probs, finish reasons)
    other = eng.generate(prompts, params, seed=124)
    assert [[s.token_ids for s in g] for g in other] != [[s.token_ids for s in g] for g in out]
    # Random weights at T=1 over ~100 tokens: a group of 4 is not all one sample.
    assert any(len({s.token_ids for s in g}) > 1 for g in out)


def test_generate_stop_reason_with_eos_forced(tiny) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    # Treat every token as end-of-turn: each sample stops after exactly one token.
    eng = TransformersEngine(model, eos_ids=list(range(len(tok))), pad_id=tok.pad_token_id)
    out = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=5), seed=0)
    assert all(len(s.token_ids) == 1 and s.finish_reason == "stop" for g in out for s in g)


def test_greedy_group_is_identical(tiny) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    eng = _engine(model, tok)
    out = eng.generate(prompts, SamplingParams(n=4, max_new_tokens=8, temperature=0.0), seed=None)
    for group in out:
        assert len({s.token_ids for s in group}) == 1
        assert len({s.logprobs for s in group}) == 1
    # Greedy really is the argmax, and batched greedy equals one prompt alone.
    alone = eng.generate([prompts[1]], SamplingParams(n=1, max_new_tokens=8, temperature=0.0))
    assert alone[0][0].token_ids == out[1][0].token_ids
    ids = torch.tensor([prompts[1]])
    with torch.no_grad():
        first = model(input_ids=ids).logits[0, -1].argmax().item()
    assert out[1][0].token_ids[0] == first


def test_generate_chunks_by_max_batch_size(tiny) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    params = SamplingParams(n=4, max_new_tokens=6, temperature=0.0)
    big = _engine(model, tok).generate(prompts, params)
    small = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, max_batch_size=4).generate(prompts, params)
    assert [[s.token_ids for s in g] for g in small] == [[s.token_ids for s in g] for g in big]


def test_generate_chunks_by_kv_token_budget(tiny) -> None:  # noqa: ANN001
    """A token budget cuts a call into smaller decode batches: same greedy samples, and no batch
    holds more KV tokens than the budget (beyond a single prompt that alone exceeds it)."""
    model, tok, prompts = tiny
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0.0)
    big = _engine(model, tok).generate(prompts, params)
    eng = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, max_batch_tokens=2 * (len(prompts[1]) + 6))
    rows: list[int] = []
    real = eng._generate_chunk
    eng._generate_chunk = lambda ps, pa, g: rows.append(len(ps)) or real(ps, pa, g)  # type: ignore[method-assign]
    small = eng.generate(prompts, params)
    assert [[s.token_ids for s in g] for g in small] == [[s.token_ids for s in g] for g in big]
    assert len(rows) > 1 and sum(rows) == len(prompts)
    assert _engine(model, tok).max_batch_tokens > 10_000  # automatic: a share of this machine's memory


def test_kv_bytes_per_token_is_what_the_cache_holds(tiny) -> None:  # noqa: ANN001
    from transformers import DynamicCache

    from honing.engine.budget import kv_bytes_per_token

    model, tok, prompts = tiny
    cache = DynamicCache()
    ids = torch.tensor([prompts[1]])
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, past_key_values=cache)
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == kv_bytes_per_token(model.config, 4) * ids.shape[1]


def _naive_chunks(lens: list[int], n: int, new: int, rows: int, budget: int | None) -> list[list[int]]:
    out: list[list[int]] = []
    for i, ln in enumerate(lens):
        cur = out[-1] if out else None
        cost = (ln + new) * n
        fits = cur is not None and len(cur) < max(1, rows // n) and (
            budget is None or sum((lens[j] + new) * n for j in cur) + cost <= budget)
        if fits:
            cur.append(i)
        else:
            out.append([i])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_plan_chunks_matches_a_naive_greedy_packing(seed: int) -> None:
    import random

    from honing.engine.budget import plan_chunks

    rng = random.Random(seed)
    lens = [rng.randint(1, 300) for _ in range(rng.randint(0, 40))]
    n, new, rows = rng.choice([1, 2, 4, 8]), rng.randint(1, 64), rng.choice([1, 8, 64, 512])
    budget = rng.choice([None, 1, 500, 4000, 50_000])
    got = [list(r) for r in plan_chunks(lens, n, new, rows, budget)]
    assert got == _naive_chunks(lens, n, new, rows, budget)
    assert [i for r in got for i in r] == list(range(len(lens)))  # every prompt once, in order


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_engine_logprobs_equal_trainer_logprobs(tiny, temperature: float) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    eng = _engine(model, tok)
    out = eng.generate(prompts, SamplingParams(n=3, max_new_tokens=8, temperature=temperature), seed=7)
    flat_p = [p for p, g in zip(prompts, out) for _ in g]
    flat_s = [s for g in out for s in g]
    with torch.no_grad():
        logp, mask = completion_logprobs(model, flat_p, [s.token_ids for s in flat_s], tok.pad_token_id,
                                         temperature)
    assert logp.shape == mask.shape == (9, max(len(s.token_ids) for s in flat_s))
    for i, s in enumerate(flat_s):
        n = len(s.token_ids)
        assert mask[i, :n].sum() == n and mask[i, n:].sum() == 0
        assert torch.allclose(logp[i, :n], torch.tensor(s.logprobs), atol=1e-4), (i, logp[i, :n], s.logprobs)


def test_completion_logprobs_left_padding_invariance(tiny) -> None:  # noqa: ANN001
    model, tok, prompts = tiny
    comps = [tok.encode(t, add_special_tokens=False) for t in ("42", "The answer is 5", "15")]
    comps[0] = comps[0] + [tok.eos_token_id]
    with torch.no_grad():
        batch, bmask = completion_logprobs(model, prompts, comps, tok.pad_token_id)
        for i in range(3):
            alone, amask = completion_logprobs(model, [prompts[i]], [comps[i]], tok.pad_token_id)
            n = len(comps[i])
            assert alone.shape[1] == n and amask.sum() == n
            assert torch.allclose(alone[0], batch[i, :n], atol=1e-4)
            assert bmask[i].sum() == n
    # Temperature changes the numbers (so the comparison above is not vacuous).
    with torch.no_grad():
        hot, _ = completion_logprobs(model, prompts[:1], comps[:1], tok.pad_token_id, temperature=0.5)
    assert not torch.allclose(hot[0], batch[0, :len(comps[0])], atol=1e-3)


# --- trainer -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trajectories(tiny) -> list[Trajectory]:  # noqa: ANN001
    """8 trajectories (2 groups of 4) with the engine's log-probs, uneven lengths and advantages."""
    model, tok, prompts = tiny
    out = _engine(model, tok).generate(prompts[1:], SamplingParams(n=4, max_new_tokens=8, temperature=1.0), seed=3)
    advs = [1.0, -0.5, 0.75, -1.25, -0.3, 0.9, 0.4, 1.1]
    lengths = [8, 3, 6, 1, 8, 5, 2, 7]  # prefixes of samples keep their exact sampling log-probs
    trajs = []
    for g, (p, group) in enumerate(zip(prompts[1:], out)):
        for s in group:
            i = len(trajs)
            ids, lps = s.token_ids[:lengths[i]], s.logprobs[:lengths[i]]
            trajs.append(Trajectory(task_id=f"t{g}", domain="test", prompt_ids=tuple(p), completion_ids=ids,
                                    logprobs=lps, completion_text=tok.decode(ids), finish_reason="length",
                                    policy_version=0, group=g, advantage=advs[i]))
    assert [len(t.completion_ids) for t in trajs] == lengths
    return trajs


def _trainer(model, tok, **train_kw) -> PolicyTrainer:  # noqa: ANN001
    lora = train_kw.pop("lora", LoraConfig())
    cfg = TrainConfig(**{"micro_batch_size": 8, "learning_rate": 1e-3, "max_grad_norm": 1e9, **train_kw})
    return PolicyTrainer(model, tok.pad_token_id, cfg, lora, bf16_autocast=False, temperature=1.0)


def _params(model) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_gradient_accumulation_invariance(tiny, trajectories) -> None:  # noqa: ANN001
    _, tok, _ = tiny
    m_small, _ = build_tiny_random(seed=0)
    m_big, _ = build_tiny_random(seed=0)
    init = _params(m_big)
    small = _trainer(m_small, tok, micro_batch_size=2)
    big = _trainer(m_big, tok, micro_batch_size=8)
    ms = small.step(trajectories)
    mb = big.step(trajectories)
    assert ms["tokens"] == mb["tokens"] == sum(len(t.completion_ids) for t in trajectories)
    assert ms["active_seqs"] == mb["active_seqs"] == 8
    # Step 1 has ratio 1, so the loss is the token-weighted mean of -advantage.
    want_loss = -sum(t.advantage * len(t.completion_ids) for t in trajectories) / mb["tokens"]
    assert mb["loss"] == pytest.approx(want_loss, rel=1e-5) and abs(want_loss) > 0.05
    assert ms["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    assert ms["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4) and mb["grad_norm"] > 0
    # The engine's log-probs come from the same weights: before the update they match.
    assert mb["logprob_mismatch"] < 1e-4 and mb["mismatch_max_ratio"] < 1 + 1e-4
    ps, pb = _params(small.model), _params(big.model)
    assert ps.keys() == pb.keys() == init.keys()
    # The accumulated gradients are equal: after AdamW's first step exp_avg = (1 - beta1) * grad.
    grads_s = {n: small.opt.state[p]["exp_avg"] / 0.1 for n, p in small.model.named_parameters()}
    grads_b = {n: big.opt.state[p]["exp_avg"] / 0.1 for n, p in big.model.named_parameters()}
    for k in grads_b:
        assert torch.allclose(grads_s[k], grads_b[k], rtol=1e-4, atol=1e-6), k
    # All weights agree within 1e-5 wherever the gradient is not down at Adam's eps (1e-8): there the
    # first step lr * g / (|g| + eps) amplifies float rounding of g (~1e-9), so allow lr / 10.
    for k in ps:
        diff = (ps[k] - pb[k]).abs()
        assert float(diff.max()) < 1e-4, k
        insensitive = grads_b[k].abs() > 1e-6
        assert float((diff * insensitive).max()) < 1e-5, k
    assert sum(int((grads_b[k].abs() > 1e-6).sum()) for k in grads_b) > 0.9 * sum(v.numel() for v in grads_b.values())
    changed = max(float((pb[k] - init[k]).abs().max()) for k in pb)
    assert changed > 1e-4  # the step really moved the weights (AdamW first step ~ lr)


def test_zero_advantage_batch_does_not_update(tiny, trajectories) -> None:  # noqa: ANN001
    _, tok, _ = tiny
    model, _ = build_tiny_random(seed=0)
    init = _params(model)
    trainer = _trainer(model, tok)
    zero = [Trajectory(**{**t.__dict__, "advantage": 0.0}) for t in trajectories]
    m = trainer.step(zero)
    assert m["active_seqs"] == 0 and m["grad_norm"] == 0.0
    assert all(torch.equal(v, init[k]) for k, v in _params(model).items())


def test_lora_starts_at_base_policy_and_trains_only_adapters(tiny, trajectories) -> None:  # noqa: ANN001
    base, tok, _ = tiny
    model, _ = build_tiny_random(seed=0)
    trainer = _trainer(model, tok, lora=LoraConfig(enabled=True, r=4, alpha=8))
    assert trainer.lora and trainer.ref is None  # the reference is the base with adapters off
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    prompts = [t.prompt_ids for t in trajectories]
    comps = [t.completion_ids for t in trajectories]
    with torch.no_grad():
        want, _ = completion_logprobs(base, prompts, comps, tok.pad_token_id)
        got, _ = completion_logprobs(trainer.model, prompts, comps, tok.pad_token_id)
    assert torch.allclose(got, want, atol=1e-5)
    before = _params(trainer.model)
    trainer.step(trajectories)
    after = _params(trainer.model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    assert any("lora_B" in k for k in changed)
    with torch.no_grad():
        moved, _ = completion_logprobs(trainer.model, prompts, comps, tok.pad_token_id)
        with trainer.model.disable_adapter():
            ref, _ = completion_logprobs(trainer.model, prompts, comps, tok.pad_token_id)
    assert not torch.allclose(moved, want, atol=1e-5)
    assert torch.allclose(ref, want, atol=1e-5)
    merged = trainer.export_model()
    with torch.no_grad():
        exported, _ = completion_logprobs(merged, prompts, comps, tok.pad_token_id)
    assert torch.allclose(exported, moved, atol=1e-4)


def test_no_reference_model_without_kl(tiny, trajectories) -> None:  # noqa: ANN001
    _, tok, _ = tiny
    model, _ = build_tiny_random(seed=0)
    trainer = _trainer(model, tok, kl_coef=0.0)
    assert trainer.ref is None
    m = trainer.step(trajectories)
    assert m["kl"] == 0.0


def test_reference_model_with_kl(tiny, trajectories) -> None:  # noqa: ANN001
    _, tok, _ = tiny
    model, _ = build_tiny_random(seed=0)
    trainer = _trainer(model, tok, kl_coef=0.1)
    assert trainer.ref is not None and trainer.ref is not trainer.model
    assert not any(p.requires_grad for p in trainer.ref.parameters())
    ref_init = _params(trainer.ref)
    m1 = trainer.step(trajectories)
    assert math.isfinite(m1["kl"]) and m1["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    m2 = trainer.step(trajectories)
    assert math.isfinite(m2["kl"]) and m2["kl"] > 0  # the policy moved away from the frozen reference
    assert all(torch.equal(v, ref_init[k]) for k, v in _params(trainer.ref).items())
