"""Layered reward (pure composition) and concurrent batch grading (bounds, timeouts, bad input)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from honing.config import load_config
from honing.errors import ConfigError
from honing.rollout.types import Trajectory
from honing.tasks.types import Task, VerifierSpec
from honing.verify import Verdict, VerifyContext, register_verifier
from honing.verify.batch import BatchOptions, grade_batch
from honing.verify.reward import (LayerConfig, PenaltyConfig, RewardConfig, compose, overlong_penalty)


def task(verifier: str = "exact", answer: str = "42", domain: str = "arith", **params) -> Task:
    return Task(id=f"t-{verifier}", domain=domain, prompt=({"role": "user", "content": "q"},),
                verifier=VerifierSpec(verifier, params), hidden={"answer": answer})


def verdict(correct: float, fmt: float = 1.0, **extra: float) -> Verdict:
    return Verdict(correct, correct >= 1, {"correct": correct, "format": fmt, **extra})


# --- pure composition -----------------------------------------------------------------------------
def naive_overlong(length: int, max_tokens: int, buffer: int) -> float:
    """DAPO eq. 13 written out literally (as a reward; we return its negation)."""
    if length <= max_tokens - buffer:
        r = 0.0
    elif length <= max_tokens:
        r = ((max_tokens - buffer) - length) / buffer
    else:
        r = -1.0
    return -r


@pytest.mark.parametrize("length", range(0, 140, 3))
def test_overlong_penalty_matches_dapo(length: int) -> None:
    assert overlong_penalty(length, 100, 20) == pytest.approx(naive_overlong(length, 100, 20))


def test_no_layers_means_verifier_score() -> None:
    r = compose(RewardConfig(), "arith", {None: verdict(0.5)})
    assert r.value == 0.5 and r.layers == {}


SEEDS_RECIPE = RewardConfig(layers=[
    LayerConfig(name="format", weight=0.1, component="format"),
    LayerConfig(name="execution", weight=0.6, component="correct"),
    LayerConfig(name="judge", weight=0.3, component="correct", verifier="judge", domains=["essay"]),
])


def test_seed_recipe_weights_and_domain_gating() -> None:
    # code task: the judge layer does not apply, the other two are renormalised
    r = compose(SEEDS_RECIPE, "code", {None: verdict(0.5, 1.0)})
    assert r.value == pytest.approx((0.1 * 1 + 0.6 * 0.5) / 0.7)
    assert r.layers == {"format": 1.0, "execution": 0.5}
    # open-ended task: the judge's own verdict feeds its layer
    r = compose(SEEDS_RECIPE, "essay", {None: verdict(1.0, 0.0), "judge": verdict(0.8)})
    assert r.value == pytest.approx(0.1 * 0 + 0.6 * 1 + 0.3 * 0.8)
    assert r.layers["judge"] == 0.8


def test_unnormalised_penalties_and_clip() -> None:
    cfg = RewardConfig(layers=[LayerConfig(name="c", weight=1.0)], normalize=False, clip=(-1.0, 1.0), penalties=[
        PenaltyConfig(name="long", kind="overlong", max_tokens=10, buffer_tokens=4, weight=0.5),
        PenaltyConfig(name="turns", kind="turns", free=2, per_unit=0.25),
        PenaltyConfig(name="cut", kind="truncated", weight=0.1, domains=["other"]),
    ])
    r = compose(cfg, "arith", {None: verdict(1.0)}, n_tokens=8, n_turns=5, truncated=True)
    assert r.layers == {"c": 1.0, "penalty/long": pytest.approx(0.25), "penalty/turns": pytest.approx(0.75)}
    assert r.value == pytest.approx(1.0 - 0.25 - 0.75)
    r = compose(cfg, "arith", {None: verdict(0.0)}, n_tokens=50, n_turns=9)
    assert r.value == -1.0  # clipped from -0.0 - 0.5 - 1.0


def test_passed_component_is_all_or_nothing() -> None:
    """`component: passed` reads the verdict's pass/fail: a program that passes 9 of 10 hidden tests
    gets 0, not 0.9 (partial credit pays wrong programs); a verifier's own `passed` component wins."""
    cfg = RewardConfig(layers=[LayerConfig(name="pass", weight=1.0, component="passed")])
    assert compose(cfg, "code", {None: verdict(0.9)}).value == 0.0
    assert compose(cfg, "code", {None: verdict(1.0)}).value == 1.0
    assert compose(cfg, "code", {None: Verdict(0.9, True, {"correct": 0.9, "passed": 0.5})}).value == 0.5
    mixed = RewardConfig(layers=[LayerConfig(name="pass", weight=3.0, component="passed"),
                                 LayerConfig(name="fmt", weight=1.0, component="format")])
    assert compose(mixed, "code", {None: verdict(0.9, 1.0)}).value == pytest.approx(0.25)


def test_missing_component_names_the_layer() -> None:
    cfg = RewardConfig(layers=[LayerConfig(name="style", weight=1.0, component="style")])
    with pytest.raises(ConfigError, match="layer 'style'.*no component 'style'.*correct, format.*'passed'"):
        compose(cfg, "arith", {None: verdict(1.0)})


def test_reward_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown key 'reward.layers.0.wieght'"):
        load_config("smoke", ["reward.layers=[{name: a, wieght: 1}]"])
    with pytest.raises(ConfigError, match="unique.*'a'"):
        load_config("smoke", ["reward.layers=[{name: a, weight: 1}, {name: a, weight: 2}]"])
    with pytest.raises(ConfigError, match="reward.penalties.0.kind"):
        load_config("smoke", ["reward.penalties=[{name: p, kind: vibes}]"])


# --- concurrent grading ---------------------------------------------------------------------------
class Probe:
    """A verifier that records how many calls run at once."""

    def __init__(self, delay: float) -> None:
        self.delay, self.live, self.peak, self.lock = delay, 0, 0, threading.Lock()

    def verify(self, task, trajectory, ctx):
        with self.lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
        time.sleep(self.delay)
        with self.lock:
            self.live -= 1
        if "boom" in trajectory.completion_text:
            raise RuntimeError("grader bug")
        ok = trajectory.completion_text.strip() == task.hidden["answer"]
        return Verdict(float(ok), ok, {"correct": float(ok), "format": 1.0})


class AsyncProbe:
    async def averify(self, task, trajectory, ctx):
        await asyncio.sleep(0.01)
        return Verdict(0.25, False, {"correct": 0.25, "format": 1.0}, "async")

    def verify(self, task, trajectory, ctx):  # pragma: no cover - the async path must be used
        raise AssertionError("sync path used for an async verifier")


def test_batch_is_concurrent_and_bounded() -> None:
    probe = Probe(0.05)
    register_verifier("probe", probe)
    tasks = [task("probe")] * 40
    out = grade_batch(tasks, ["42"] * 40, VerifyContext(), opts=BatchOptions(concurrency=6))
    assert [g.verdict.score for g in out] == [1.0] * 40
    assert probe.peak == 6  # ran 6 at a time, never more


def test_one_bad_item_never_fails_the_batch() -> None:
    register_verifier("probe", Probe(0.0))
    register_verifier("slow", Probe(3.0))
    register_verifier("aprobe", AsyncProbe())
    items = [
        (task("probe"), "42"),                          # fine
        (task("probe"), "boom"),                        # verifier crash -> infra
        (task("slow"), "42"),                           # timeout -> infra
        (task("no_such_verifier"), "42"),               # unknown verifier -> infra, named
        (task("probe"), b"\xff\xfe 42"),                # not UTF-8 -> 0 with reason
        (task("probe"), "4" * (2 << 20)),               # over the size cap -> 0 with reason
        (task("aprobe"), "x"),                          # async verifier awaited
        (task("exact"), "The answer is 42"),            # a real built-in
    ]
    out = grade_batch([t for t, _ in items], [c for _, c in items], VerifyContext(extractor="last_number"),
                      opts=BatchOptions(concurrency=4, timeout_s=0.5, max_completion_bytes=1 << 20))
    v = [g.verdict for g in out]
    assert v[0].score == 1.0 and not v[0].infra_error
    assert v[1].infra_error and "RuntimeError: grader bug" in v[1].details
    assert v[2].infra_error and "timed out after 0.5s" in v[2].details
    assert v[3].infra_error and "unknown verifier 'no_such_verifier'" in v[3].details
    assert not v[4].infra_error and v[4].score == 0 and "not valid UTF-8" in v[4].details
    assert not v[5].infra_error and v[5].score == 0 and "over the 1048576-byte cap" in v[5].details
    assert v[6].score == 0.25 and v[6].details == "async"
    assert v[7].score == 1.0


def test_extra_verifier_layer_and_its_infra_error() -> None:
    register_verifier("probe", Probe(0.0))
    register_verifier("second_opinion", lambda prompt, completion, **kw: 0.5 if "42" in completion else 0.0)
    cfg = RewardConfig(layers=[LayerConfig(name="exec", weight=0.5),
                               LayerConfig(name="opinion", weight=0.5, verifier="second_opinion")])
    out = grade_batch([task("probe")] * 2, ["42", "41"], VerifyContext(), cfg)
    assert out[0].reward.value == pytest.approx(0.75) and out[0].reward.layers == {"exec": 1.0, "opinion": 0.5}
    assert out[1].reward.value == 0.0
    register_verifier("second_opinion", lambda prompt, completion, **kw: 1 / 0)
    out = grade_batch([task("probe")], ["42"], VerifyContext(), cfg)
    assert out[0].verdict.infra_error and "reward layer" in out[0].verdict.details


def test_grade_batch_works_inside_a_running_event_loop() -> None:
    register_verifier("probe", Probe(0.0))

    async def main():
        return grade_batch([task("probe")], ["42"], VerifyContext())

    assert asyncio.run(main())[0].verdict.passed


def test_trajectory_input_keeps_tokens_for_penalties() -> None:
    register_verifier("probe", Probe(0.0))
    traj = Trajectory("t", "arith", (1,), tuple(range(30)), (0.0,) * 30, "42", "length", 0)
    cfg = RewardConfig(layers=[LayerConfig(name="c", weight=1.0)],
                       penalties=[PenaltyConfig(name="cut", kind="truncated", weight=0.3)])
    out = grade_batch([task("probe")], [traj], VerifyContext(), cfg)
    assert out[0].reward.value == pytest.approx(0.7)


def test_inline_path_for_cheap_verifiers_handles_bad_input_too() -> None:
    items = [task("exact"), task("exact"), task("exact")]
    out = grade_batch(items, ["42", b"\xc3\x28", "9" * 100], VerifyContext(extractor="full"),
                      opts=BatchOptions(max_completion_bytes=50))
    assert out[0].verdict.passed
    assert out[1].verdict.score == 0 and "not valid UTF-8" in out[1].verdict.details
    assert out[2].verdict.score == 0 and "over the 50-byte cap" in out[2].verdict.details
