"""Shared helpers for the sandbox suites: small limits, host-side scans, leak checks.

Every case of these suites checks two things: the host is unharmed (no leftover process,
cgroup, workspace, file or clock change) and the ExecResult says what happened.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

HAVE_BWRAP = shutil.which("bwrap") is not None
REPO = Path(__file__).resolve().parents[2]
CGROUP_DIRS = [Path(f"/sys/fs/cgroup/{c}/honing") for c in ("memory", "pids", "cpuacct", "")]


def small_limits(**changes):
    from honing.sandbox import Limits

    base = dict(timeout_s=2, cpu_s=2, memory_mb=128, pids=32, file_size_mb=8, output_bytes=64 << 10, tmpfs_mb=32)
    base.update(changes)
    return Limits(**base)


def marker() -> str:
    return f"honing-adv-{uuid.uuid4().hex[:12]}"


def host_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_with(needle: str) -> list[int]:
    """Host processes whose command line contains `needle` (this test process excluded)."""
    found = []
    raw = needle.encode()
    for pid in host_pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if raw in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, parent pid) of a live process; None for one that is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
    return None if rest[0] == "Z" else (comm, int(rest[1]))


def new_processes(before: set[int], comm: str) -> list[int]:
    """Live processes started since `before` that either descend from this test process or were
    orphaned (reparented to init) and are named `comm`. Other jobs on a shared CI host start
    processes too, so a whole-host count is no measure of what a box left behind."""
    stats = {pid: s for pid in host_pids() if (s := _stat(pid)) is not None}
    me, found = os.getpid(), []
    for pid in set(stats) - before:
        comm_, parent = stats[pid]
        if parent in (0, 1) and comm_ == comm:
            found.append(pid)
            continue
        seen = set()
        while parent not in (0, 1, me) and parent in stats and parent not in seen:
            seen.add(parent)
            parent = stats[parent][1]
        if parent == me:
            found.append(pid)
    return sorted(found)


def pids_named(comm: str) -> list[int]:
    """Host processes (zombies included: their cmdline is empty, their comm is kept) named `comm`."""
    found = []
    for pid in host_pids():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                found.append(pid)
        except OSError:
            pass
    return found


def wait_gone(needle: str, timeout: float = 2.0) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        left = pids_with(needle)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


def leaked_cgroups() -> list[str]:
    prefix = f"box-{os.getpid()}-"
    out = []
    for d in CGROUP_DIRS:
        if d.is_dir():
            out += [str(p) for p in d.iterdir() if p.name.startswith(prefix)]
    return out


def leaked_workspaces() -> list[str]:
    from honing.sandbox.workspace import sandbox_root

    tags = (f"ws-{os.getpid()}-", f"snap-{os.getpid()}-")
    return [p.name for p in sandbox_root().iterdir() if p.name.startswith(tags) and "-probe-" not in p.name]


@pytest.fixture(scope="session")
def sandbox():
    if not HAVE_BWRAP:
        pytest.skip("bubblewrap (bwrap) is not installed")
    from honing.sandbox import Sandbox

    sb = Sandbox("bwrap", limits=small_limits(), max_concurrency=2)
    yield sb
    sb.close()


@pytest.fixture
def host_unharmed():
    """Checked after the case: no cgroup or workspace of this process is left behind."""
    yield
    assert leaked_cgroups() == [], "a box's cgroup outlived its job"
    assert leaked_workspaces() == [], "a workspace or snapshot dir outlived its job"
