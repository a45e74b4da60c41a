"""report_to: TensorBoard, wandb (offline) and MLflow (file store) get metrics.jsonl's names and
values at each step, a resume continues their runs without logging a (step, metric) twice; a
non-terminal stderr gets one plain line per step; a clean run prints no deprecation noise."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from honing.config import load_config
from honing.errors import ConfigError
from honing.schedule.reporters import check_reporters, mlflow_name
from honing.schedule.loop import train

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

HONING = Path(sys.executable).parent / "honing"
QUICK = ["train.steps=3", "eval.heldout_tasks=4", "sft.steps=0", "eval.every_steps=2",
         "report_to=[tensorboard,wandb,mlflow]"]


def _offline_env(mp: pytest.MonkeyPatch, mlflow_uri: str | None) -> None:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    for k in ("WANDB_API_KEY", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME"):
        mp.delenv(k, raising=False)
    if mlflow_uri:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    else:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)


def _by_step(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl's numeric values per step (a step's rows merged: the last one has the final eval)."""
    out: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], {}).update(
            {k: float(v) for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))})
    return out


def _wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file (a LevelDB-style log: 7-byte header, 32 KiB blocks of chunks)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk


def _wandb_history(run_dir: Path) -> tuple[set[str], dict[int, dict[str, float]]]:
    from wandb.proto import wandb_internal_pb2 as pb

    ids, hist = set(), {}
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for data in _wandb_records(f):
            rec = pb.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "run":
                ids.add(rec.run.run_id)
            elif rec.WhichOneof("record_type") == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                step = int(items.pop("_step"))
                assert step not in hist, f"step {step} logged to wandb twice"
                hist[step] = {k: float(v) for k, v in items.items() if not k.startswith("_")}
    return ids, hist


def _mlflow(run_dir: Path, uri: str) -> tuple:
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "reporters.json").read_text())["mlflow"]["run_id"]
    c = MlflowClient(tracking_uri=uri)
    run = c.get_run(run_id)
    hist: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in c.get_metric_history(run_id, key):
            assert key not in hist.get(m.step, {}), f"{key} at step {m.step} logged to mlflow twice"
            hist.setdefault(m.step, {})[key] = m.value
    return run, hist


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], what: str) -> None:
    assert sorted(a) == sorted(b), what
    for step in a:
        assert sorted(a[step]) == sorted(b[step]), (what, step, set(a[step]) ^ set(b[step]))
        for k, v in a[step].items():
            w = b[step][k]
            assert (math.isnan(v) and math.isnan(w)) or math.isclose(v, w, rel_tol=1e-6, abs_tol=1e-9), (what, step, k)


@pytest.fixture(scope="module")
def reported_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reporters") / "run"
    with pytest.MonkeyPatch.context() as mp:
        _offline_env(mp, None)  # MLflow's default: a file store in <run>/mlruns
        cfg, _ = load_config("smoke", QUICK)
        train(cfg, run_dir, show_progress=False)
    return run_dir


@pytest.mark.slow
def test_wandb_offline_history_equals_metrics_jsonl(reported_run: Path) -> None:
    ids, hist = _wandb_history(reported_run)
    assert ids == {json.loads((reported_run / "reporters.json").read_text())["wandb"]["id"]}
    jsonl = _by_step(reported_run)
    assert "heldout/pass@1" in jsonl[2] and "heldout/pass@1" in jsonl[3]  # the mid-run and final evaluations
    _same(jsonl, hist, "wandb")


@pytest.mark.slow
def test_mlflow_file_store_equals_metrics_jsonl(reported_run: Path) -> None:
    assert (reported_run / "mlruns").is_dir()
    run, hist = _mlflow(reported_run, (reported_run / "mlruns").resolve().as_uri())
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.steps"] == "3" and run.data.params["model.name"] == "tiny-random"
    assert json.loads(run.data.params["report_to"]) == ["tensorboard", "wandb", "mlflow"]
    expect = {s: {mlflow_name(k): v for k, v in m.items()} for s, m in _by_step(reported_run).items()}
    assert "heldout/pass_at_1" in expect[3]
    _same(expect, hist, "mlflow")


@pytest.mark.slow
def test_tensorboard_tags_are_metrics_jsonl_names(reported_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(reported_run / "tb"))
    acc.Reload()
    names = {k for m in _by_step(reported_run).values() for k in m}
    assert set(acc.Tags()["scalars"]) == names


def test_mlflow_names_are_legal_and_deterministic() -> None:
    from mlflow.utils.validation import _validate_metric_name

    for key in ("heldout/pass@1", "heldout/gym:basic_arithmetic/pass@1", "train/kl (k3)", "a+b=c", "time/step_s"):
        _validate_metric_name(mlflow_name(key))
    assert mlflow_name("heldout/pass@1") == "heldout/pass_at_1" and mlflow_name("a+b") == "a_b"
    assert mlflow_name("train/clip_frac") == "train/clip_frac"


def test_missing_package_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"report_to includes 'wandb'.*pip install wandb"):
        check_reporters(["tensorboard", "wandb"])
    check_reporters(["tensorboard", "mlflow"])


@pytest.mark.slow
def test_resume_continues_the_same_runs_without_duplicates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = (tmp_path / "store").as_uri()
    _offline_env(monkeypatch, uri)
    run_dir = tmp_path / "run"
    cfg, _ = load_config("smoke", [*QUICK[:-2], "train.steps=4", "checkpoint.every_steps=2",
                                   "report_to=[wandb,mlflow]"])
    train(cfg, run_dir, show_progress=False)
    first = json.loads((run_dir / "reporters.json").read_text())
    train(cfg, run_dir, show_progress=False, resume=True, from_step=2)  # steps 3, 4 and the final eval again
    again = json.loads((run_dir / "reporters.json").read_text())
    assert again["wandb"]["id"] == first["wandb"]["id"] and again["mlflow"]["run_id"] == first["mlflow"]["run_id"]
    run, mlf = _mlflow(run_dir, uri)  # (no (step, metric) twice: asserted while reading)
    assert run.info.status == "FINISHED"
    jsonl = _by_step(run_dir)
    assert sorted(mlf) == sorted(jsonl) == [0, 1, 2, 3, 4]
    expect = {s: {mlflow_name(k): v for k, v in m.items()} for s, m in jsonl.items()}
    _same({s: expect[s] for s in (0, 1, 2)}, {s: mlf[s] for s in (0, 1, 2)}, "mlflow before the resume point")
    # re-done steps keep the first attempt's values (the same but for timings), and every name
    assert all(set(expect[s]) <= set(mlf[s]) for s in (3, 4))
    ids, hist = _wandb_history(run_dir)  # two offline runs, one id, each step once
    assert ids == {first["wandb"]["id"]} and len(list(run_dir.glob("wandb/offline-run-*"))) == 2
    assert sorted(hist) == [0, 1, 2, 3, 4]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HONING_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "default"}
    env.pop("HONING_PROGRESS", None)
    return subprocess.run([str(HONING), "train", "--config", "smoke", "train.steps=3", "sft.steps=20",
                           "eval.heldout_tasks=4", *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)


_WARNING = re.compile(r"(FutureWarning|DeprecationWarning|PendingDeprecationWarning)")


@pytest.mark.slow
def test_non_tty_run_prints_a_plain_line_per_step_and_no_deprecation_noise(tmp_path: Path) -> None:
    p = _cli(tmp_path, "model.lora.enabled=true", "--out", str(tmp_path / "run"))  # LoRA: peft's path too
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stderr.splitlines()
    steps = [ln for ln in lines if ln.startswith("RL: step ")]
    pat = r"RL: step {}/3  reward \d+\.\d\d  pass \d+\.\d\d  \d+\.\ds/step  eta \d+(s|m\d\ds|h\d\dm)"
    assert len(steps) == 3 and all(re.fullmatch(pat.format(i + 1), ln) for i, ln in enumerate(steps)), steps
    assert any(ln.startswith("SFT warm start: step 20/20  loss ") for ln in lines), lines
    assert any(ln.startswith("held-out after: pass@1 ") for ln in lines)
    # long phases without a bar say when they start and how long they took (no silent minutes)
    i = lines.index("held-out eval (after): started")
    assert re.fullmatch(r"held-out eval \(after\): done in \d+(s|m\d\ds)", lines[i + 1]), lines[i:i + 2]
    assert "\x1b" not in p.stderr and "\r" not in p.stderr  # no ANSI, no bar redraws
    assert not [ln for ln in lines if _WARNING.search(ln)], p.stderr


@pytest.mark.slow
def test_quiet_prints_no_step_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from honing.cli import app

    monkeypatch.delenv("HONING_PROGRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["train", "--config", "smoke", "train.steps=2", "sft.steps=0", "eval.heldout_tasks=4",
                                   "--quiet", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "held-out after" in res.stderr and ": step " not in res.stderr, res.stderr


def test_bars_follow_the_terminal_and_honing_progress_but_never_override_no_progress(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from honing.schedule.progress import bars_wanted

    for tty, forced, disabled in [(t, f, d) for t in (False, True) for f in (False, True) for d in (False, True)]:
        monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty, raising=False)
        if forced:
            monkeypatch.setenv("HONING_PROGRESS", "1")
        else:
            monkeypatch.delenv("HONING_PROGRESS", raising=False)
        assert bars_wanted(disabled) == (not disabled and (tty or forced)), (tty, forced, disabled)
