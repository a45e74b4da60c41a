"""The default isolation backend: bubblewrap + cgroups (or rlimits).

What a box gets: new user, pid, net (loopback only), ipc, uts, mount and cgroup namespaces;
all capabilities dropped; an unprivileged uid; a read-only view of the profile's toolchain;
the workspace read-write at /work; size-capped tmpfs /tmp and /dev/shm; its own /proc (only
its own processes); an allow-listed environment. Limits: wall time (enforced from outside),
CPU time, file size and open files (rlimits); memory and process count (cgroup when
available, else RLIMIT_AS / RLIMIT_NPROC); stdout/stderr capped with a `truncated` flag.
When a job ends, every process of the box is dead: the cgroup is emptied with SIGKILL and
the pid namespace dies with its init.

What it does NOT protect against: the box shares the host kernel, so a kernel exploit
escapes it; timing side channels; CPU contention with other work. For hostile
multi-tenant use put it inside a gVisor or VM layer.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Sequence

from honing.sandbox import cgroups
from honing.sandbox.profiles import Profile
from honing.sandbox.types import ExecResult, Limits, SandboxError

BOX_UID = 1000
_MERGED_USR_LINKS = ("bin", "lib", "lib64", "sbin", "lib32")


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap (bwrap) is not installed: run `make setup` as root, or "
                           "`apt-get install bubblewrap`; the unsafe 'local' backend is never used silently")
    return path


class _Capped:
    """Drain a pipe fully, keep at most `cap` bytes."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        self.buf = bytearray()
        self.truncated = False
        self.thread = threading.Thread(target=self._run, args=(stream, cap), daemon=True)
        self.thread.start()

    def _run(self, stream: IO[bytes], cap: int) -> None:
        while chunk := stream.read(65536):
            room = cap - len(self.buf)
            if room > 0:
                self.buf += chunk[:room]
            if len(chunk) > max(room, 0):
                self.truncated = True
        stream.close()

    def text(self) -> str:
        self.thread.join(timeout=5)
        return self.buf.decode("utf-8", "replace")


def bwrap_argv(bwrap: str, profile: Profile, workspace: Path, limits: Limits, argv: Sequence[str],
               extra_ro: Sequence[tuple[str, str]] = ()) -> list[str]:
    tmpfs = str(limits.tmpfs_mb << 20)
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--uid", str(BOX_UID), "--gid", str(BOX_UID), "--hostname", "box", "--clearenv"]
    for k, v in profile.environment().items():
        cmd += ["--setenv", k, v]
    for p in profile.ro_paths:
        cmd += ["--ro-bind", p, p]
    for name in _MERGED_USR_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            cmd += ["--symlink", os.readlink(host), host]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", tmpfs, "--tmpfs", "/tmp",
            "--size", tmpfs, "--tmpfs", "/dev/shm", "--bind", str(workspace), "/work"]
    for host, box in extra_ro:
        cmd += ["--ro-bind", host, box]
    cmd += ["--chdir", "/work", "--", *argv]
    return cmd


def _rlimit_argv(limits: Limits, with_cgroup: bool) -> list[str]:
    cpu = max(1, math.ceil(limits.cpu_s))
    out = ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--fsize={limits.file_size_mb << 20}",
           f"--nofile={limits.open_files}", "--core=0"]
    if not with_cgroup:
        out += [f"--as={(limits.memory_mb + 64) << 20}", f"--nproc={limits.pids}"]
    return out + ["--"]


class BwrapBackend:
    name = "bwrap"

    def __init__(self, use_cgroups: bool = True) -> None:
        self.bwrap = find_bwrap()
        if shutil.which("prlimit") is None:
            raise SandboxError("prlimit (util-linux) is needed to set a box's rlimits")
        self.cgroup_version = cgroups.detect() if use_cgroups else None

    def mechanisms(self) -> dict[str, str]:
        cg = f"cgroup {self.cgroup_version}" if self.cgroup_version else None
        return {
            "isolation": f"bubblewrap ({self.bwrap}): user/pid/net/ipc/uts/mount/cgroup namespaces, caps dropped",
            "network": "none (loopback only)",
            "memory": cg or "RLIMIT_AS (no writable cgroup memory controller)",
            "pids": cg or "RLIMIT_NPROC (no writable cgroup pids controller)",
            "cpu_time": "RLIMIT_CPU", "file_size": "RLIMIT_FSIZE", "open_files": "RLIMIT_NOFILE",
            "wall_time": "killed from outside (cgroup / process group + pid namespace)",
        }

    def run(self, argv: Sequence[str], workspace: Path, profile: Profile, limits: Limits,
            stdin: bytes | None = None, extra_ro: Sequence[tuple[str, str]] = ()) -> ExecResult:
        box = bwrap_argv(self.bwrap, profile, workspace, limits, argv, extra_ro)
        cg = cgroups.BoxCgroup.create(self.cgroup_version, limits.memory_mb, limits.pids) \
            if self.cgroup_version else None
        cmd = _rlimit_argv(limits, cg is not None) + box
        if cg is not None:  # join the cgroup before anything of the box exists
            joins = "; ".join(f'echo $$ > "{f}"' for f in cg.procs_files())
            cmd = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *cmd]
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin"})
        except OSError as e:
            if cg:
                cg.remove()
            return ExecResult(-1, "", "", backend=self.name, infra_error=f"cannot start bwrap: {e}")
        out, err = _Capped(proc.stdout, limits.output_bytes), _Capped(proc.stderr, limits.output_bytes)  # type: ignore[arg-type]
        if stdin:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            _kill(proc, cg)

        timer = threading.Timer(limits.timeout_s, on_timeout)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        oom = cg.oom_killed() if cg else False
        peak = cg.peak_mb() if cg else usage.ru_maxrss / 1024
        if cg:
            cg.remove()  # kills anything left (e.g. a daemon that escaped the session)
        stdout, stderr = out.text(), err.text()
        rc = proc.returncode
        sig = -rc if rc < 0 else (rc - 128 if rc > 128 else None)
        if not cg and "MemoryError" in stderr:
            oom = True
        return ExecResult(
            exit_code=rc, stdout=stdout, stderr=stderr, truncated=out.truncated or err.truncated,
            timed_out=timed_out.is_set(), oom=oom, signal=sig, wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime, max_rss_mb=peak, backend=self.name,
        )


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


def _kill(proc: subprocess.Popen, cg: cgroups.BoxCgroup | None) -> None:
    if cg is not None:
        cg.kill_all()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
