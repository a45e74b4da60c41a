"""Private scratch directories for engine weights (/dev/shm where there is one) that never outlive
their process for long.

A weight copy in /dev/shm is RAM: a run killed with SIGKILL (or a crash before its atexit hooks)
leaves 250 MB+ behind per engine, and a day of killed test runs filled 10 GB of a 24 GB machine
until vLLM's worker was OOM-killed. Each directory's name carries its owner's pid; making a new one
first removes those whose owner is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["scratch_root", "private_dir", "sweep_orphans"]


def scratch_root() -> Path:
    """/dev/shm when it is writable (weights stay in RAM), else the temp directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_orphans(prefix: str, root: Path | None = None) -> list[Path]:
    """Remove `root/{prefix}{pid}-*` directories (ours: same uid) whose pid is no longer running."""
    root = root or scratch_root()
    pat = re.compile(re.escape(prefix) + r"(\d+)-")
    gone = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return gone
    for p in entries:
        m = pat.match(p.name)
        if not m or not p.is_dir():
            continue
        try:
            if p.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def private_dir(prefix: str, root: Path | None = None) -> Path:
    """A new owner-only directory `root/{prefix}{pid}-XXXX`, after sweeping dead owners' ones."""
    root = root or scratch_root()
    sweep_orphans(prefix, root)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
