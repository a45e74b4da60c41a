"""Client of the sandbox service (honing.sandbox.service): `RemoteSandbox` has the methods of
`Sandbox` (exec, aexec, open -> session with exec/write/read/snapshot/restore/close) and
returns the same `ExecResult`s.

Error rules: an `exec` never raises for the service's troubles: unreachable, timed out,
5xx, session gone (404) all come back as `ExecResult(infra_error=...)`, a job that was not
judged and must not be scored. The caller's own mistakes raise `SandboxError`: bad input
(400: negative limits, unknown profile, bad file name), a rejected token (401), a request
over the size cap (413). Non-exec session calls raise `ServiceError` (a SandboxError) when
the service fails, since they have no result to carry the failure.
"""

from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from honing.sandbox.types import ExecResult, Limits, SandboxError

try:
    import httpx
except ImportError as e:  # pragma: no cover - the 'service' extra is not installed
    raise SandboxError("the sandbox service client needs httpx: pip install 'honing[service]'") from e

BACKEND_NAME = "http"
_RESULT_FIELDS = {f.name for f in fields(ExecResult)}
_TIMEOUT_MARGIN_S = 30.0


class ServiceError(SandboxError):
    """The sandbox service could not be reached or failed (not the caller's input)."""


class _Failed(Exception):
    """Internal: the service failed; `exec` turns this into an infra_error result."""


def _b64(data: bytes | str) -> dict[str, str]:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return {"data": base64.b64encode(raw).decode("ascii"), "encoding": "base64"}


def _files_payload(files: Mapping[str, bytes | str] | None, files_dir: str | Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if files_dir is not None:
        root = Path(files_dir)
        if not root.is_dir():
            raise SandboxError(f"files dir does not exist or is not a directory: {root}")
        for dirpath, dirnames, filenames in os.walk(root):  # symlinks are not followed or sent
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for fn in filenames:
                p = Path(dirpath, fn)
                if p.is_file() and not p.is_symlink():
                    out[p.relative_to(root).as_posix()] = _b64(p.read_bytes())
    for name, data in (files or {}).items():
        out[name] = _b64(data)
    return out


def _limits_payload(limits: Limits | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if limits is None:
        return None
    if isinstance(limits, Limits):
        return asdict(limits)
    return {k: v for k, v in dict(limits).items() if v is not None}


def _job_timeout(base: float, limits: dict[str, Any] | None) -> float:
    job = (limits or {}).get("timeout_s")
    if isinstance(job, (int, float)) and not isinstance(job, bool):
        return max(base, float(job) + _TIMEOUT_MARGIN_S)
    return base


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])
    except ValueError:
        pass
    return resp.text[:200] or resp.reason_phrase


def _check(resp: httpx.Response) -> Any:
    """JSON body of a 2xx; SandboxError for the caller's mistakes; _Failed for the service's."""
    code = resp.status_code
    if code == 400:
        raise SandboxError(_detail(resp))
    if code == 401:
        raise SandboxError("the sandbox service rejected the token (401): check $HONING_SANDBOX_TOKEN")
    if code == 413:
        raise SandboxError(f"sandbox request too large (413): {_detail(resp)}")
    if code == 404:
        raise _Failed(f"sandbox service: {_detail(resp)} (404; closed, expired or the service restarted)")
    if not 200 <= code < 300:
        raise _Failed(f"sandbox service answered HTTP {code}: {_detail(resp)}")
    try:
        return resp.json()
    except ValueError:
        raise _Failed(f"sandbox service answered HTTP {code} with a body that is not JSON") from None


def _result(body: Any) -> ExecResult:
    if not isinstance(body, dict):
        raise _Failed("sandbox service answered with a malformed result")
    d = {k: v for k, v in body.items() if k in _RESULT_FIELDS}
    try:
        d["files"] = {k: base64.b64decode(v) for k, v in (d.get("files") or {}).items()}
        return ExecResult(**d)
    except (TypeError, ValueError) as e:
        raise _Failed(f"sandbox service answered with a malformed result: {e}") from None


def _infra(msg: str) -> ExecResult:
    return ExecResult(-1, "", "", backend=BACKEND_NAME, infra_error=msg)


class RemoteSandbox:
    """`Sandbox` over HTTP. `timeout_s` bounds one request, queueing on the service included;
    it is raised to a job's own `timeout_s` + 30 s when that is longer."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 600.0) -> None:
        token = token if token is not None else os.environ.get("HONING_SANDBOX_TOKEN", "")
        if not token.strip():
            raise SandboxError("RemoteSandbox needs the service's token (argument or $HONING_SANDBOX_TOKEN)")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client: httpx.Client | None = None
        self._aclients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}

    # -- transport

    def _timeout(self, seconds: float) -> httpx.Timeout:
        return httpx.Timeout(seconds, connect=min(10.0, seconds))

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout(self.timeout_s))
        return self._client

    def _aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()  # an AsyncClient belongs to one event loop
        for key, (lp, _) in list(self._aclients.items()):
            if lp.is_closed():
                del self._aclients[key]
        hit = self._aclients.get(id(loop))
        if hit is None or hit[0] is not loop:
            client = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=self._timeout(self.timeout_s),
                                       limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
            hit = self._aclients[id(loop)] = (loop, client)
        return hit[1]

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            resp = self.client.request(method, path, json=body, timeout=self._timeout(timeout or self.timeout_s))
        except httpx.HTTPError as e:
            raise _Failed(f"sandbox service at {self.url} unreachable: {type(e).__name__}: {e}") from None
        return _check(resp)

    async def _arequest(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            resp = await self._aclient().request(method, path, json=body, timeout=self._timeout(timeout or self.timeout_s))
        except httpx.HTTPError as e:
            raise _Failed(f"sandbox service at {self.url} unreachable: {type(e).__name__}: {e}") from None
        return _check(resp)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """Non-exec calls: service failures raise ServiceError."""
        try:
            return self._request(method, path, body)
        except _Failed as e:
            raise ServiceError(str(e)) from None

    # -- the Sandbox interface

    @staticmethod
    def _exec_body(cmd: str | Sequence[str], files: Mapping[str, bytes | str] | None, profile: str,
                   limits: Limits | Mapping[str, Any] | None, stdin: bytes | str | None, collect: Sequence[str],
                   files_dir: str | Path | None) -> dict[str, Any]:
        return {"cmd": cmd if isinstance(cmd, str) else list(cmd), "files": _files_payload(files, files_dir),
                "profile": profile, "limits": _limits_payload(limits),
                "stdin": None if stdin is None else _b64(stdin), "collect": list(collect)}

    def exec(self, cmd: str | Sequence[str], files: Mapping[str, bytes | str] | None = None, profile: str = "python",
             limits: Limits | Mapping[str, Any] | None = None, stdin: bytes | str | None = None,
             collect: Sequence[str] = (), files_dir: str | Path | None = None) -> ExecResult:
        body = self._exec_body(cmd, files, profile, limits, stdin, collect, files_dir)
        try:
            return _result(self._request("POST", "/v1/exec", body, _job_timeout(self.timeout_s, body["limits"])))
        except _Failed as e:
            return _infra(str(e))

    async def aexec(self, cmd: str | Sequence[str], files: Mapping[str, bytes | str] | None = None,
                    profile: str = "python", limits: Limits | Mapping[str, Any] | None = None,
                    stdin: bytes | str | None = None, collect: Sequence[str] = (),
                    files_dir: str | Path | None = None) -> ExecResult:
        body = self._exec_body(cmd, files, profile, limits, stdin, collect, files_dir)
        try:
            return _result(await self._arequest("POST", "/v1/exec", body, _job_timeout(self.timeout_s, body["limits"])))
        except _Failed as e:
            return _infra(str(e))

    def open(self, profile: str = "python", files: Mapping[str, bytes | str] | None = None,
             files_dir: str | Path | None = None, limits: Limits | Mapping[str, Any] | None = None) -> "RemoteSession":
        body = {"profile": profile, "files": _files_payload(files, files_dir), "limits": _limits_payload(limits)}
        sid = self._call("POST", "/v1/sessions", body)["session_id"]
        return RemoteSession(self, sid)

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def mechanisms(self) -> dict[str, str]:
        return self.health()["mechanisms"]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._aclients.clear()  # async clients are closed by aclose() on their own loop

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        hit = self._aclients.pop(id(loop), None)
        if hit is not None:
            await hit[1].aclose()
        self.close()

    def __enter__(self) -> "RemoteSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteSession:
    """A service-side workspace across several executions; the methods of `Session`."""

    def __init__(self, sandbox: RemoteSandbox, session_id: str) -> None:
        self.sandbox, self.session_id = sandbox, session_id
        self.closed = False
        self._path = f"/v1/sessions/{session_id}"

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("sandbox session is closed")

    def _exec_body(self, cmd: str | Sequence[str], limits: Limits | Mapping[str, Any] | None,
                   stdin: bytes | str | None, collect: Sequence[str]) -> dict[str, Any]:
        return {"cmd": cmd if isinstance(cmd, str) else list(cmd), "limits": _limits_payload(limits),
                "stdin": None if stdin is None else _b64(stdin), "collect": list(collect)}

    def exec(self, cmd: str | Sequence[str], limits: Limits | Mapping[str, Any] | None = None,
             stdin: bytes | str | None = None, collect: Sequence[str] = ()) -> ExecResult:
        self._check_open()
        body = self._exec_body(cmd, limits, stdin, collect)
        try:
            return _result(self.sandbox._request("POST", f"{self._path}/exec", body,
                                                 _job_timeout(self.sandbox.timeout_s, body["limits"])))
        except _Failed as e:
            return _infra(str(e))

    async def aexec(self, cmd: str | Sequence[str], limits: Limits | Mapping[str, Any] | None = None,
                    stdin: bytes | str | None = None, collect: Sequence[str] = ()) -> ExecResult:
        self._check_open()
        body = self._exec_body(cmd, limits, stdin, collect)
        try:
            return _result(await self.sandbox._arequest("POST", f"{self._path}/exec", body,
                                                        _job_timeout(self.sandbox.timeout_s, body["limits"])))
        except _Failed as e:
            return _infra(str(e))

    def write(self, name: str, data: bytes | str) -> None:
        self._check_open()
        self.sandbox._call("POST", f"{self._path}/write", {"name": name, **_b64(data)})

    def read(self, name: str) -> bytes:
        self._check_open()
        body = self.sandbox._call("POST", f"{self._path}/read", {"name": name})
        return base64.b64decode(body["data"])

    def snapshot(self) -> str:
        self._check_open()
        return self.sandbox._call("POST", f"{self._path}/snapshot")["snapshot_id"]

    def restore(self, snapshot_id: str) -> None:
        self._check_open()
        self.sandbox._call("POST", f"{self._path}/restore", {"snapshot_id": snapshot_id})

    def close(self) -> None:
        """Idempotent; a session the service already dropped (404) or cannot reach counts as closed."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sandbox._request("DELETE", self._path)
        except _Failed:
            pass

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
