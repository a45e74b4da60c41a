"""The run-health monitor's checks against hand-made metric sequences (each fires on its cue and
stays quiet otherwise), its edge-triggered events, its state across a resume, the halt_on config
check, the state.sqlite migration and the report's reading of the events. No model: fast."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from honing.config import HEALTH_EVENTS, HealthConfig, load_config
from honing.errors import ConfigError
from honing.schedule.health import (HealthMonitor, climb, collapse, heldout_drop, infra_share, layer_coefficients,
                                    memory_pressure, non_correctness_gain, tag)
from honing.schedule.state import SCHEMA_VERSION, RunState, StateError
from honing.verify.reward import RewardConfig

LAYERS = RewardConfig.model_validate({"layers": [{"name": "correct", "weight": 3.0},
                                                 {"name": "format", "weight": 1.0, "component": "format"}],
                                      "penalties": [{"name": "long", "kind": "overlong"}]})


def _healthy(step: int, rng: random.Random) -> dict[str, float]:
    """A run going fine: reward creeping up through correctness, everything else steady with noise."""
    correct = min(1.0, 0.2 + 0.01 * step + rng.uniform(-0.03, 0.03))
    fmt = 0.9 + rng.uniform(-0.02, 0.02)
    return {"train/reward": (3 * correct + fmt) / 4, "train/completion_len": 40 + rng.uniform(-4, 4),
            "train/neg_logprob": 0.8 + rng.uniform(-0.05, 0.05), "train/clip_frac": 0.02 + rng.uniform(0, 0.01),
            "train/logprob_mismatch": 0.01, "train/tis_clip_frac": 0.0, "rollout/attempts": 8.0,
            "rollout/infra_errors": float(rng.random() < 0.1),
            "reward/d/total": (3 * correct + fmt) / 4, "reward/d/correct": correct, "reward/d/format": fmt,
            "reward/d/penalty/long": 0.0}


def _run(monitor: HealthMonitor, steps: int, change=None, seed: int = 0) -> list[dict]:
    rng, events = random.Random(seed), []
    for s in range(1, steps + 1):
        m = _healthy(s, rng)
        if change:
            change(s, m)
        events += monitor.observe(s, m)
    return events


def _monitor(**kw) -> HealthMonitor:
    return HealthMonitor(HealthConfig(window=4, **kw), reward=LAYERS, group_size=4)


# --- the pure checks -------------------------------------------------------------------------------

def test_collapse_and_climb() -> None:
    assert collapse(10.0, 3.9, 0.4) and not collapse(10.0, 4.1, 0.4)
    assert not collapse(0.0, 0.0, 0.4)  # nothing to collapse from
    assert climb(0.01, 0.2, 0.1) and not climb(0.01, 0.1, 0.1) and not climb(0.3, 0.1, 0.1)


def test_heldout_drop_needs_a_drop_beyond_the_ci_and_a_reward_rise() -> None:
    best = {f"t{i}": 1.0 for i in range(32)}
    fell = {f"t{i}": 0.0 if i < 16 else 1.0 for i in range(32)}
    hit, vals = heldout_drop(best, fell, 0.2, 0.5, reward_rise=0.05)
    assert hit and vals["ci_hi"] < 0 and vals["delta"] == pytest.approx(-0.5) and vals["tasks"] == 32
    assert not heldout_drop(best, fell, 0.5, 0.52, reward_rise=0.05)[0]  # train reward did not rise
    one = {f"t{i}": 0.0 if i == 0 else 1.0 for i in range(32)}  # one task of 32: within the CI
    assert not heldout_drop(best, one, 0.2, 0.5, reward_rise=0.05)[0]
    assert not heldout_drop(best, {"other": 0.0}, 0.2, 0.5, 0.05)[0]  # no shared tasks
    # the 16 failing tasks are 2 structures of 8 (of 4 structures): the drop is 2 structures' worth, within the CI
    four = {f"t{i}": f"s{i // 8}" for i in range(32)}
    hit, clustered = heldout_drop(best, fell, 0.2, 0.5, reward_rise=0.05, clusters=four)
    assert not hit and clustered["delta"] == vals["delta"] and clustered["ci_hi"] == 0.0


def test_layer_coefficients_follow_the_reward_config() -> None:
    c = layer_coefficients(LAYERS, "d")
    assert c == {"correct": (0.75, True), "format": (0.25, False), "penalty/long": (-1.0, False)}
    only = RewardConfig.model_validate({"layers": [{"name": "correct", "weight": 1.0},
                                                   {"name": "fmt", "weight": 1.0, "component": "format",
                                                    "domains": ["x"]}], "normalize": False})
    assert layer_coefficients(only, "y") == {"correct": (1.0, True)}
    assert layer_coefficients(only, "x")["fmt"] == (1.0, False)
    binary = RewardConfig.model_validate({"layers": [{"name": "pass", "weight": 1.0, "component": "passed"}]})
    assert layer_coefficients(binary, "d") == {"pass": (1.0, True)}  # all-or-nothing correctness is correctness


def test_non_correctness_gain() -> None:
    coefs = layer_coefficients(LAYERS, "d")
    first = {"total": 0.30, "correct": 0.2, "format": 0.6, "penalty/long": 0.0}
    by_format = {"total": 0.40, "correct": 0.2, "format": 1.0, "penalty/long": 0.0}
    (name, vals), = non_correctness_gain(first, by_format, coefs, 0.05, 0.5)
    assert name == "format" and vals["share"] == pytest.approx(1.0)
    by_correct = {"total": 0.45, "correct": 0.4, "format": 0.6, "penalty/long": 0.0}
    assert non_correctness_gain(first, by_correct, coefs, 0.05, 0.5) == []
    tiny = {"total": 0.32, "correct": 0.2, "format": 0.68, "penalty/long": 0.0}
    assert non_correctness_gain(first, tiny, coefs, 0.05, 0.5) == []  # below layer_min_gain
    penalised = {**first, "total": 0.10, "penalty/long": 0.2}
    gone = {**first, "total": 0.30, "penalty/long": 0.0}  # all of the gain: a penalty going away
    assert [n for n, _ in non_correctness_gain(penalised, gone, coefs, 0.05, 0.5)] == ["penalty/long"]


def test_infra_share_counts_samples_of_every_attempt() -> None:
    assert infra_share({"rollout/attempts": 10.0, "rollout/infra_errors": 8.0}, 4) == pytest.approx(0.2)
    assert infra_share({"train/reward": 1.0}, 4) is None
    assert tag([]) == "" and tag([{"name": "b"}, {"name": "a"}, {"name": "a"}]) == "  health: a, b"


# --- the monitor on sequences ----------------------------------------------------------------------

def test_a_healthy_run_raises_nothing() -> None:
    m = _monitor()
    assert _run(m, 60) == []


def test_length_collapse_fires_once_and_rearms_after_recovery() -> None:
    def change(s: int, m: dict) -> None:
        if 20 <= s < 40:
            m["train/completion_len"] = 8.0
    events = _run(_monitor(), 60, change)
    assert [e["name"] for e in events] == ["length_collapse"] and 22 <= events[0]["step"] <= 23  # once
    e = events[0]
    assert e["severity"] == "warn" and e["values"]["ratio"] < 0.4 and "length_collapse=0.4" in e["message"]
    # recovery, then a second collapse: a second event
    def twice(s: int, m: dict) -> None:
        if 20 <= s < 30 or s >= 45:
            m["train/completion_len"] = 8.0
    steps = [e["step"] for e in _run(_monitor(), 60, twice)]
    assert len(steps) == 2 and 22 <= steps[0] <= 23 and 47 <= steps[1] <= 48, steps


def test_entropy_collapse() -> None:
    def change(s: int, m: dict) -> None:
        if s >= 30:
            m["train/neg_logprob"] = 0.05
    events = _run(_monitor(), 40, change)
    assert [e["name"] for e in events] == ["entropy_collapse"] and "mean -log p" in events[0]["message"]
    mild = _run(_monitor(), 40, lambda s, m: m.update({"train/neg_logprob": 0.5}) if s >= 30 else None)
    assert mild == []  # 0.5 / 0.8 is not a collapse


def test_format_layer_driving_the_gain() -> None:
    def change(s: int, m: dict) -> None:  # correctness flat, format climbing from 0.2 to 1
        fmt = min(1.0, 0.2 + 0.04 * s)
        m.update({"reward/d/correct": 0.2, "reward/d/format": fmt, "reward/d/total": (0.6 + fmt) / 4,
                  "train/reward": (0.6 + fmt) / 4})
    events = _run(_monitor(), 30, change)
    assert [e["name"] for e in events] == ["non_correctness_gain"]
    assert events[0]["values"]["layer"] == "format" and events[0]["values"]["domain"] == "d"


def test_infra_errors_climbing() -> None:
    events = _run(_monitor(), 30, lambda s, m: m.update({"rollout/infra_errors": 12.0}) if s > 15 else None)
    assert [e["name"] for e in events] == ["infra_errors"] and events[0]["values"]["recent"] >= 0.1
    flat = _run(_monitor(), 30, lambda s, m: m.update({"rollout/infra_errors": 3.0}))
    assert flat == []  # a steady share is not a climb


@pytest.mark.parametrize("key,value", [("train/clip_frac", 0.3), ("train/logprob_mismatch", 0.4),
                                       ("train/tis_clip_frac", 0.2)])
def test_is_ratio_climbing(key: str, value: float) -> None:
    events = _run(_monitor(), 30, lambda s, m: m.update({key: value}) if s > 15 else None)
    assert [(e["name"], e["values"]["metric"]) for e in events] == [("is_ratio", key)]


def test_heldout_drop_in_the_monitor() -> None:
    m = _monitor()
    ids = [f"t{i}" for i in range(20)]
    m.observe_heldout(0, {"pass@1": 0.5, "per_task_pass@1": {i: float(k % 2) for k, i in enumerate(ids)}})
    events = []
    for s in range(1, 25):
        if s in (8, 16, 24):  # held-out pass@1 falls to 0.1 from step 16 on
            held = {i: float(k % 2 and (s < 16 or k < 4)) for k, i in enumerate(ids)}
            m.observe_heldout(s, {"pass@1": sum(held.values()) / 20, "per_task_pass@1": held})
        events += m.observe(s, {"train/reward": 0.2 + 0.02 * s})
    assert [(e["name"], e["step"]) for e in events] == [("heldout_drop", 16)]  # once: still down at 24
    v = events[0]["values"]
    assert v["best_step"] == 0 and v["ci_hi"] < 0 and v["reward_now"] > v["reward_best"]
    # the evaluation after the last step is checked by check_heldout
    m.observe_heldout(30, {"pass@1": 0.5, "per_task_pass@1": {i: float(k % 2) for k, i in enumerate(ids)}})
    assert m.check_heldout(30) == []  # back at its best: re-armed, no event


def test_memory_pressure_check() -> None:
    assert memory_pressure(900.0, 1000.0, 0.85) and not memory_pressure(800.0, 1000.0, 0.85)
    assert not memory_pressure(10**9, None, 0.85)  # no known limit: silent


def test_memory_pressure_fires_on_the_step_and_rearms() -> None:
    m = HealthMonitor(HealthConfig(window=4), ["memory_pressure"], LAYERS, 4, memory_limit_mb=10_000.0)
    peaks = {1: (2000, 3000), 2: (2500, 9100), 3: (2500, 9200), 4: (2500, 4000), 5: (9300, 4000)}
    got = {}
    for step, (rollout, update) in peaks.items():
        metrics = {**_healthy(step, random.Random(step)), "rollout/peak_rss_mb": float(rollout),
                   "train/peak_rss_mb": float(update)}
        got[step] = [e for e in m.observe(step, metrics) if e["name"] == "memory_pressure"]
    assert [s for s, ev in got.items() if ev] == [2, 5]  # on the way in only; re-armed after step 4
    e2, e5 = got[2][0], got[5][0]
    assert e2["severity"] == "halt" and e2["values"]["metric"] == "train/peak_rss_mb" and e2["values"]["share"] == 0.91
    assert "8.9 GB in step 2's update is 91% of the 9.8 GB" in e2["message"]
    assert "train.gradient_checkpointing" in e2["message"]
    assert "step 5's rollout" in e5["message"]
    quiet = HealthMonitor(HealthConfig(window=4, memory_fraction=0.95), (), LAYERS, 4, memory_limit_mb=10_000.0)
    assert not quiet.observe(2, {"train/peak_rss_mb": 9100.0})


def test_halt_on_marks_severity_and_unknown_names_are_refused() -> None:
    m = HealthMonitor(HealthConfig(window=4), ["length_collapse"], LAYERS, 4)
    events = _run(m, 30, lambda s, m: m.update({"train/completion_len": 5.0}) if s > 12 else None)
    assert [(e["name"], e["severity"]) for e in events] == [("length_collapse", "halt")]
    with pytest.raises(ConfigError, match="valid: heldout_drop"):
        HealthMonitor(HealthConfig(), ["lenght_collapse"])
    with pytest.raises(ConfigError) as err:
        load_config("smoke", ["run.halt_on=[entropy_colapse]"])
    assert "run.halt_on" in str(err.value) and all(n in str(err.value) for n in HEALTH_EVENTS)
    cfg, _ = load_config("smoke", ["run.halt_on=[is_ratio, heldout_drop]", "run.health.window=3"])
    assert cfg.run.halt_on == ["is_ratio", "heldout_drop"] and cfg.run.health.window == 3


def test_disabled_monitor_is_silent() -> None:
    assert _run(_monitor(enabled=False), 40, lambda s, m: m.update({"train/completion_len": 1.0})) == []


def test_state_round_trip_equals_an_uninterrupted_monitor() -> None:
    def change(s: int, m: dict) -> None:
        if s > 14:
            m["train/completion_len"] = 5.0
        if s > 20:
            m["rollout/infra_errors"] = 16.0
    whole = _run(_monitor(), 30, change)
    a = _monitor()
    rng, events = random.Random(0), []
    for s in range(1, 31):
        if s == 18:  # a resume: the state went through the checkpoint's JSON
            sd = json.loads(json.dumps(a.state_dict()))
            a = _monitor()
            a.load_state_dict(sd)
        m = _healthy(s, rng)
        change(s, m)
        events += a.observe(s, m)
    assert events == whole and [e["name"] for e in whole] == ["length_collapse", "infra_errors"]


# --- state.sqlite and the report -------------------------------------------------------------------

def _old_state(path: Path) -> None:
    """A state.sqlite as honing wrote it before health_events (schema version 1)."""
    st = RunState(path, create=True)
    st.db.execute("DROP TABLE health_events")
    st.db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    st.close()


def test_old_state_is_migrated_and_events_roll_back(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _old_state(path)
    st = RunState(path)  # an old run directory opens (and resumes)
    assert st.meta("schema_version") == SCHEMA_VERSION == 2 and st.health_events() == []
    ev = {"name": "length_collapse", "severity": "warn", "message": "short", "values": {"ratio": 0.2}}
    for step in (1, 2, 3):
        st.commit_step(step, step, "initial", 0, None, {}, [], {}, [], [], health=[{**ev, "step": step}])
    st.set_final_health(3, [{**ev, "name": "heldout_drop"}])
    st.set_final_health(3, [{**ev, "name": "heldout_drop"}])  # a second final evaluation replaces the first
    assert [(e["step"], e["name"], e["at"]) for e in st.health_events()] == [
        (1, "length_collapse", "step"), (2, "length_collapse", "step"), (3, "length_collapse", "step"),
        (3, "heldout_drop", "final_eval")]
    st.rollback_to(1)
    assert [(e["step"], e["values"]) for e in st.health_events()] == [(1, {"ratio": 0.2})]
    st.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StateError, match="schema version 3"):
        RunState(path)


def test_report_lists_health_events(tmp_path: Path) -> None:
    from honing.eval.report import health_table, read_health

    run = tmp_path / "run"
    run.mkdir()
    _old_state(run / "state.sqlite")
    summary = {"health_events": [{"step": 5, "name": "infra_errors", "severity": "warn", "message": "up 0.3"}]}
    assert read_health(run, summary) == summary["health_events"]  # no table: summary.json's
    st = RunState(run / "state.sqlite")
    st.commit_step(1, 1, "initial", 0, None, {}, [], {}, [], [],
                   health=[{"name": "is_ratio", "severity": "halt", "message": "ratio <up>", "values": {}}])
    st.close()
    events = read_health(run, summary)
    assert [(e["step"], e["name"]) for e in events] == [(1, "is_ratio")]
    page = health_table(events)
    assert "is_ratio" in page and "ratio &lt;up&gt;" in page and "class='bad'" in page
    assert health_table([]) is None
