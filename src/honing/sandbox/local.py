"""UNSAFE local backend: a plain subprocess with rlimits and no isolation at all.

Only when explicitly configured (backend='local'); it warns loudly every time it is built.
The code it runs can read the host's files, use the network and outlive its job.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Sequence

from honing.sandbox.bwrap import _rlimit_argv
from honing.sandbox.profiles import Profile
from honing.sandbox.types import ExecResult, Limits

BANNER = ("honing sandbox: WARNING: the 'local' backend is NOT ISOLATED: model-written code runs as you, "
          "with your files and network. Use it only for trusted code.")


class LocalBackend:
    name = "local-unsafe"

    def __init__(self) -> None:
        print(BANNER, file=sys.stderr)
        warnings.warn(BANNER, stacklevel=2)
        self.cgroup_version = None

    def mechanisms(self) -> dict[str, str]:
        return {"isolation": "NONE (unsafe local backend)", "memory": "RLIMIT_AS", "pids": "RLIMIT_NPROC",
                "cpu_time": "RLIMIT_CPU", "wall_time": "killed from outside (process group)"}

    def run(self, argv: Sequence[str], workspace: Path, profile: Profile, limits: Limits,
            stdin: bytes | None = None, extra_ro: Sequence[tuple[str, str]] = ()) -> ExecResult:
        return _run_plain(list(argv), workspace, profile, limits, stdin)


def _run_plain(argv: list[str], workspace: Path, profile: Profile, limits: Limits,
               stdin: bytes | None) -> ExecResult:
    """The bwrap backend's process handling (capped pipes, outside timeout) with no box."""
    import os
    import subprocess
    import threading
    import time

    from honing.sandbox.bwrap import _Capped, _feed, _kill

    cmd = _rlimit_argv(limits, with_cgroup=False) + argv
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workspace, env=profile.environment() | {"HOME": str(workspace)},
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    out, err = _Capped(proc.stdout, limits.output_bytes), _Capped(proc.stderr, limits.output_bytes)  # type: ignore[arg-type]
    if stdin:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = threading.Event()
    timer = threading.Timer(limits.timeout_s, lambda: (timed_out.set(), _kill(proc, None)))
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    _kill(proc, None)  # the whole process group: no stragglers
    proc.returncode = os.waitstatus_to_exitcode(status)
    rc = proc.returncode
    stderr = err.text()
    return ExecResult(exit_code=rc, stdout=out.text(), stderr=stderr, truncated=out.truncated or err.truncated,
                      timed_out=timed_out.is_set(), oom="MemoryError" in stderr, signal=-rc if rc < 0 else None,
                      wall_s=time.perf_counter() - t0, cpu_s=usage.ru_utime + usage.ru_stime,
                      max_rss_mb=usage.ru_maxrss / 1024, backend=LocalBackend.name)
