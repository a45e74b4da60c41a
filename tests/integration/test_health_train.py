"""The run-health monitor in real runs of the tiny model, with scripted rewards
(tests/schedule/health_scripted.py) that provoke its events on cue: a format layer that drives the
whole reward gain (and infrastructure errors that climb) stops a `honing train` run named in
run.halt_on, checkpointed, and `honing train --resume` finishes it; held-out pass@1 falling while train reward
rises is caught at the evaluation that shows it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from honing.config import RunConfig
from honing.schedule.loop import StoppedEarly, train

SCRIPTED = Path(__file__).resolve().parents[1] / "schedule" / "health_scripted.py"
HONING = str(Path(sys.executable).parent / "honing")


def _recipe(verifier: str, **run: object) -> dict:
    return {
        "model": {"name": "tiny-random", "bf16_autocast": False},
        "tasks": {"sources": [{"name": "gym:basic_arithmetic", "verifier": f"{SCRIPTED}:{verifier}",
                               "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                          "operators": ["+"], "allow_negation": False, "allow_parentheses": False}}],
                  "exclude_heldout_questions": False, "prompts_per_step": 4, "samples_per_prompt": 4},
        "generation": {"max_new_tokens": 4},
        "verify": {"max_infra_error_frac": 1.0},
        "train": {"steps": 6, "micro_batch_size": 16},
        "eval": {"heldout_tasks": 6, "contamination": {"mode": "off"}},
        "schedule": {"orchestration": {"max_retries": 1, "backoff_s": 0.0}},
        "report_to": [],
        "run": {"health": {"window": 2}, **run},
    }


def _db(run: Path) -> sqlite3.Connection:
    return sqlite3.connect(run / "state.sqlite")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HONING, "train", "--no-progress", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_format_gain_halts_the_run_checkpointed_and_resume_finishes(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    torch.set_num_threads(1)
    recipe = _recipe("FormatGain", halt_on=["non_correctness_gain"])
    recipe["reward"] = {"layers": [{"name": "correct", "weight": 1.0, "component": "correct"},
                                   {"name": "format", "weight": 1.0, "component": "format"}]}
    run = tmp_path / "run"
    with pytest.raises(StoppedEarly) as stop:  # what `honing train` prints, exiting 130
        train(RunConfig.model_validate(recipe), run, show_progress=False, plain_progress=True)
    assert "stopped by the run-health monitor after step 4 (checkpointed), on non_correctness_gain" in str(stop.value)
    assert f"honing train --resume {run}" in str(stop.value)
    err = capsys.readouterr().err
    assert "health halt: step 4: non_correctness_gain: gym:basic_arithmetic: reward layer 'format'" in err
    assert "health warn: step 4: infra_errors" in err
    assert "RL: step 4/6" in err and "health: infra_errors, non_correctness_gain" in err  # the per-step line
    db = _db(run)
    rows = db.execute("SELECT step, name, severity, values_json, at FROM health_events ORDER BY id").fetchall()
    assert [(s, n, sev, at) for s, n, sev, _, at in rows] == [(4, "infra_errors", "warn", "step"),
                                                             (4, "non_correctness_gain", "halt", "step")]
    assert json.loads(rows[1][3])["layer"] == "format" and json.loads(rows[1][3])["share"] > 0.9
    # committed and checkpointed at the halting step, though checkpoint.every_steps=0 would skip it
    assert db.execute("SELECT MAX(step), MAX(checkpoint_step) FROM steps").fetchone() == (4, 4)
    db.close()
    assert (run / "checkpoints" / "step-4" / "manifest.json").is_file() and not (run / "summary.json").exists()

    p = _cli("--resume", str(run))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at step 4" in p.stderr and "RL: step 6/6" in p.stderr and "health halt" not in p.stderr
    assert "health events   2 (infra_errors, non_correctness_gain)" in p.stdout  # the end-of-run table
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["resumed_from_step"] == 4
    assert [(e["step"], e["name"]) for e in summary["health_events"]] == [(4, "infra_errors"),
                                                                          (4, "non_correctness_gain")]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "train/reward" in r] == [1, 2, 3, 4, 5, 6]
    assert all("train/neg_logprob" in r and "health/infra_share" in r for r in metrics if "train/reward" in r)

    from honing.eval.report import health_table, read_health

    page = health_table(read_health(run, None))  # `honing report RUN`'s section
    assert page and "non_correctness_gain" in page and "infra_errors" in page and "class='bad'>halt" in page


@pytest.mark.slow
def test_heldout_falling_while_train_reward_rises(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.set_num_threads(1)
    recipe = _recipe("HeldoutDrop")
    recipe["eval"]["every_steps"] = 2
    cfg = RunConfig.model_validate(recipe)
    summary = train(cfg, tmp_path / "run", show_progress=False, plain_progress=True)
    err = capsys.readouterr().err
    assert "health warn: step 4: heldout_drop: held-out pass@1 0.000 at step 4 is below 1.000 at step 0" in err
    assert "RL: step 4/6" in err and "health: heldout_drop" in err
    assert [(e["step"], e["name"], e["at"]) for e in summary["health_events"]] == [(4, "heldout_drop", "step")]
    v = summary["health_events"][0]["values"]
    assert v["ci_hi"] < 0 and v["reward_now"] - v["reward_best"] > 0.3 and v["tasks"] == 6
    db = _db(tmp_path / "run")
    assert db.execute("SELECT COUNT(*) FROM health_events").fetchone()[0] == 1  # still down at step 6: once
    db.close()


@pytest.mark.slow
def test_memory_pressure_halts_before_the_kernel_would_kill(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A threshold any process passes stands in for a run near the machine's memory: the step's
    per-phase peaks are logged, the event names the knobs, and the run stops checkpointed."""
    torch.set_num_threads(1)
    recipe = _recipe("FormatGain", halt_on=["memory_pressure"], health={"window": 2, "memory_fraction": 1e-4})
    run = tmp_path / "run"
    with pytest.raises(StoppedEarly) as stop:
        train(RunConfig.model_validate(recipe), run, show_progress=False, plain_progress=True)
    assert "after step 1 (checkpointed), on memory_pressure" in str(stop.value)
    err = capsys.readouterr().err
    assert "health halt: step 1: memory_pressure: peak resident memory" in err and "train.gradient_checkpointing" in err
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step1 = next(r for r in metrics if r.get("step") == 1 and "train/reward" in r)
    # per-phase peaks (not the process's lifetime high-water mark) and the RSS after the update's release
    assert 50 < step1["rollout/peak_rss_mb"] and 50 < step1["train/peak_rss_mb"]
    assert 50 < step1["train/rss_after_mb"] <= step1["train/peak_rss_mb"] + 1
    db = _db(run)
    (values,) = db.execute("SELECT values_json FROM health_events WHERE name = 'memory_pressure'").fetchone()
    db.close()
    assert json.loads(values)["metric"] in ("rollout/peak_rss_mb", "train/peak_rss_mb")
