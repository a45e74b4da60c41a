"""PPO-style reuse, off-policy correction, KL variants, exact resume and start-up errors."""

from __future__ import annotations

import io
import math

import pytest
import torch
from pydantic import ValidationError

from honing.config import LoraConfig, TrainConfig, load_config
from honing.errors import ConfigError
from honing.models import build_tiny_random
from honing.train import check_train_config
from honing.train.trainer import apply_lora

from .helpers import copy_trajs, first_step_grads, make_trainer, params, sampled_trajectories


@pytest.fixture(scope="module")
def trajs(tiny):  # noqa: ANN001
    return sampled_trajectories(*tiny)


def test_epochs_and_mini_batches_reuse_the_batch(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    trainer = make_trainer(build_tiny_random(seed=0)[0], tok, ppo_epochs=2, mini_batches=2, learning_rate=3e-2,
                           clip_eps_low=0.01, clip_eps_high=0.01)
    m = trainer.step(trajs)
    assert m["optimizer_steps"] == 4 and trainer.opt_steps == 4 and trainer.step_count == 1
    # Old log-probs were the trainer's own before the update (== the engine's for these weights) ...
    assert m["logprob_mismatch"] < 2e-6
    # ... and later mini-batches saw moved weights: ratios left the tight clip range.
    assert m["clip_frac"] > 0.05
    one = make_trainer(build_tiny_random(seed=0)[0], tok, learning_rate=3e-2, clip_eps_low=0.01, clip_eps_high=0.01)
    m1 = one.step(trajs)
    assert m1["optimizer_steps"] == 1 and m1["clip_frac"] == 0.0  # one pass at ratio 1 clips nothing


def _trainer_pair(tok, **kw):  # noqa: ANN001, ANN003
    return (make_trainer(build_tiny_random(seed=0)[0], tok, recompute_old_logprobs=True, **kw),
            make_trainer(build_tiny_random(seed=0)[0], tok, recompute_old_logprobs=True))


def test_truncated_importance_sampling_weights_tokens(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    # The engine's numbers for sequence 0 are 0.5 nats lower than the trainer's: ratio e^0.5 = 1.65 > cap.
    shifted = copy_trajs(trajs)
    shifted[0].logprobs = tuple(x - 0.5 for x in shifted[0].logprobs)
    tis, plain = _trainer_pair(tok, tis_cap=1.2)
    m = tis.step(shifted)
    plain.step(shifted)
    n0 = len(trajs[0].completion_ids)
    assert m["tis_clip_frac"] == pytest.approx(n0 / m["tokens"])
    assert m["logprob_mismatch"] == pytest.approx(0.5 * n0 / m["tokens"], rel=1e-3)
    assert m["mismatch_max_ratio"] == pytest.approx(math.exp(0.5), rel=1e-3)
    # TIS alone makes the trainer compute its own old log-probs (else the weight would be exp(0) = 1).
    implicit = make_trainer(build_tiny_random(seed=0)[0], tok, tis_cap=1.2).step(shifted)
    assert implicit["tis_clip_frac"] == m["tis_clip_frac"] and implicit["loss"] == pytest.approx(m["loss"], rel=1e-6)
    # Weighting sequence 0's tokens by 1.2 equals scaling its advantage by 1.2 (ratio 1 at step 1).
    scaled = copy_trajs(trajs)
    scaled[0].advantage *= 1.2
    ref = make_trainer(build_tiny_random(seed=0)[0], tok, recompute_old_logprobs=True)
    ref.step(scaled)
    g_tis, g_ref, g_plain = first_step_grads(tis), first_step_grads(ref), first_step_grads(plain)
    for k in g_ref:
        assert torch.allclose(g_tis[k], g_ref[k], rtol=1e-4, atol=1e-7), k
    assert any(not torch.allclose(g_tis[k], g_plain[k], rtol=1e-3, atol=1e-6) for k in g_ref)


def test_sequence_mask_drops_extreme_sequences(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    shifted = copy_trajs(trajs)
    shifted[2].logprobs = tuple(x + 0.7 for x in shifted[2].logprobs)  # ratio e^-0.7 = 0.5 < 0.6
    masked, _ = _trainer_pair(tok, seq_mask_low=0.6, seq_mask_high=1.5)
    m = masked.step(shifted)
    assert m["seq_masked_frac"] == pytest.approx(1 / 8)
    # Same gradient as giving that sequence no advantage (it still counts in the denominator).
    zeroed = copy_trajs(trajs)
    zeroed[2].advantage = 0.0
    ref = make_trainer(build_tiny_random(seed=0)[0], tok, recompute_old_logprobs=True)
    ref.step(zeroed)
    g_m, g_r = first_step_grads(masked), first_step_grads(ref)
    for k in g_r:
        assert torch.allclose(g_m[k], g_r[k], rtol=1e-4, atol=1e-7), k


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_loss_term_estimators(tiny, trajs, estimator: str) -> None:  # noqa: ANN001
    _, tok = tiny
    trainer = make_trainer(build_tiny_random(seed=0)[0], tok, kl_coef=0.1, kl_estimator=estimator)
    assert trainer.ref is not None
    m1 = trainer.step(trajs)
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    m2 = trainer.step(trajs)
    assert math.isfinite(m2["kl"]) and m2["kl"] != 0.0
    if estimator != "k1":
        assert m2["kl"] > 0


def test_kl_in_reward_changes_advantages_not_the_loss(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    own = copy_trajs(trajs)
    # The KL is of the old policy (here recomputed by the trainer; else the engine's numbers) to the reference.
    trainer = make_trainer(build_tiny_random(seed=0)[0], tok, kl_coef=0.5, kl_in_reward=True,
                           advantage_estimator="rloo", recompute_old_logprobs=True)
    m1 = trainer.step(own)
    assert m1["kl_in_reward"] == pytest.approx(0.0, abs=1e-6) and m1["kl"] == 0.0
    from honing.train import rloo_advantages

    plain = rloo_advantages(torch.tensor([t.reward for t in trajs]), 4)
    assert torch.allclose(torch.tensor([t.advantage for t in own]), plain, atol=1e-5)
    m2 = trainer.step(own)
    assert m2["kl_in_reward"] > 0 and m2["kl"] == 0.0  # folded into the reward, no loss term
    assert not torch.allclose(torch.tensor([t.advantage for t in own]), plain, atol=1e-4)


def test_no_reference_model_when_kl_coef_is_zero(tiny) -> None:  # noqa: ANN001
    _, tok = tiny
    assert make_trainer(build_tiny_random(seed=0)[0], tok, kl_coef=0.0).ref is None
    lora = make_trainer(build_tiny_random(seed=0)[0], tok, kl_coef=0.1, lora=LoraConfig(enabled=True, r=2))
    assert lora.ref is None  # the reference is the base with adapters off


def test_peak_memory_reported(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    m = make_trainer(build_tiny_random(seed=0)[0], tok).step(trajs)
    assert m["peak_rss_mb"] > 50


def _roundtrip(obj):  # noqa: ANN001, ANN202
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_exact_resume_bitwise(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    kw = {"ppo_epochs": 2, "mini_batches": 2, "warmup_steps": 3, "learning_rate": 1e-2}
    batches = [copy_trajs(trajs), copy_trajs(trajs, advantage=0.3), copy_trajs(trajs), copy_trajs(trajs)]
    batches[1][0].advantage = -1.0
    straight = make_trainer(build_tiny_random(seed=0)[0], tok, **kw)
    for b in batches:
        straight.step(b)
    first = make_trainer(build_tiny_random(seed=0)[0], tok, **kw)
    for b in batches[:2]:
        first.step(b)
    saved_state, saved_weights = _roundtrip(first.state()), _roundtrip(first.model.state_dict())
    torch.manual_seed(1234)  # the process's RNG moved on: load_state must restore it
    model, _ = build_tiny_random(seed=5)
    model.load_state_dict(saved_weights)
    resumed = make_trainer(model, tok, **kw)
    resumed.load_state(saved_state)
    assert resumed.step_count == 2 and resumed.opt_steps == 8
    for b in batches[2:]:
        resumed.step(b)
    want, got = params(straight.model), params(resumed.model)
    assert all(torch.equal(want[k], got[k]) for k in want)
    # Without the optimizer/scheduler/RNG state the same weights do not continue the same way.
    fresh_model, _ = build_tiny_random(seed=5)
    fresh_model.load_state_dict(saved_weights)
    fresh = make_trainer(fresh_model, tok, **kw)
    for b in batches[2:]:
        fresh.step(b)
    assert not all(torch.equal(want[k], v) for k, v in params(fresh.model).items())


# --- start-up errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("override,match", [
    ("train.clip_eps_high=0.1", "clip_eps_high=0.1 < train.clip_eps_low=0.2: clip range inverted"),
    ("train.clip_eps_low=1.0", "clip_eps_low=1.0 must be < 1"),
    ("train.gspo_clip_high=1e-4", "gspo_clip_high=0.0001 < train.gspo_clip_low"),
    ("train.kl_in_reward=true", "kl_in_reward needs train.kl_coef > 0"),
    ("train.seq_mask_high=0.9", "seq_mask_high"),
    ("train.advantage_estimator=ppo", "advantage_estimator"),
])
def test_bad_train_config_fails_at_load(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config("smoke", [override])


def test_group_estimator_needs_several_samples_per_prompt() -> None:
    for est in ("grpo", "dr_grpo", "rloo"):
        with pytest.raises(ConfigError, match="samples_per_prompt=1"):
            check_train_config(TrainConfig(advantage_estimator=est), samples_per_prompt=1)
        check_train_config(TrainConfig(advantage_estimator=est), samples_per_prompt=2)
    check_train_config(TrainConfig(advantage_estimator="reinforce_pp"), samples_per_prompt=1)


def test_missing_lora_target_lists_existing_modules() -> None:
    model, _ = build_tiny_random(seed=0)
    with pytest.raises(ConfigError, match=r"\['c_attn'\] do not exist.*linear modules are: \[.*'q_proj'"):
        apply_lora(model, LoraConfig(enabled=True, target_modules=["q_proj", "c_attn"]))
    with pytest.raises(ValidationError):
        TrainConfig(clip_eps_low=0.3, clip_eps_high=0.2)
