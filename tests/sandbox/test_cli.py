"""`honing sandbox exec/doctor` through the real console script, including bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
HONING = str(Path(sys.executable).parent / "honing")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HONING, "sandbox", *args], capture_output=True, text=True, timeout=120)


def test_exec_json_reports_every_field(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("import sys\nprint(open('data.txt').read().strip())\nsys.exit(4)\n")
    (tmp_path / "data.txt").write_text("hello from files\n")
    p = _run("exec", "--json", "--files", str(tmp_path), "--", "python3", "main.py")
    assert p.returncode == 4, p.stderr
    res = json.loads(p.stdout)
    for key in ("exit_code", "stdout", "stderr", "truncated", "timed_out", "oom", "signal", "wall_s", "cpu_s",
                "max_rss_mb", "backend"):
        assert key in res, key
    assert res["exit_code"] == 4 and res["stdout"] == "hello from files\n" and res["backend"] == "bwrap"


def test_exec_timeout_is_reported() -> None:
    p = _run("exec", "--json", "--timeout-s", "1", "--", "sleep", "30")
    res = json.loads(p.stdout)
    assert res["timed_out"] is True and res["wall_s"] < 10 and p.returncode != 0


def test_doctor_names_mechanisms_and_probe_passes() -> None:
    p = _run("doctor")
    assert p.returncode == 0, p.stderr
    assert "network: blocked" in p.stdout and "memory" in p.stdout and "pids" in p.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--profile", "pythn"], "unknown sandbox profile 'pythn'"),
    (["--files", "/does/not/exist"], "files dir does not exist"),
    (["--memory-mb", "-5"], "memory_mb"),
    (["--timeout-s", "0"], "timeout_s"),
])
def test_bad_input_is_one_clear_line(args: list[str], needle: str) -> None:
    p = _run("exec", *args, "--", "true")
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("honing: error:") and needle in lines[0], p.stderr
