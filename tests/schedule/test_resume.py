"""Exact resume: a run killed with SIGKILL at random points in every phase and resumed each time
ends bitwise equal (weights and metrics) to a run that was never interrupted; a damaged state
or checkpoint is refused with a message that offers the last good checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from honing.config import load_config
from honing.errors import ConfigError
from honing.schedule.loop import train
from honing.schedule.state import StateError

STEPS = 8
PHASES = ("rollout", "update", "checkpoint", "commit", "eval")

RECIPE = {
    "model": {"name": "tiny-random", "bf16_autocast": False},
    "tasks": {"sources": [{"name": "gym:basic_arithmetic",
                           "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                      "operators": ["+"], "allow_negation": False, "allow_parentheses": False}}],
              "exclude_heldout_questions": False, "prompts_per_step": 4, "samples_per_prompt": 4},
    "generation": {"max_new_tokens": 5, "temperature": 1.0},
    "train": {"steps": STEPS, "learning_rate": 1e-3, "micro_batch_size": 8, "mini_batches": 2},
    "sft": {"steps": 3, "batch_size": 8, "learning_rate": 3e-3},
    "eval": {"heldout_tasks": 8, "every_steps": 3},
    "checkpoint": {"every_steps": 2, "keep_last": 2},
    "schedule": {"priority": {"revisit_frac": 0.25, "rest_steps": 2}},
    "run": {"deterministic": True},
}

VOLATILE = ("time/", "worker/", "train/update_s", "train/peak_", "train/rss", "train/mem", "rollout/peak_")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE) and k not in ("time",)} for r in rows]


def _metrics(run: Path) -> list[dict]:
    db = sqlite3.connect(run / "state.sqlite")
    rows = [{"step": s, **json.loads(m)} for s, m in db.execute("SELECT step, metrics FROM steps ORDER BY step")]
    db.close()
    return _stable(rows)


def _counts(run: Path) -> dict:
    db = sqlite3.connect(run / "state.sqlite")
    q = lambda sql: db.execute(sql).fetchone()[0]  # noqa: E731
    out = {"used": q("SELECT COUNT(*) FROM trajectories WHERE status='used'"),
           "used_distinct": q("SELECT COUNT(*) FROM (SELECT DISTINCT shard, row FROM trajectories WHERE status='used')"),
           "outcome_samples": q("SELECT SUM(samples) FROM outcomes"),
           "steps": q("SELECT COUNT(*) FROM steps")}
    db.close()
    return out


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "honing.cli", "train", "--no-progress", *args]


def _env() -> dict:
    return {**os.environ, "HONING_TRACE_PHASES": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _run_and_kill(args: list[str], target: tuple[str, int] | None, rng: random.Random, log: list,
                  sig: int = signal.SIGKILL) -> int:
    """Run `honing train`; with a target (phase, step), send `sig` shortly after that phase starts."""
    p = subprocess.Popen(_cmd(*args), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=_env())
    seen, other = [], []
    assert p.stderr is not None
    for line in p.stderr:
        if not line.startswith("honing-phase "):
            other.append(line)
        else:
            _, name, step = line.split()
            seen.append((name, int(step)))
            if target and name == target[0] and int(step) >= target[1]:
                time.sleep(rng.uniform(0, 0.03))
                p.send_signal(sig)
                if sig == signal.SIGKILL:
                    break
    p.wait(timeout=300)
    log.append((target, seen[-1] if seen else None, p.returncode))
    if p.returncode not in (0, -signal.SIGKILL, 130):
        log.append("".join(other[-20:]))
    return p.returncode


@pytest.mark.timeout(900)
def test_kill9_at_random_points_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    cfg_file = tmp_path / "recipe.yaml"
    cfg_file.write_text(yaml.safe_dump(RECIPE))
    ref, run = tmp_path / "ref", tmp_path / "run"
    log: list = []
    rng = random.Random(1234)
    assert _run_and_kill(["--config", str(cfg_file), "--out", str(ref)], None, rng, log) == 0

    # kill -9 in every phase (at random moments within it), and one Ctrl-C (a clean stop)
    targets = [("rollout", 2), ("checkpoint", 2), ("update", 3), ("eval", 3), ("commit", 5), ("rollout", 6),
               ("update", 7)]
    targets = [(name, step if name == "eval" else step + rng.randint(0, 1)) for name, step in targets]
    sigs = [signal.SIGKILL] * len(targets)
    sigs[rng.choice([2, 4])] = signal.SIGINT
    args = ["--config", str(cfg_file), "--out", str(run)]
    kills = 0
    for tgt, sig in zip(targets, sigs):
        code = _run_and_kill(args, tgt, rng, log, sig)
        if code == 0:
            break  # the run finished before the target came up
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130), log
        kills += sig == signal.SIGKILL
        args = ["--resume", str(run)]
    if kills and log[-1][2] != 0:
        assert _run_and_kill(["--resume", str(run)], None, rng, log) == 0, log
    assert kills >= 5, log
    for target, last_phase, code in (x for x in log if isinstance(x, tuple)):  # shown with pytest -s
        print(f"resume cycle: aimed at {target}, stopped at {last_phase}, exit {code}")

    a, b = (ref / "checkpoints" / "final" / "model.safetensors").read_bytes(), \
        (run / "checkpoints" / "final" / "model.safetensors").read_bytes()
    assert a == b, "final weights differ after kill/resume cycles"
    assert _metrics(ref) == _metrics(run)
    ca, cb = _counts(ref), _counts(run)
    assert ca == cb
    assert cb["used"] == cb["used_distinct"] == STEPS * 4 * 4  # every step trained on exactly its samples, once
    assert cb["outcome_samples"] == cb["used"]
    ref_summary = json.loads((ref / "summary.json").read_text())
    run_summary = json.loads((run / "summary.json").read_text())
    assert ref_summary["heldout_after"] == run_summary["heldout_after"]


def _short(tmp_path: Path, name: str, **over) -> tuple:
    recipe = json.loads(json.dumps(RECIPE))
    recipe["train"]["steps"] = 4
    recipe["sft"]["steps"] = 0
    recipe["eval"] = {"heldout_tasks": 4, "every_steps": 0}
    for k, v in over.items():
        recipe[k].update(v)
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(recipe))
    cfg, _ = load_config(str(f), [])
    return cfg, tmp_path / name


def test_damaged_checkpoint_is_refused_and_the_last_good_one_offered(tmp_path: Path) -> None:
    cfg, run = _short(tmp_path, "ck")
    train(cfg, run, show_progress=False)
    weights = run / "checkpoints" / "final" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(StateError) as e:
        train(cfg, run, show_progress=False, resume=True)
    msg = str(e.value)
    assert "model.safetensors" in msg and "sha256" in msg and "--from-step 2" in msg
    s = train(cfg, run, show_progress=False, resume=True, from_step=2)  # the offered one works
    assert s["resumed_from_step"] == 2


def test_corrupted_or_truncated_state_is_refused(tmp_path: Path) -> None:
    cfg, run = _short(tmp_path, "st")
    train(cfg, run, show_progress=False)
    state = run / "state.sqlite"
    for mangle in (lambda b: b[: len(b) // 3], lambda b: b[:100] + b"\x00" * 64 + b[164:], lambda b: b"junk" * 10):
        good = state.read_bytes()
        state.write_bytes(mangle(good))
        with pytest.raises(StateError) as e:
            train(cfg, run, show_progress=False, resume=True)
        assert "state.sqlite" in str(e.value) and "last good checkpoint" in str(e.value)
        state.write_bytes(good)


def test_a_finished_run_goes_on_to_more_steps_as_if_it_had_never_stopped(tmp_path: Path) -> None:
    """`honing train --resume RUN --steps 8` on a finished 4-step run: its `final` checkpoint becomes
    step-4, the run trains steps 5-8, and the result equals an 8-step run from the start (weights
    bitwise, step metrics). Fewer steps than the resume point is refused."""
    cfg4, run = _short(tmp_path, "ext")
    cfg8, ref = load_config(str(tmp_path / "ext.yaml"), ["train.steps=8"])[0], tmp_path / "ref8"
    train(cfg4, run, show_progress=False)
    s = train(cfg8, run, show_progress=False, resume=True)
    assert s["resumed_from_step"] == 4 and s["steps"] == 8
    db = sqlite3.connect(run / "state.sqlite")
    rows = dict(db.execute("SELECT step, checkpoint FROM steps WHERE step IN (4, 8)").fetchall())
    db.close()
    assert Path(rows[4]).name == "step-4" and Path(rows[8]).name == "final"
    assert json.loads((run / "checkpoints" / "step-4" / "manifest.json").read_text())["step"] == 4
    assert json.loads((run / "checkpoints" / "final" / "manifest.json").read_text())["step"] == 8
    train(cfg8, ref, show_progress=False)
    assert _metrics(ref) == _metrics(run)
    assert (ref / "checkpoints" / "final" / "model.safetensors").read_bytes() == \
        (run / "checkpoints" / "final" / "model.safetensors").read_bytes()
    cfg2 = load_config(str(tmp_path / "ext.yaml"), ["train.steps=2"])[0]
    with pytest.raises(ConfigError, match="resumes at step 8"):
        train(cfg2, run, show_progress=False, resume=True)
