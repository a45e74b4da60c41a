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
        version = "v2" if {"memory", "pids"} <= set(ctrl) and _writable(ROOT) else None
    elif _writable(ROOT / "memory") and _writable(ROOT / "pids"):
        try:
            for c in ("memory", "pids"):
                (ROOT / c / "honing").mkdir(exist_ok=True)
            version = "v1"
        except OSError:
            version = None
    else:
        version = None
    if version:
        _sweep_stale()
    return version


_swept = False


def _sweep_stale() -> None:
    """Remove the (empty) groups of boxes whose owner died without removing them (killed -9)."""
    global _swept
    if _swept:
        return
    _swept = True
    for parent in (ROOT / "honing", ROOT / "memory" / "honing", ROOT / "pids" / "honing", ROOT / "cpuacct" / "honing"):
        try:
            children = list(parent.iterdir())
        except OSError:
            continue
        for d in children:
            parts = d.name.split("-")
            if not d.is_dir() or len(parts) != 3 or parts[0] != "box" or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
                continue  # its owner is alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            # only empty groups: a group with processes may belong to a honing in another pid namespace
            group = BoxCgroup("v2" if parent == ROOT / "honing" else "v1", [d])
            if not group.pids():
                try:
                    d.rmdir()
                except OSError:
                    pass


@dataclass
class BoxCgroup:
    version: str
    dirs: list[Path]  # memory first; every process of the box is in each of them
    cpu_dir: Path | None = None  # where CPU time is accounted (v1 cpuacct, v2 the same group)

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
            return cls("v2", [d], d)
        mem = ROOT / "memory" / "honing" / name
        pid = ROOT / "pids" / "honing" / name
        mem.mkdir()
        pid.mkdir()
        (mem / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
        swap = mem / "memory.memsw.limit_in_bytes"
        try:
            if swap.exists():
                swap.write_text(str(memory_mb << 20))
            else:  # no swap accounting: keep the box's pages out of swap instead
                (mem / "memory.swappiness").write_text("0")
        except OSError:
            pass
        (pid / "pids.max").write_text(str(pids))
        dirs, cpu = [mem, pid], None
        # CPU time of the whole box: the rusage bwrap's parent sees misses the processes its
        # pid-1 reaps (bwrap hands the exit code over an eventfd, not by being waited for).
        acct = ROOT / "cpuacct"
        if _writable(acct):
            try:
                (acct / "honing").mkdir(exist_ok=True)
                cpu = acct / "honing" / name
                cpu.mkdir()
                dirs.append(cpu)
            except OSError:
                cpu = None
        return cls("v1", dirs, cpu)

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
        """True when the kernel OOM-killed a process of the box. Hitting the limit alone (page
        cache reclaimed, e.g. after reading big files) is not an OOM: v2's 'max' and v1's
        failcnt count those too, so they are used only where no oom_kill counter exists."""
        d = self.dirs[0]
        try:
            if self.version == "v2":
                ev = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
                return int(ev.get("oom_kill", 0)) > 0 or int(ev.get("oom", 0)) > 0
            oc = dict(line.split() for line in (d / "memory.oom_control").read_text().splitlines())
            if "oom_kill" in oc:
                return int(oc["oom_kill"]) > 0 or int(oc.get("under_oom", 0)) > 0
            return int((d / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def cpu_s(self) -> float | None:
        """User + system CPU seconds of every process the box had, or None if not accounted."""
        if self.cpu_dir is None:
            return None
        try:
            if self.version == "v2":
                st = dict(line.split() for line in (self.cpu_dir / "cpu.stat").read_text().splitlines())
                return int(st["usage_usec"]) / 1e6
            return int((self.cpu_dir / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError, KeyError):
            return None

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
