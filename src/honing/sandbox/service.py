"""Service mode: the sandbox behind an authenticated HTTP API, so that rollout workers on
other processes (or, explicitly allowed, other hosts) can run boxes on this one.

    POST   /v1/exec                      one-shot job -> ExecResult JSON
    POST   /v1/sessions                  {profile, files, limits} -> {session_id}
    POST   /v1/sessions/{id}/exec        {cmd, limits, stdin, collect} -> ExecResult JSON
    POST   /v1/sessions/{id}/write       {name, data, encoding} -> {ok}
    POST   /v1/sessions/{id}/read        {name} -> {name, data (base64), encoding}
    POST   /v1/sessions/{id}/snapshot    -> {snapshot_id}
    POST   /v1/sessions/{id}/restore     {snapshot_id} -> {ok}
    DELETE /v1/sessions/{id}             -> {ok}
    GET    /v1/health                    -> {backend, mechanisms, ...}

Every request needs `Authorization: Bearer <token>` (else 401, nothing else said). File
contents travel as {"data": ..., "encoding": "base64" | "text"} (a bare string is text);
files in results are base64. Bad input is a 400 naming the problem; a sandbox that broke
is still a 200 whose `infra_error` is set (a job result, not an HTTP failure); 500 means a
bug in this server. A host path (`files_dir`) is never accepted over HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from typing import Any, Literal, Optional, Union

from honing.sandbox.core import Sandbox, Session
from honing.sandbox.types import ExecResult, Limits, SandboxError

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict
except ImportError as e:  # pragma: no cover - the 'service' extra is not installed
    raise SandboxError("sandbox service mode needs fastapi and uvicorn: pip install 'honing[service]'") from e

log = logging.getLogger("honing.sandbox.service")

TOKEN_ENV = "HONING_SANDBOX_TOKEN"
MAX_BODY_BYTES = 32 << 20
LIMIT_FIELDS = tuple(f.name for f in fields(Limits))


# ---------------------------------------------------------------- request bodies

class FileData(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: str
    encoding: Literal["base64", "text", "utf-8"] = "text"


Content = Union[str, FileData]


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: Union[str, list[str]]
    files: dict[str, Content] = {}
    profile: str = "python"
    limits: Optional[dict[str, Any]] = None
    stdin: Optional[Content] = None
    collect: list[str] = []


class OpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = "python"
    files: dict[str, Content] = {}
    limits: Optional[dict[str, Any]] = None


class SessionExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: Union[str, list[str]]
    limits: Optional[dict[str, Any]] = None
    stdin: Optional[Content] = None
    collect: list[str] = []


class WriteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    data: str
    encoding: Literal["base64", "text", "utf-8"] = "text"


class ReadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot_id: str


# ---------------------------------------------------------------- conversions

def decode(content: Content | None, what: str) -> bytes | None:
    if content is None:
        return None
    if isinstance(content, str):
        return content.encode()
    if content.encoding == "base64":
        try:
            return base64.b64decode(content.data, validate=True)
        except (binascii.Error, ValueError):
            raise SandboxError(f"{what} is not valid base64") from None
    return content.data.encode()


def decode_files(files: dict[str, Content]) -> dict[str, bytes]:
    return {name: decode(c, f"file {name!r}") for name, c in files.items()}  # type: ignore[misc]


def make_limits(base: Limits, raw: dict[str, Any] | None) -> Limits:
    """`raw` overrides fields of `base`; unknown names and non-numbers are refused by name."""
    if not raw:
        return base
    unknown = sorted(set(raw) - set(LIMIT_FIELDS))
    if unknown:
        raise SandboxError(f"unknown sandbox limit(s) {', '.join(map(repr, unknown))}; known: {', '.join(LIMIT_FIELDS)}")
    for k, v in raw.items():
        if isinstance(v, bool):
            raise SandboxError(f"sandbox limit '{k}' must be a positive number, got {v!r}")
    return base.replace(**raw)  # Limits validates: "sandbox limit 'timeout_s' must be a positive number"


def result_json(res: ExecResult) -> dict[str, Any]:
    d = asdict(res)
    d["files"] = {k: base64.b64encode(v).decode("ascii") for k, v in res.files.items()}
    return d


def _infra(sandbox: Sandbox, msg: str) -> dict[str, Any]:
    return result_json(ExecResult(-1, "", "", backend=sandbox.backend.name, infra_error=msg))


# ---------------------------------------------------------------- auth and body cap

class _Guard:
    """Outermost check of every HTTP request: bearer token first (401, nothing else said),
    then the body size (413). The body is buffered here, so the app never sees more."""

    def __init__(self, app: Any, token: str, max_body_bytes: int) -> None:
        self.app, self.token, self.max_body = app, token.encode(), max_body_bytes

    def _authorized(self, scope: dict) -> bool:
        for k, v in scope.get("headers", ()):
            if k == b"authorization":
                scheme, _, cred = v.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), self.token)
        return False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        if not self._authorized(scope):
            return await _reply(send, 401, {"detail": "unauthorized"}, [(b"www-authenticate", b"Bearer")])
        too_big = {"detail": f"request body larger than {self.max_body} bytes"}
        for k, v in scope.get("headers", ()):
            if k == b"content-length" and v.isdigit() and int(v) > self.max_body:
                return await _reply(send, 413, too_big)
        chunks, total = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            total += len(chunk)
            if total > self.max_body:
                return await _reply(send, 413, too_big)
            chunks.append(chunk)
            if not msg.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send: Any, status: int, payload: dict, headers: list | None = None) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------- sessions

class _Entry:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.lock = asyncio.Lock()  # one operation at a time per session
        self.last_used = time.monotonic()


class _State:
    def __init__(self, sandbox: Sandbox, max_sessions: int, session_ttl_s: float) -> None:
        self.sandbox = sandbox
        self.sessions: dict[str, _Entry] = {}
        self.max_sessions, self.ttl = max_sessions, session_ttl_s
        # session work (file copies, session boxes) runs here; one-shot jobs in the sandbox's pool
        self.pool = ThreadPoolExecutor(sandbox.max_concurrency + 4, thread_name_prefix="sandbox-svc")
        self._boxes: asyncio.Semaphore | None = None

    @property
    def boxes(self) -> asyncio.Semaphore:
        """Bounds running boxes, one-shot and session ones together, to max_concurrency."""
        if self._boxes is None:
            self._boxes = asyncio.Semaphore(self.sandbox.max_concurrency)
        return self._boxes

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def get(self, sid: str) -> _Entry:
        entry = self.sessions.get(sid)
        if entry is None:
            raise _NotFound()
        entry.last_used = time.monotonic()
        return entry

    async def reap(self) -> None:
        """Close sessions idle for longer than the TTL (a client that died without DELETE)."""
        cutoff = time.monotonic() - self.ttl
        for sid, e in list(self.sessions.items()):
            if e.last_used < cutoff and not e.lock.locked():
                self.sessions.pop(sid, None)
                await self.call(e.session.close)

    def close_all(self) -> None:
        for e in self.sessions.values():
            e.session.close()
        self.sessions.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)


class _NotFound(Exception):
    pass


class _TooMany(Exception):
    pass


# ---------------------------------------------------------------- the app

def create_app(sandbox: Sandbox, token: str, max_body_bytes: int = MAX_BODY_BYTES,
               max_sessions: int = 256, session_ttl_s: float = 3600.0) -> FastAPI:
    """The service over `sandbox`. The caller owns `sandbox` (and closes it); sessions left
    open are closed when the app shuts down, or after `session_ttl_s` without use."""
    if not token or not token.strip():
        raise SandboxError("sandbox service needs a non-empty token")
    state = _State(sandbox, max_sessions, session_ttl_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        async def reaper() -> None:
            while True:
                await asyncio.sleep(min(60.0, max(1.0, session_ttl_s / 4)))
                await state.reap()

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            state.close_all()

    app = FastAPI(title="honing sandbox", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sandbox_state = state

    @app.exception_handler(SandboxError)
    async def _bad_input(request: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:5]:  # location and message only: never echo the input back
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
        return JSONResponse({"detail": "invalid request: " + "; ".join(parts)}, status_code=400)

    @app.exception_handler(_NotFound)
    async def _not_found(request: Request, exc: _NotFound) -> JSONResponse:
        return JSONResponse({"detail": "unknown sandbox session"}, status_code=404)

    @app.exception_handler(_TooMany)
    async def _too_many(request: Request, exc: _TooMany) -> JSONResponse:
        return JSONResponse({"detail": f"too many open sandbox sessions (max {max_sessions})"}, status_code=429)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("sandbox service: unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "backend": sandbox.backend.name, "mechanisms": sandbox.mechanisms(),
                "max_concurrency": sandbox.max_concurrency, "sessions": len(state.sessions)}

    @app.post("/v1/exec")
    async def exec_(req: ExecRequest) -> dict[str, Any]:
        files = decode_files(req.files)
        stdin = decode(req.stdin, "stdin")
        limits = make_limits(sandbox.limits, req.limits)
        async with state.boxes:
            try:
                res = await sandbox.aexec(req.cmd, files=files, profile=req.profile, limits=limits,
                                          stdin=stdin, collect=req.collect)
            except OSError as e:  # the host side broke (disk full, sandbox dir gone): not the job's fault
                return _infra(sandbox, f"{type(e).__name__}: {e}")
        return result_json(res)

    @app.post("/v1/sessions")
    async def open_session(req: OpenRequest) -> dict[str, str]:
        await state.reap()
        if len(state.sessions) >= max_sessions:
            raise _TooMany()
        files = decode_files(req.files)
        limits = make_limits(sandbox.limits, req.limits)
        session = await state.call(lambda: sandbox.open(req.profile, files=files, limits=limits))
        sid = secrets.token_hex(16)
        state.sessions[sid] = _Entry(session)
        return {"session_id": sid}

    @app.post("/v1/sessions/{sid}/exec")
    async def session_exec(sid: str, req: SessionExecRequest) -> dict[str, Any]:
        entry = state.get(sid)
        stdin = decode(req.stdin, "stdin")
        limits = make_limits(entry.session.limits, req.limits)
        async with entry.lock, state.boxes:
            try:
                res = await state.call(lambda: entry.session.exec(req.cmd, limits=limits, stdin=stdin,
                                                                  collect=req.collect))
            except OSError as e:
                return _infra(sandbox, f"{type(e).__name__}: {e}")
        entry.last_used = time.monotonic()
        return result_json(res)

    @app.post("/v1/sessions/{sid}/write")
    async def session_write(sid: str, req: WriteRequest) -> dict[str, bool]:
        entry = state.get(sid)
        data = decode(FileData(data=req.data, encoding=req.encoding), f"file {req.name!r}")
        async with entry.lock:
            await state.call(entry.session.write, req.name, data)
        return {"ok": True}

    @app.post("/v1/sessions/{sid}/read")
    async def session_read(sid: str, req: ReadRequest) -> dict[str, str]:
        entry = state.get(sid)
        async with entry.lock:
            data = await state.call(entry.session.read, req.name)
        return {"name": req.name, "data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}

    @app.post("/v1/sessions/{sid}/snapshot")
    async def session_snapshot(sid: str) -> dict[str, str]:
        entry = state.get(sid)
        async with entry.lock:
            snap = await state.call(entry.session.snapshot)
        return {"snapshot_id": snap}

    @app.post("/v1/sessions/{sid}/restore")
    async def session_restore(sid: str, req: RestoreRequest) -> dict[str, bool]:
        entry = state.get(sid)
        async with entry.lock:
            await state.call(entry.session.restore, req.snapshot_id)
        return {"ok": True}

    @app.delete("/v1/sessions/{sid}")
    async def session_close(sid: str) -> dict[str, bool]:
        entry = state.get(sid)
        async with entry.lock:
            if state.sessions.pop(sid, None) is None:
                raise _NotFound()  # closed by a concurrent DELETE while we waited
            await state.call(entry.session.close)
        return {"ok": True}

    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes)
    return app


# ---------------------------------------------------------------- serve

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or "": might be any interface


def serve(host: str = "127.0.0.1", port: int = 8787, token: str | None = None, backend: str = "bwrap",
          max_concurrency: int | None = None, allow_remote: bool = False, log_level: str = "info") -> None:
    """Run the service in the foreground until interrupted. The token comes from `token` or
    $HONING_SANDBOX_TOKEN; there is no unauthenticated mode. Binding anything but loopback
    needs `allow_remote=True` (then put TLS in front: the token travels in clear)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    if not token.strip():
        raise SandboxError(f"sandbox service needs a token: pass one or set ${TOKEN_ENV} "
                           "(e.g. `export HONING_SANDBOX_TOKEN=$(openssl rand -hex 32)`)")
    if not allow_remote and not is_loopback(host):
        raise SandboxError(f"refusing to serve the sandbox on non-loopback host {host!r}: it runs code for "
                           "anyone holding the token; pass allow_remote=True (--allow-remote) to do it anyway")
    import uvicorn

    sandbox = Sandbox(backend, max_concurrency=max_concurrency)
    try:
        app = create_app(sandbox, token)
        log.warning("honing sandbox service on http://%s:%d (backend %s, %d boxes at once)",
                    host, port, sandbox.backend.name, sandbox.max_concurrency)
        uvicorn.run(app, host=host, port=port, log_level=log_level)  # type: ignore[arg-type]
    finally:
        sandbox.close()
