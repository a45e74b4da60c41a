"""Environment-package suites: the two examples pip-installed (editable, offline) for the session,
the real `honing` console script run in subprocesses."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HONING = Path(sys.executable).parent / "honing"
DISTS = {"word_sort": "honing-env-word-sort", "calc_tool": "honing-env-calc-tool"}
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")


def env_vars(tmp: Path) -> dict[str, str]:
    return {**os.environ, "HONING_HOME": str(tmp / "honing-home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1", "COLUMNS": "200"}


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    """pip in this interpreter's environment, never touching the network (--no-index)."""
    cmd = [sys.executable, "-m", "pip", *args]
    if args[0] == "install":
        cmd[4:4] = ["-q", "--no-index", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or os.environ, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def honing(*args: str, tmp: Path, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(HONING), *args], capture_output=True, text=True, env=env_vars(tmp),
                          timeout=timeout, cwd=cwd or ROOT)


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory):
    """`pip install -e` both examples into this venv; uninstalled again at the end of the session."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed in this environment (an editable install needs it offline)")
    tmp = tmp_path_factory.mktemp("pip")
    pip("install", *[a for name in DISTS for a in ("-e", str(EXAMPLES / name))], env=env_vars(tmp))
    try:
        yield tmp
    finally:
        pip("uninstall", "-y", *DISTS.values())
