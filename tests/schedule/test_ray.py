"""Rollouts on Ray actors (schedule.workers=ray) on a local cluster with 2 CPUs, tiny model:
the same final weights as in process (deterministic mode), an actor SIGKILLed mid-request (the run
completes, state.sqlite adds up exactly), an actor added mid-run gets work, an unreachable address
is one error line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from honing.config import load_config  # noqa: E402
from honing.schedule.loop import train  # noqa: E402
from honing.schedule.pool import request_size  # noqa: E402
from honing.schedule.trajstore import read_shard  # noqa: E402

PROMPTS, SAMPLES = 4, 4
BASE = ["sft.steps=40", f"tasks.prompts_per_step={PROMPTS}", f"tasks.samples_per_prompt={SAMPLES}",
        "eval.heldout_tasks=4", "run.deterministic=true", "report_to=[]", "schedule.ray.num_cpus=1",
        "schedule.ray.call_timeout_s=120"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster for the module (the pools join it), one torch thread here and in the actors
    (CPU float reductions depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    # Ray's memory monitor kills workers when the *machine* is near full; CI machines are shared
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", object_store_memory=256 * 2**20)
    yield
    ray.shutdown()
    torch.set_num_threads(before)


def run(tmp: Path, name: str, extra: list[str], callbacks=()) -> tuple[dict, Path]:
    cfg, _ = load_config("smoke", BASE + extra)
    out = tmp / name
    return train(cfg, out, show_progress=False, callbacks=callbacks), out


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / "final" / "model.safetensors")


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "workers.log").read_text().splitlines()]


def check_counts(run_dir: Path, summary: dict, steps: int) -> None:
    """Every step trained on PROMPTS x SAMPLES trajectories; every batch is indexed exactly once."""
    per = PROMPTS * SAMPLES
    assert summary["state"] == {"steps": steps + 1, "trajectories_used": steps * per,
                                "trajectories_indexed": steps * per, "outcome_samples": steps * per}
    db = sqlite3.connect(run_dir / "state.sqlite")
    batches = db.execute("SELECT batch_id, status, rows FROM batches WHERE status != 'discarded' "  # (a resume's
                         "ORDER BY batch_id").fetchall()                                       # lost policy)
    assert [b[1] for b in batches] == ["consumed"] * steps and all(b[2] == per for b in batches)
    per_batch = dict(db.execute("SELECT batch_id, COUNT(*) FROM trajectories GROUP BY batch_id").fetchall())
    assert per_batch == {b[0]: per for b in batches}
    assert db.execute("SELECT COUNT(*) FROM trajectories WHERE status='used'").fetchone()[0] == steps * per
    assert db.execute("SELECT step, COUNT(*) FROM trajectories GROUP BY step").fetchall() == \
        [(s, per) for s in range(1, steps + 1)]
    db.close()


def test_ray_run_equals_in_process_run(tmp_path: Path) -> None:
    a, da = run(tmp_path, "inprocess", ["train.steps=3", "schedule.workers=inprocess"])
    b, db = run(tmp_path, "ray", ["train.steps=3", "schedule.workers=ray", "schedule.ray.rollout_workers=2"])
    wa, wb = final_weights(da), final_weights(db)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sft = load_file(da / "checkpoints" / "sft" / "model.safetensors")  # the RL steps changed the weights
    assert any(not torch.equal(wa[k], sft[k]) for k in sft)
    for shard in sorted((da / "trajectories").glob("*.parquet")):  # and the same samples were drawn
        ta, tb = read_shard(shard), read_shard(db / "trajectories" / shard.name)
        assert [(t.completion_ids, t.logprobs, t.reward) for t in ta] == \
            [(t.completion_ids, t.logprobs, t.reward) for t in tb]
    assert a["heldout_after"]["pass@1"] == b["heldout_after"]["pass@1"]
    served = [e for e in events(db) if e["event"] == "close"][-1]["served"]
    assert sorted(served) == ["0", "1"] and all(n >= 1 for n in served.values())  # both actors rolled out


def _actor_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)
            if "RolloutActor" in " ".join(p.cmdline())]


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def test_sigkilled_actor_mid_request_loses_nothing(tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_a_busy_actor() -> None:
        pids = _actor_pids()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for pid in pids:
                if _title(pid).endswith(".run"):  # ray::RolloutActor.run: it holds a request now
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.0005)

    def on_step(step: int, metrics: dict) -> None:
        if step == 1:
            threading.Thread(target=kill_a_busy_actor, daemon=True).start()

    steps = 5
    summary, out = run(tmp_path, "killed", [f"train.steps={steps}", "schedule.workers=ray", "schedule.staleness=1",
                                            "schedule.ray.rollout_workers=2", "generation.max_new_tokens=16"],
                       callbacks=[on_step])
    assert killed, "no actor was caught running a request"
    ev = events(out)
    died = [e for e in ev if e["event"] == "died"]
    assert len(died) == 1 and died[0]["batch"] is not None, ev
    assert [e for e in ev if e["event"] == "close"][-1]["resubmitted"] == 1
    assert sum(e["event"] == "add" for e in ev) == 3  # two at the start, one replacement
    check_counts(out, summary, steps)


def test_actor_added_mid_run_receives_work(tmp_path: Path) -> None:
    def on_step(step: int, metrics: dict) -> None:
        if step == 1:
            request_size(tmp_path / "grow", 2)
            deadline = time.monotonic() + 30  # the pool reads workers.json about once a second
            while time.monotonic() < deadline:
                log = tmp_path / "grow" / "workers.log"
                if log.exists() and any(e["event"] == "add" and e["slot"] == 1 for e in events(tmp_path / "grow")):
                    return
                time.sleep(0.1)
            raise AssertionError("the pool did not add the requested actor")

    steps = 4
    summary, out = run(tmp_path, "grow", [f"train.steps={steps}", "schedule.workers=ray",
                                          "schedule.ray.rollout_workers=1"], callbacks=[on_step])
    ev = events(out)
    assert [e["to"] for e in ev if e["event"] == "resize"] == [2]
    served = [e for e in ev if e["event"] == "close"][-1]["served"]
    assert served.get("1", 0) >= 1 and sum(served.values()) == steps
    check_counts(out, summary, steps)


def test_unreachable_address_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    honing = Path(sys.executable).with_name("honing")
    t0 = time.monotonic()
    p = subprocess.run([str(honing), "train", "-c", "smoke", "--out", str(tmp_path / "r"), "-q", "sft.steps=0",
                        "eval.heldout_tasks=2", "train.steps=1", "schedule.workers=ray",
                        "schedule.ray.address=127.0.0.1:1", "schedule.ray.connect_timeout_s=3"],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("honing: error:")]
    assert len(errors) == 1 and "schedule.ray.address='127.0.0.1:1'" in errors[0] and "Traceback" not in p.stderr
    assert time.monotonic() - t0 < 120


def test_crash_and_resume_on_ray_keeps_buffered_rollouts_and_adds_up(tmp_path: Path) -> None:
    """The driver dies after step 6 (checkpoints every 4, staleness 1, so graded batches are buffered);
    the resumed run reuses them, and state.sqlite adds up exactly."""
    import gc

    from honing.schedule.pool import WorkerPool

    class Crash(Exception):
        pass

    def crash(step: int, metrics: dict) -> None:
        if step == 6:
            raise Crash

    extra = ["train.steps=8", "schedule.workers=ray", "schedule.staleness=1", "checkpoint.every_steps=4",
             "schedule.ray.rollout_workers=1"]
    with pytest.raises(Crash):
        run(tmp_path, "crash", extra, callbacks=[crash])
    for pool in [o for o in gc.get_objects() if WorkerPool in type(o).__mro__]:  # what Ray does to a dead
        pool.close()                                                         # driver's actors
    cfg, _ = load_config("smoke", BASE + extra)
    summary = train(cfg, tmp_path / "crash", show_progress=False, resume=True)
    assert summary["resumed_from_step"] == 4
    db = sqlite3.connect(tmp_path / "crash" / "state.sqlite")
    resume = [json.loads(r[0]) for r in db.execute("SELECT detail FROM events WHERE kind='resume'")]
    db.close()
    assert len(resume) == 1 and resume[0]["reused_trajectories"] > 0
    check_counts(tmp_path / "crash", summary, 8)


def test_worker_image_without_bubblewrap_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    """Code tasks grade in bubblewrap boxes; an actor whose PATH has no bwrap (a worker image
    without it) stops the run at start-up with one line naming the problem."""
    import shutil

    honing = Path(sys.executable).with_name("honing")
    image = tmp_path / "bin"  # the worker image's PATH: a shell (Ray starts workers with bash), no bwrap
    image.mkdir()
    (image / "bash").symlink_to(shutil.which("bash"))
    p = subprocess.run([str(honing), "train", "-c", "smoke", "--out", str(tmp_path / "r"), "-q", "sft.steps=0",
                        "eval.heldout_tasks=2", "train.steps=1", "schedule.workers=ray", "schedule.ray.local_cpus=1",
                        "schedule.ray.call_timeout_s=90", 'tasks.sources=[{"name": "code:functions"}]',
                        f'schedule.ray.env={{"PATH": "{image}"}}'],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("honing: error:")]
    assert len(errors) == 1 and "Ray rollout actor on" in errors[0] and "bubblewrap (bwrap) is not installed" in errors[0]
    assert "Traceback" not in p.stderr


def _grader_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True) if "GradingActor" in " ".join(p.cmdline())]


def test_grading_actors_grade_the_same_and_survive_a_sigkill(tmp_path: Path) -> None:
    """schedule.ray.grading_workers: the rollout actor sends every single-turn sample to a grading
    actor; the run's final weights equal those of a run that grades in the rollout actor (deterministic
    mode). A grading actor killed with SIGKILL mid-run is restarted by Ray and the run completes with
    state.sqlite adding up."""
    one = ["schedule.workers=ray", "schedule.ray.rollout_workers=1", "schedule.ray.num_cpus=0.5"]
    _, da = run(tmp_path, "local-grading", ["train.steps=2", *one])
    rows: list[dict] = []
    _, db = run(tmp_path, "grading-actor", ["train.steps=2", *one, "schedule.ray.grading_workers=1"],
                callbacks=[lambda step, m: rows.append(m)])
    wa, wb = final_weights(da), final_weights(db)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [m["rollout/graded_remote"] for m in rows if "rollout/graded_remote" in m] == [PROMPTS * SAMPLES] * 2
    killed: list[int] = []

    def on_step(step: int, metrics: dict) -> None:
        if step == 1:
            for pid in _grader_pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    steps = 3
    summary, dc = run(tmp_path, "grader-killed", [f"train.steps={steps}", *one, "schedule.ray.grading_workers=1"],
                      callbacks=[on_step])
    assert killed
    check_counts(dc, summary, steps)
