"""cgroup v1/v2 control of a box's memory and process count, where the machine allows it.

One child group per box under honing/ in each controller; processes are put in by a tiny
shell wrapper before it execs bubblewrap, so every process of the box is accounted and can
be killed together.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _writable(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


def detect() -> str | None:
    """'v2', 'v1' (memory + pids controllers usable) or None."""
    if (ROOT / "cgroup.controllers").exists():
        ctrl = (ROOT / "cgroup.controllers").read_text().split()
        return "v2" if {"memory", "pids"} <= set(ctrl) and _writable(ROOT) else None
    if _writable(ROOT / "memory") and _writable(ROOT / "pids"):
        try:
            for c in ("memory", "pids"):
                (ROOT / c / "honing").mkdir(exist_ok=True)
            return "v1"
        except OSError:
            return None
    return None


@dataclass
class BoxCgroup:
    version: str
    dirs: list[Path]

    @classmethod
    def create(cls, version: str, memory_mb: int, pids: int) -> "BoxCgroup":
        name = f"box-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if version == "v2":
            parent = ROOT / "honing"
            parent.mkdir(exist_ok=True)
            try:
                (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
                (parent / "cgroup.subtree_control").write_text("+memory +pids")
            except OSError:
                pass
            d = parent / name
            d.mkdir()
            (d / "memory.max").write_text(str(memory_mb << 20))
            (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
            (d / "pids.max").write_text(str(pids))
            return cls("v2", [d])
        mem = ROOT / "memory" / "honing" / name
        pid = ROOT / "pids" / "honing" / name
        mem.mkdir()
        pid.mkdir()
        (mem / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
        swap = mem / "memory.memsw.limit_in_bytes"
        if swap.exists():
            try:
                swap.write_text(str(memory_mb << 20))
            except OSError:
                pass
        (pid / "pids.max").write_text(str(pids))
        return cls("v1", [mem, pid])

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return out

    def oom_killed(self) -> bool:
        d = self.dirs[0]
        try:
            if self.version == "v2":
                ev = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
                return int(ev.get("oom_kill", 0)) > 0 or int(ev.get("max", 0)) > 0
            oc = dict(line.split() for line in (d / "memory.oom_control").read_text().splitlines())
            return int(oc.get("oom_kill", 0)) > 0 or int((d / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def peak_mb(self) -> float:
        d = self.dirs[0]
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                return int((d / name).read_text()) / 2**20
            except (OSError, ValueError):
                continue
        return 0.0

    def kill_all(self, deadline_s: float = 2.0) -> None:
        """SIGKILL every process in the group until it is empty (forks racing the kill included)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)
