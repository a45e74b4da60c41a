"""`honing train` user errors: exit 2, one 'honing: error:' line naming the problem, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from honing.config import REPO_CONFIGS

HONING = Path(sys.executable).parent / "honing"
SMOKE = REPO_CONFIGS / "smoke.yaml"


def _run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HONING_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    env.pop("HONING_PROGRESS", None)
    return subprocess.run([str(HONING), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=timeout)


def _error_line(proc: subprocess.CompletedProcess, run_dir: Path | None = None) -> str:
    """Checks the common contract and returns the error line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("honing: error:")]
    assert len(errors) == 1, proc.stderr
    assert lines[-1] == errors[0], proc.stderr  # the error is the last thing said
    # Anything else on stderr is the one-line start banner, never a log dump.
    assert all(ln.startswith("honing train: ") for ln in lines[:-1]), proc.stderr
    if run_dir is not None:
        assert not run_dir.exists(), "a failed start must not create the run directory"
    return errors[0]


def test_nonexistent_config_file(tmp_path: Path) -> None:
    proc = _run(["train", "--config", "/nope.yaml", "--out", str(tmp_path / "run")], tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "/nope.yaml" in line and "not found" in line
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unknown_override_key(tmp_path: Path) -> None:
    proc = _run(["train", "--config", "smoke", "train.bogus=1", "--out", str(tmp_path / "run")], tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "'train.bogus'" in line and "unknown key" in line
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unknown_override_key_suggests_nearest(tmp_path: Path) -> None:
    proc = _run(["train", "--config", "smoke", "train.learnig_rate=1", "--out", str(tmp_path / "run")], tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "'train.learnig_rate'" in line and "did you mean 'learning_rate'" in line


def test_wrong_type_override(tmp_path: Path) -> None:
    proc = _run(["train", "--config", "smoke", "train.steps=abc", "--out", str(tmp_path / "run")], tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "'train.steps'" in line and "abc" in line
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_unknown_domain_lists_closest(tmp_path: Path) -> None:
    data = yaml.safe_load(SMOKE.read_text())
    assert data["tasks"]["sources"][0]["name"] == "gym:basic_arithmetic"
    data["tasks"]["sources"][0]["name"] = "gym:basic_arithmetc"
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(yaml.safe_dump(data))
    proc = _run(["train", "--config", str(recipe), "--out", str(tmp_path / "run")], tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "gym:basic_arithmetc" in line and "basic_arithmetic" in line.split("gym:basic_arithmetc", 1)[1]


@pytest.mark.slow
def test_missing_model_path(tmp_path: Path) -> None:
    proc = _run(["train", "--config", "smoke", "model.name=/does/not/exist", "--out", str(tmp_path / "run")],
                tmp_path)
    line = _error_line(proc, tmp_path / "run")
    assert "/does/not/exist" in line and "does not exist" in line


def test_help_config_lists_keys(tmp_path: Path) -> None:
    proc = _run(["train", "--help-config"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for key in ("train.learning_rate = ", "model.name = ", "tasks.sources = ", "model.lora.r = "):
        assert key in proc.stdout
    assert "AdamW learning rate." in proc.stdout
    assert "Traceback" not in proc.stderr


def test_steps_and_from_step_need_resume(tmp_path: Path) -> None:
    for flag in (["--steps", "8"], ["--from-step", "2"]):
        line = _error_line(_run(["train", *flag, "--out", str(tmp_path / "run")], tmp_path), tmp_path / "run")
        assert f"{flag[0]} needs --resume" in line


def test_steps_on_a_staged_run_names_the_stage_to_extend(tmp_path: Path) -> None:
    """A staged recipe's stages are runs of their own: `--resume RUN --steps N` on the recipe's directory
    would skip every finished stage and train nothing, so it is refused with the stage to extend."""
    data = yaml.safe_load(SMOKE.read_text())
    data["stages"] = [{"name": "warm", "kind": "sft", "set": {"sft.steps": 2}},
                      {"name": "rl", "kind": "rl", "set": {"train.steps": 2}}]
    run = tmp_path / "staged"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    before = sorted(p.name for p in run.iterdir())
    line = _error_line(_run(["train", "--resume", str(run), "--steps", "8"], tmp_path))
    assert "--steps is for one run" in line and str(run / "stages" / "02-rl") in line and "--steps 8" in line
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written
