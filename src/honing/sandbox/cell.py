"""One warm sandbox cell: a long-lived bubblewrap box whose pid 1 is zygote.py, and the host
side of its control channel. `WarmPool` (honing.sandbox.warm) keeps several and hands them jobs;
the design is described there."""

from __future__ import annotations

import json
import marshal
import os
import queue
import re
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from honing.sandbox import cgroups
from honing.sandbox import bwrap as _bw
from honing.sandbox.bwrap import BwrapBackend, bwrap_argv
from honing.sandbox.profiles import Profile
from honing.sandbox.types import ExecResult, Limits, SandboxError
from honing.sandbox.workspace import sandbox_root

ZYGOTE_PATH = Path(__file__).with_name("zygote.py")
ZYGOTE_IN_BOX = "/run/honing/zygote.py"
_HDR = struct.Struct(">I")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_REPLY = 1 << 30
MARSHAL_VERSION = 4  # pinned: host and box interpreters may be different Python versions
BACKEND = "warm"
_SIGKILL = int(signal.SIGKILL)

Files = Mapping[str, "bytes | str"]


class CellDied(Exception):
    """The cell's control channel broke (the cell died, or spoke garbage)."""


class NotStarted(CellDied):
    """The cell was found dead before the job was handed over: safe to retry elsewhere."""


_WARM_FLAGS = (("--as-pid-1",), ("--remount-ro", "/dev"), ("--remount-ro", "/"))


def _harden(box: list[str], n_argv: int) -> list[str]:
    """Add the warm-only flags just before bwrap's `--` (after every mount of bwrap_argv):
    the zygote is the box's pid 1, and the root and /dev are read-only (if bwrap_argv does
    not already say so), so /work, /tmp and /dev/shm are the only writable places."""
    sep = len(box) - n_argv - 1
    if sep < 0 or box[sep] != "--":
        raise SandboxError("unexpected bwrap command line shape (bwrap_argv changed?)")
    have = {tuple(box[i:i + 2]) for i in range(sep)} | {(a,) for a in box[:sep]}
    extra = [a for flag in _WARM_FLAGS if flag not in have for a in flag]
    return box[:sep] + extra + box[sep:]


def _launcher(backend: BwrapBackend, profile: Profile, workspace: Path, limits: Limits,
              argv: list[str], extra_ro: list[tuple[str, str]],
              extra_data: dict[str, str] | None = None) -> tuple[list[str], list[int]]:
    """The command that starts a box exactly as BwrapBackend.run does (generated /etc files,
    seccomp filter, no nested user namespaces, options through an --args memfd, the box's
    uid mapped to an unprivileged host uid when running as root), plus the warm flags.
    Returns the command and the fds it needs passed (the caller closes them)."""
    fds: list[int] = []
    try:
        memfd = getattr(_bw, "_memfd", None)
        data = {**(getattr(profile, "data", None) or {}), **(extra_data or {})}
        data_fds = {path: memfd(text.encode(), "etc") for path, text in data.items()} if memfd else {}
        fds += data_fds.values()
        seccomp = getattr(backend, "seccomp", None)
        seccomp_fd = memfd(seccomp, "seccomp") if seccomp and memfd else None
        if seccomp_fd is not None:
            fds.append(seccomp_fd)
        kwargs: dict[str, Any] = {}
        if memfd:
            kwargs = {"data_fds": data_fds, "seccomp_fd": seccomp_fd,
                      "disable_userns": getattr(backend, "disable_userns", False)}
        box = _harden(bwrap_argv(backend.bwrap, profile, workspace, limits, argv, extra_ro, **kwargs), len(argv))
        launcher = box
        if memfd:
            sep = box.index("--")
            args_fd = memfd(b"".join(os.fsencode(a) + b"\0" for a in box[1:sep]), "args")
            fds.append(args_fd)
            launcher = [box[0], "--args", str(args_fd), *box[sep:]]
        host_uid = getattr(backend, "host_uid", None)
        if host_uid is not None:
            _bw._give_tree(workspace, host_uid)
            launcher = [backend.setpriv, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--",
                        *launcher]
        return launcher, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class Spawner:
    """One long-lived thread that forks every cell. bwrap --die-with-parent uses
    PR_SET_PDEATHSIG, which fires when the *thread* that forked bwrap exits, so cells must
    not be started from short-lived threads (executor workers, replacement threads)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="warm-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._q.get()) is not None:
            fn, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def call(self, fn: Callable[[], Any]) -> Any:
        fut: Future = Future()
        with self._lock:
            if self._stopped:
                raise SandboxError("warm pool is closed")
            self._q.put((fn, fut))
        return fut.result()

    def stop(self) -> None:
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._q.put(None)


class Cell:
    """One warm box: a bwrap process running the zygote, its cgroup and its /work dir."""

    def __init__(self, backend: BwrapBackend, profile: Profile, limits: Limits,
                 preload: Sequence[str] | None = None) -> None:
        self.limits = limits
        self.dir = Path(tempfile.mkdtemp(prefix="cell-", dir=sandbox_root()))
        os.chmod(self.dir, 0o777)
        self.cg: cgroups.BoxCgroup | None = None
        self.proc: subprocess.Popen | None = None
        self._buf = bytearray()
        self._cur_mem = self._cur_pids = -1
        self._base_mem = 0
        self._base_pids = 0
        self._oom_count = 0
        self._oom_fd: int | None = None
        self.dead = False
        self._destroyed = False
        self.stderr = tempfile.TemporaryFile(dir=sandbox_root())
        cgroup_version = backend.cgroup_version
        python = profile.env.get("HONING_PYTHON", "/usr/bin/python3")
        argv = [python, "-s", ZYGOTE_IN_BOX] + (["--cgroup"] if cgroup_version else [])
        if preload is not None:
            argv.append("--preload=" + ",".join(preload))
        fds: list[int] = []
        try:
            # The zygote goes in as data (a memfd), not a bind of the source file: the box's
            # unprivileged host uid may not be able to reach the checkout's directory.
            cmd, fds = _launcher(backend, profile, self.dir, limits, argv, [],
                                 {ZYGOTE_IN_BOX: ZYGOTE_PATH.read_text()})
            if cgroup_version:
                # Generous while the zygote starts; set to the job's limits before each job.
                start_mb, start_pids = limits.memory_mb + 256, limits.pids + 16
                self.cg = cgroups.BoxCgroup.create(cgroup_version, start_mb, start_pids)
                self._cur_mem, self._cur_pids = start_mb << 20, start_pids
                joins = "; ".join(f'echo $$ > "{f}"' for f in self.cg.procs_files())
                cmd = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *cmd]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                         start_new_session=True, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                                         pass_fds=fds, bufsize=0)
        except (OSError, ValueError, SandboxError) as e:
            self.destroy()
            raise SandboxError(f"cannot start a warm sandbox cell: {e}") from e
        finally:
            for fd in fds:
                os.close(fd)
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._poll = select.poll()
        self._poll.register(self._out, select.POLLIN)

    def _cg_dir(self, control_file: str) -> Path:
        assert self.cg is not None
        for d in self.cg.dirs:
            if (d / control_file).exists():
                return d
        raise OSError(f"no cgroup directory of this cell has {control_file}")

    # -- lifecycle -----------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> None:
        try:
            hello = self._recv(time.monotonic() + timeout_s)
        except CellDied as e:
            raise SandboxError(f"warm sandbox cell failed to start: {e}") from None
        if hello is None or hello.get("op") != "ready":
            self.kill()
            raise SandboxError(f"warm sandbox cell did not become ready in {timeout_s:.0f}s: {self.diagnostics()}")
        if self.cg is not None:
            self._base_mem = self._read_int("memory.usage_in_bytes", "memory.current")
            self._base_pids = len(self.cg.pids())
            self._oom_count = self._oom_kills()

    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole cell now; the pid namespace dies with the zygote."""
        self.dead = True
        if self.cg is not None:
            self.cg.kill_all()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        if self._oom_fd is not None:
            os.close(self._oom_fd)
            self._oom_fd = None
        if self.cg is not None:
            self.cg.remove()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def diagnostics(self) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 2000))
            tail = self.stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            tail = ""
        return f"exit status {rc}" + (f"; stderr: {tail}" if tail else "")

    # -- channel --------------------------------------------------------------------

    def _send(self, obj: dict[str, Any]) -> None:
        data = marshal.dumps(obj, MARSHAL_VERSION)  # read by the zygote only (cheap to decode there)
        view = memoryview(_HDR.pack(len(data)) + data)
        try:
            while view:
                view = view[os.write(self._in, view):]
        except OSError as e:
            raise CellDied(f"control channel closed ({e.strerror or e})") from None

    def _recv(self, deadline: float) -> dict[str, Any] | None:
        """The next frame (its JSON meta, the raw bytes after it under "_blob"), or None when
        `deadline` passes first. Only JSON and lengths are parsed from the box."""
        while True:
            if len(self._buf) >= _HDR.size:
                (n,) = _HDR.unpack_from(self._buf)
                if n > _MAX_REPLY or n < _HDR.size:
                    raise CellDied("bad control frame length")
                if len(self._buf) >= _HDR.size + n:
                    body = bytes(self._buf[_HDR.size:_HDR.size + n])
                    del self._buf[:_HDR.size + n]
                    (m,) = _HDR.unpack_from(body)
                    try:
                        meta = json.loads(body[_HDR.size:_HDR.size + m])
                    except ValueError:
                        raise CellDied("garbled control frame") from None
                    if not isinstance(meta, dict):
                        raise CellDied("garbled control frame")
                    meta["_blob"] = body[_HDR.size + m:]
                    return meta
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self._poll.poll(max(1, int(left * 1000 + 0.999))):
                continue
            try:
                chunk = os.read(self._out, 1 << 20)
            except OSError as e:
                raise CellDied(f"control channel error ({e.strerror or e})") from None
            if not chunk:
                self.dead = True
                try:
                    self.proc.wait(timeout=1)  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    pass
                raise CellDied(f"the cell died ({self.diagnostics()})")
            self._buf += chunk

    # -- cgroup ---------------------------------------------------------------------

    def _read_int(self, *names: str) -> int:
        assert self.cg is not None
        for name in names:
            for d in self.cg.dirs:
                try:
                    return int((d / name).read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
        return 0

    def _oom_kills(self) -> int:
        """The cgroup's OOM-kill counter (read through a descriptor kept open: once per job)."""
        if self.cg is None:
            return 0
        if self._oom_fd is None:
            fname = "memory.events" if self.cg.version == "v2" else "memory.oom_control"
            try:
                self._oom_fd = os.open(self._cg_dir(fname) / fname, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return 0
        try:
            for line in os.pread(self._oom_fd, 4096, 0).decode().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def tune(self, limits: Limits) -> None:
        """Set the cell's cgroup to this job's memory and pids limits (plus the zygote's own)."""
        if self.cg is None:
            return
        mem = (limits.memory_mb << 20) + self._base_mem
        pids = limits.pids + self._base_pids
        if mem != self._cur_mem:
            self._set_memory(mem)
            self._cur_mem = mem
        if pids != self._cur_pids:
            (self._cg_dir("pids.max") / "pids.max").write_text(str(pids))
            self._cur_pids = pids

    def _set_memory(self, value: int) -> None:
        assert self.cg is not None
        if self.cg.version == "v2":
            (self._cg_dir("memory.max") / "memory.max").write_text(str(value))
            return
        d = self._cg_dir("memory.limit_in_bytes")
        mem, swap = d / "memory.limit_in_bytes", d / "memory.memsw.limit_in_bytes"
        has_swap = swap.exists()
        order = [swap, mem] if has_swap and value > self._cur_mem else [mem, swap]
        for f in order:  # memsw must stay >= mem at every step
            if f is swap and not has_swap:
                continue
            try:
                f.write_text(str(value))
            except OSError:
                if f is mem:
                    raise

    # -- a job ----------------------------------------------------------------------

    def execute(self, req: dict[str, Any], limits: Limits, abort_grace_s: float) -> ExecResult:
        if not self.alive():
            raise NotStarted("cell is not running")
        try:
            self.tune(limits)
        except OSError as e:
            raise NotStarted(f"cannot set the cell's cgroup limits: {e}") from None
        t0 = time.monotonic()
        try:
            self._send(req)
        except CellDied as e:
            raise NotStarted(str(e)) from None
        try:
            reply = self._recv(t0 + limits.timeout_s)
        except CellDied:
            if self._oom_kills() > self._oom_count:
                # The job ran the cell out of memory and the OOM killer took the zygote too
                # (memory in tmpfs files is charged to the cell but to no process): the job's
                # own failure, never an infrastructure error a job could provoke at will.
                self.dead = True
                return ExecResult(128 + _SIGKILL, "", "", oom=True, signal=_SIGKILL,
                                  wall_s=time.monotonic() - t0, backend=BACKEND)
            raise
        timed_out = False
        if reply is None:
            timed_out = True
            try:
                self._send({"op": "abort"})
                reply = self._recv(time.monotonic() + abort_grace_s)
            except CellDied:
                reply = None
            if reply is None:  # the zygote did not comply: the cell goes, the job is a timeout
                self.kill()
                return ExecResult(-_SIGKILL, "", "", timed_out=True, signal=_SIGKILL,
                                  wall_s=time.monotonic() - t0, backend=BACKEND)
        wall = time.monotonic() - t0
        if reply.get("op") != "result":
            raise CellDied(f"unexpected control frame {reply.get('op')!r}")
        if not reply.get("clean", False):
            self.dead = True  # do not reuse: something of the last job may have survived
        if reply.get("error"):
            return ExecResult(-1, "", "", wall_s=wall, backend=BACKEND, infra_error=str(reply["error"]))
        ooms = self._oom_kills()
        oom = ooms > self._oom_count
        self._oom_count = ooms
        blob: bytes = reply["_blob"]
        try:
            n_out, n_err = int(reply["out"]), int(reply["err"])
            spans = [(str(name), int(size)) for name, size in reply.get("files") or ()]
        except (KeyError, TypeError, ValueError):
            raise CellDied("garbled result frame") from None
        if min([n_out, n_err] + [size for _, size in spans]) < 0 or \
                n_out + n_err + sum(size for _, size in spans) != len(blob):
            raise CellDied("result frame lengths do not add up")
        stdout = blob[:n_out].decode("utf-8", "replace")
        stderr = blob[n_out:n_out + n_err].decode("utf-8", "replace")
        files, pos = {}, n_out + n_err
        wanted = set(req.get("collect") or ())
        for name, size in spans:
            if name in wanted:
                files[name] = blob[pos:pos + size]
            pos += size
        sig = None if reply.get("signal") is None else int(reply["signal"])
        timed_out = timed_out or bool(reply.get("aborted"))
        if timed_out:
            code, sig = -_SIGKILL, _SIGKILL  # as the cold path reports a wall-time kill
        elif sig is not None:
            code = 128 + int(sig)
        else:
            code = int(reply["exit"])
        if self.cg is None and "MemoryError" in stderr:
            oom = True
        return ExecResult(
            exit_code=code, stdout=stdout, stderr=stderr, truncated=bool(reply.get("truncated")),
            timed_out=timed_out, oom=oom, signal=sig, wall_s=wall, cpu_s=float(reply.get("cpu_s", 0.0)),
            max_rss_mb=float(reply.get("max_rss_kb", 0)) / 1024, backend=BACKEND,
            files=files,
        )


def as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)
