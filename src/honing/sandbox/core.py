"""The Sandbox facade: one-shot `exec`, multi-turn `Session`s with snapshot/restore, and a
bounded async API over any backend. Backend failures come back as `infra_error` results."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from honing.sandbox.profiles import Profile, get_profile
from honing.sandbox.types import ExecResult, Limits, SandboxError
from honing.sandbox.workspace import Workspace

Files = Mapping[str, "bytes | str"]


class Backend(Protocol):
    name: str

    def mechanisms(self) -> dict[str, str]: ...

    def run(self, argv: Sequence[str], workspace: Path, profile: Profile, limits: Limits,
            stdin: bytes | None = None, extra_ro: Sequence[tuple[str, str]] = ()) -> ExecResult: ...


BACKENDS = ("bwrap", "local", "faulty:<inner>[:fail=P,hang=P,hang_s=S,seed=N]")


def make_backend(name: str) -> Backend:
    if name.startswith("faulty:"):  # fault injection for tests (honing.sandbox.faulty)
        from honing.sandbox.faulty import FaultyBackend, parse_faulty

        inner, opts = parse_faulty(name)
        return FaultyBackend(make_backend(inner), **opts)
    if name == "bwrap":
        from honing.sandbox.bwrap import BwrapBackend

        return BwrapBackend()
    if name == "local":
        from honing.sandbox.local import LocalBackend

        return LocalBackend()
    raise SandboxError(f"unknown sandbox backend '{name}' (known: {', '.join(BACKENDS)})")


def _argv(cmd: str | Sequence[str]) -> list[str]:
    if isinstance(cmd, str):
        return ["/bin/bash", "-c", cmd]
    if not cmd:
        raise SandboxError("sandbox command is empty")
    return list(cmd)


def _guarded(backend: Backend, argv: list[str], ws: Workspace, profile: Profile, limits: Limits,
             stdin: bytes | None, collect: Sequence[str]) -> ExecResult:
    try:
        res = backend.run(argv, ws.path, profile, limits, stdin)
    except SandboxError:
        raise
    except Exception as e:  # noqa: BLE001 - the sandbox broke: not the candidate's fault
        return ExecResult(-1, "", "", backend=backend.name, infra_error=f"{type(e).__name__}: {e}")
    for name in collect:
        try:
            res.files[name] = ws.read(name)
        except SandboxError:
            pass  # missing or a symlink: the grader simply does not get it
    return res


class Session:
    """A workspace that lives across several executions (multi-turn work). Each `exec` is a
    fresh box over the same files; `snapshot`/`restore` save and bring back the workspace."""

    def __init__(self, sandbox: "Sandbox", profile: Profile, ws: Workspace, limits: Limits) -> None:
        self.sandbox, self.profile, self.ws, self.limits = sandbox, profile, ws, limits
        self.closed = False

    def exec(self, cmd: str | Sequence[str], limits: Limits | None = None, stdin: bytes | None = None,
             collect: Sequence[str] = ()) -> ExecResult:
        self._check()
        return _guarded(self.sandbox.backend, _argv(cmd), self.ws, self.profile, limits or self.limits, stdin, collect)

    def write(self, name: str, data: bytes | str) -> None:
        self._check()
        self.ws.write(name, data)

    def read(self, name: str) -> bytes:
        self._check()
        return self.ws.read(name)

    def snapshot(self) -> str:
        self._check()
        return self.ws.snapshot()

    def restore(self, snapshot_id: str) -> None:
        self._check()
        self.ws.restore(snapshot_id)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.ws.close()

    def _check(self) -> None:
        if self.closed:
            raise SandboxError("sandbox session is closed")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandbox:
    """`exec` runs one command in a fresh box; `aexec` is the async form, bounded to
    `max_concurrency` running boxes (callers beyond that wait: backpressure, not memory)."""

    def __init__(self, backend: str | Backend = "bwrap", limits: Limits | None = None,
                 max_concurrency: int | None = None) -> None:
        self.backend = make_backend(backend) if isinstance(backend, str) else backend
        self.limits = limits or Limits()
        self.max_concurrency = max_concurrency or max(1, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="sandbox")
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def exec(self, cmd: str | Sequence[str], files: Files | None = None, profile: str = "python",
             limits: Limits | None = None, stdin: bytes | None = None, collect: Sequence[str] = (),
             files_dir: str | Path | None = None) -> ExecResult:
        prof = get_profile(profile)
        try:
            ws = Workspace(files, files_dir)
        except OSError as e:  # e.g. a full disk on the host: the job was not judged
            return ExecResult(-1, "", "", backend=self.backend.name, infra_error=f"workspace: {e}")
        try:
            return _guarded(self.backend, _argv(cmd), ws, prof, limits or self.limits, stdin, collect)
        finally:
            ws.close()

    async def aexec(self, cmd: str | Sequence[str], **kwargs: object) -> ExecResult:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:  # a semaphore belongs to one event loop
            self._sem, self._sem_loop = asyncio.Semaphore(self.max_concurrency), loop
        async with self._sem:
            return await loop.run_in_executor(self._pool, lambda: self.exec(cmd, **kwargs))  # type: ignore[arg-type]

    def open(self, profile: str = "python", files: Files | None = None, files_dir: str | Path | None = None,
             limits: Limits | None = None) -> Session:
        return Session(self, get_profile(profile), Workspace(files, files_dir), limits or self.limits)

    def mechanisms(self) -> dict[str, str]:
        return self.backend.mechanisms()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
