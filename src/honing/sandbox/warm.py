"""The warm path: a pool of long-lived sandbox cells that run many small jobs each.

A cold job (honing.sandbox.bwrap) pays for a new bubblewrap box and a new interpreter every
time (~50-80 ms). A `WarmPool` keeps `size` cells instead, each serving one job at a time:

cell     one bubblewrap box started exactly as BwrapBackend starts a cold one (bwrap_argv,
         the same generated /etc files, seccomp filter, no nested user namespaces, box uid
         mapped to an unprivileged host uid when running as root) plus `--as-pid-1`; the
         root, /dev and /proc are read-only, so /work, /tmp and /dev/shm are the only
         writable places, and they are emptied after every job. Its own cgroup (memory,
         pids; set to each job's limits) when the machine has writable cgroups.
zygote   zygote.py, a standalone stdlib-only server run by the system python3 as the box's
         pid 1 (no job can signal it), non-dumpable (no job can reach its descriptors),
         with the common stdlib preloaded. Per job it hands the job to a process it forked
         ahead of time (glibc _Fork: no at-fork hooks), whose stdin/stdout/stderr are a
         memfd and two pipes (never the control channel: every other fd is closed), with
         per-job rlimits, the profile's fixed environment and cwd /work (the same path as a
         cold box, so paths and tracebacks match). Then it kills whatever the job left
         (`kill(-1)` as the namespace's init), reaps, collects the requested files (regular
         files only, no symlinks) and cleans up.

Control channel: the cell's stdin/stdout pipes, owned by this process. Requests are
length-prefixed marshal (version pinned; only the zygote reads them, and it is cheap there);
replies are a length-prefixed JSON header plus raw blobs (stdout, stderr, files) whose
lengths the header gives, so this process parses JSON and lengths only, never marshal from
the box. Whatever a job prints goes to its own pipes and comes back as a blob of the
zygote's reply; it cannot forge a frame.

Wall time is enforced here, on the host: at the deadline the host sends `abort`; the zygote
kills every process of the job and replies with what the job had printed so far
(`timed_out=True`, the cell is kept). If it does not answer within `abort_grace_s`, the host
kills the whole cell (cgroup kill + the bwrap process group; the pid namespace dies with its
init), and the cell is replaced. A cell that dies or breaks the protocol mid-job yields
`ExecResult(infra_error=...)` (never a failed test) and is replaced in the background.

Shared by the jobs of one cell (not reset): the pid counter, POSIX message queues (no
/dev/mqueue to list them), the cell's tmpfs sizes (`Limits.tmpfs_mb` of the pool). Per-job
limits: timeout, cpu, memory and pids (cgroup re-tuned when they change), file size, open
files, output bytes. The isolation boundary is a cold box's: it shares the host kernel.

The zygote runs as `python3 -s` (not -I -S): -I implies -E, which would drop the profile's
PYTHONHASHSEED=0 (the box's environment is bwrap --clearenv + the profile's, so honouring
it is safe), and jobs need what `site` gives a cold `python3` (exit(), dist-packages).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import marshal
import queue
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from honing.sandbox.bwrap import BwrapBackend
from honing.sandbox.profiles import get_profile
from honing.sandbox.types import ExecResult, Limits, SandboxError
from honing.sandbox.workspace import safe_relpath
from honing.sandbox.cell import (BACKEND, MARSHAL_VERSION, MODULE_RE, ZYGOTE_PATH, Cell, CellDied, Files,
                                 NotStarted, Spawner, as_bytes)

_OPEN_POOLS: "weakref.WeakSet[WarmPool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    """Cells die with this process anyway (bwrap --die-with-parent); closing also removes
    their cgroups and directories."""
    for pool in list(_OPEN_POOLS):
        try:
            pool.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class WarmPool:
    """`size` warm sandbox cells; `run_python`/`run` execute one job on a free cell (callers
    wait for one: backpressure), `arun_python`/`arun` are the asyncio forms (at most `size`
    in flight per event loop). Thread-safe. Use as a context manager or call `close()`."""

    def __init__(self, size: int = 2, profile: str = "python", limits: Limits | None = None,
                 use_cgroups: bool = True, start_timeout_s: float = 30.0, abort_grace_s: float = 2.0,
                 preload: Sequence[str] | None = None) -> None:
        """`preload`: stdlib modules each cell imports once (default: zygote.PRELOAD, what
        unit-test style jobs use). More modules make their import free for jobs but every
        job a little slower (bigger heap to fork and tear down)."""
        if size < 1:
            raise SandboxError(f"warm pool size must be >= 1, got {size}")
        if preload is not None:
            preload = list(preload)
            bad = [m for m in preload if not MODULE_RE.fullmatch(m)]
            if bad:
                raise SandboxError(f"warm pool preload: not module names: {bad}")
        self.preload = preload
        if not ZYGOTE_PATH.is_file():
            raise SandboxError(f"warm sandbox zygote is missing: {ZYGOTE_PATH}")
        self.size = size
        self.profile = get_profile(profile)
        self.limits = limits or Limits()
        self.backend = BwrapBackend(use_cgroups=use_cgroups)  # its probed configuration, not its run()
        self.bwrap = self.backend.bwrap
        self.cgroup_version = self.backend.cgroup_version
        self.start_timeout_s = start_timeout_s
        self.abort_grace_s = abort_grace_s
        self.stats = {"jobs": 0, "cells_started": 0, "cells_replaced": 0, "infra_errors": 0}
        self._idle: queue.Queue[Cell | None] = queue.Queue()
        self._live: set[Cell] = set()
        self._replacers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._spawner = Spawner()
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="warm-pool")
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
        try:
            cells = [self._spawn() for _ in range(size)]
            for cell in cells:
                cell.wait_ready(self.start_timeout_s)
        except BaseException:
            self.close()
            raise
        for cell in cells:
            self._idle.put(cell)
        _OPEN_POOLS.add(self)

    # -- public API -------------------------------------------------------------------

    def run_python(self, code: str, files: Files | None = None, limits: Limits | None = None,
                   collect: Sequence[str] = (), stdin: bytes | str | None = None,
                   args: Sequence[str] = ()) -> ExecResult:
        """Run Python source as `python3 /work/main.py [args]` would, in a fresh __main__."""
        if not isinstance(code, str):
            raise SandboxError("run_python needs the source code as a str")
        return self._execute({"mode": "python", "code": code, "args": [str(a) for a in args]},
                             files, limits, collect, stdin)

    def run(self, argv: Sequence[str], files: Files | None = None, limits: Limits | None = None,
            collect: Sequence[str] = (), stdin: bytes | str | None = None) -> ExecResult:
        """Exec `argv` (argv[0] looked up in the profile's PATH) in /work of a warm cell."""
        if isinstance(argv, str) or not argv:
            raise SandboxError("warm run needs a non-empty argv list (use ['/bin/bash', '-c', cmd] for a shell)")
        return self._execute({"mode": "argv", "argv": [str(a) for a in argv]}, files, limits, collect, stdin)

    async def arun_python(self, code: str, **kwargs: Any) -> ExecResult:
        return await self._async(functools.partial(self.run_python, code, **kwargs))

    async def arun(self, argv: Sequence[str], **kwargs: Any) -> ExecResult:
        return await self._async(functools.partial(self.run, argv, **kwargs))

    def close(self) -> None:
        """Kill every cell now. Jobs in flight end with an infra_error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        for cell in live:
            cell.kill()
        while True:  # idle cells: destroy; busy ones are destroyed by the thread using them
            try:
                cell = self._idle.get_nowait()
            except queue.Empty:
                break
            if cell is not None:
                self._forget(cell)
        deadline = time.monotonic() + 10  # replacements in flight destroy what they started
        while time.monotonic() < deadline:
            with self._lock:
                replacers = list(self._replacers)
            if not replacers:
                break
            replacers[0].join(timeout=max(0.0, deadline - time.monotonic()))
        for _ in range(self.size * 4):  # wake callers blocked on the queue: they see "closed"
            self._idle.put(None)
        self._spawner.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "WarmPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mechanisms(self) -> dict[str, str]:
        cg = f"cgroup {self.cgroup_version} (one per cell, set to the job's limits)" if self.cgroup_version else None
        return {
            **self.backend.mechanisms(),
            "backend": "warm pool: long-lived cold-identical boxes, the zygote is pid 1, one fork per job",
            "memory": cg or "RLIMIT_AS per job",
            "pids": cg or "RLIMIT_NPROC per job",
            "wall_time": "host deadline: abort over the control channel, else the cell is killed and replaced",
            "between_jobs": "every process killed; /work, /tmp, /dev/shm emptied; SysV IPC removed; root read-only",
        }

    # -- internals --------------------------------------------------------------------

    async def _async(self, fn: Callable[[], ExecResult]) -> ExecResult:
        loop = asyncio.get_running_loop()
        with self._lock:
            sem = self._sems.get(loop)
            if sem is None:
                sem = self._sems[loop] = asyncio.Semaphore(self.size)
        async with sem:
            return await loop.run_in_executor(self._executor, fn)

    def _spawn(self) -> Cell:
        """Start a cell (not yet ready) from the spawner thread, and track it."""
        cell: Cell = self._spawner.call(lambda: Cell(self.backend, self.profile, self.limits, self.preload))
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._live.add(cell)
                self.stats["cells_started"] += 1
        if closed:
            cell.destroy()
            raise SandboxError("warm pool is closed")
        return cell

    def _fresh_cell(self) -> Cell:
        cell = self._spawn()
        try:
            cell.wait_ready(self.start_timeout_s)
        except BaseException:
            self._forget(cell)
            raise
        return cell

    def _forget(self, cell: Cell) -> None:
        with self._lock:
            self._live.discard(cell)
        cell.destroy()

    def _replace(self, cell: Cell) -> None:
        """Retire a cell; a new one takes its slot in the background (None if that fails:
        the next caller of that slot tries again, synchronously)."""
        cell.kill()
        with self._lock:
            self.stats["cells_replaced"] += 1

        def work() -> None:
            try:
                self._forget(cell)
                new: Cell | None = None
                if not self._closed:
                    try:
                        new = self._fresh_cell()
                    except (SandboxError, OSError):
                        new = None
                if new is None:
                    self._idle.put(None)
                else:
                    self._release(new)  # destroyed instead if the pool closed meanwhile
            finally:
                with self._lock:
                    self._replacers.discard(threading.current_thread())

        t = threading.Thread(target=work, name="warm-replace", daemon=True)
        with self._lock:
            self._replacers.add(t)
        t.start()

    def _release(self, cell: Cell) -> None:
        with self._lock:
            closed = self._closed
        if closed:
            self._forget(cell)
        else:
            self._idle.put(cell)

    def _acquire(self) -> Cell:
        cell = self._idle.get()
        if self._closed:
            if cell is not None:
                self._forget(cell)
            self._idle.put(None)
            raise SandboxError("warm pool is closed")
        if cell is not None and cell.alive():
            return cell
        if cell is not None:
            self._forget(cell)
        try:
            return self._fresh_cell()
        except BaseException:
            self._idle.put(None)  # keep the slot
            raise

    def _execute(self, req: dict[str, Any], files: Files | None, limits: Limits | None,
                 collect: Sequence[str], stdin: bytes | str | None) -> ExecResult:
        lim = limits or self.limits
        limits_d = {"cpu_s": lim.cpu_s, "memory_mb": lim.memory_mb, "pids": lim.pids,
                    "file_size_mb": lim.file_size_mb, "open_files": lim.open_files,
                    "output_bytes": lim.output_bytes}
        job = {**req, "limits": limits_d, "stdin": None if stdin is None else as_bytes(stdin)}
        req = {"op": "run", "job": marshal.dumps(job, MARSHAL_VERSION), "limits": limits_d,
               "files": {safe_relpath(k): as_bytes(v) for k, v in (files or {}).items()},
               "collect": [safe_relpath(c) for c in collect]}
        for attempt in range(2):
            try:
                cell = self._acquire()
            except SandboxError as e:
                return self._infra(f"no warm sandbox cell: {e}")
            try:
                res = cell.execute(req, lim, self.abort_grace_s)
            except NotStarted as e:
                self._replace(cell)
                if attempt == 0:
                    continue  # the job never reached a cell: try once more on a fresh one
                return self._infra(f"warm sandbox cell unusable: {e}")
            except CellDied as e:
                self._replace(cell)
                return self._infra(f"warm sandbox cell broke mid-job: {e}")
            except BaseException:
                self._replace(cell)
                raise
            if cell.dead:
                self._replace(cell)
            else:
                self._release(cell)
            with self._lock:
                self.stats["jobs"] += 1
            if res.infra_error:
                with self._lock:
                    self.stats["infra_errors"] += 1
            return res
        return self._infra("unreachable")  # pragma: no cover

    def _infra(self, msg: str) -> ExecResult:
        with self._lock:
            self.stats["infra_errors"] += 1
        if self._closed:
            msg += " (pool closed)"
        return ExecResult(-1, "", "", backend=BACKEND, infra_error=msg)
