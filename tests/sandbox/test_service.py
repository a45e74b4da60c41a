"""Sandbox service mode: the HTTP API (honing.sandbox.service) and its client
(honing.sandbox.client) against a real uvicorn server on 127.0.0.1 and real bwrap boxes."""

from __future__ import annotations

import asyncio
import base64
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from honing.sandbox import Limits, Sandbox, SandboxError  # noqa: E402
from honing.sandbox.client import RemoteSandbox, ServiceError  # noqa: E402
from honing.sandbox.service import create_app, serve  # noqa: E402

TOKEN = "test-token-" + "x" * 20


class CountingBackend:
    """Wraps a real backend and counts the boxes it runs."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner, self.name, self.runs = inner, inner.name, 0

    def mechanisms(self) -> dict[str, str]:
        return self.inner.mechanisms()

    def run(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        self.runs += 1
        return self.inner.run(*args, **kwargs)


class CrashingBackend:
    name = "crashing"

    def mechanisms(self) -> dict[str, str]:
        return {}

    def run(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        raise RuntimeError("box exploded")


class ServerThread:
    """uvicorn on a pre-bound 127.0.0.1 socket in a background thread."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    try:
        sb = Sandbox("bwrap", max_concurrency=1)
        res = sb.exec(["true"], profile="shell")
        sb.close()
        return res.ok
    except SandboxError:
        return False


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap missing or unusable here")


@pytest.fixture(scope="module")
def service():  # noqa: ANN201
    from honing.sandbox.bwrap import BwrapBackend

    backend = CountingBackend(BwrapBackend())
    sandbox = Sandbox(backend, max_concurrency=2)
    with ServerThread(create_app(sandbox, TOKEN)) as srv:
        srv.backend = backend
        yield srv
    sandbox.close()


@pytest.fixture()
def remote(service):  # noqa: ANN001, ANN201
    with RemoteSandbox(service.url, TOKEN, timeout_s=30) as r:
        yield r


def _post(url: str, path: str, body: dict, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


@needs_bwrap
def test_exec_round_trip_matches_local(service, remote) -> None:  # noqa: ANN001
    cmd = ["python3", "-c", "import sys; d=sys.stdin.read(); print(open('a.txt').read(), d); "
                            "open('out.bin','wb').write(bytes([0,255])); sys.exit(3)"]
    kw = dict(files={"a.txt": "hello"}, profile="python", stdin=b"in-data", collect=["out.bin"])
    res = remote.exec(cmd, **kw)
    local = Sandbox("bwrap", max_concurrency=1)
    want = local.exec(cmd, **kw)
    local.close()
    assert res.infra_error is None
    assert (res.exit_code, res.stdout, res.stderr) == (want.exit_code, want.stdout, want.stderr) == (3, "hello in-data\n", "")
    assert res.files == want.files == {"out.bin": b"\x00\xff"}
    assert res.backend == "bwrap" and not res.ok

    text = remote.exec("echo $HOME; exit 0", profile="shell")
    assert text.ok and text.stdout == "/work\n"


@needs_bwrap
def test_bad_or_missing_token_is_401_and_runs_nothing(service) -> None:  # noqa: ANN001
    before = service.backend.runs
    for token in ("wrong", None, TOKEN + "x", TOKEN[:-1]):
        r = _post(service.url, "/v1/exec", {"cmd": ["true"]}, token=token)
        assert r.status_code == 401
        assert r.json() == {"detail": "unauthorized"}
        assert "Traceback" not in r.text
    for header in (TOKEN, "Bearer", f"Basic {TOKEN}", f"Bearer  {TOKEN} x"):  # no/wrong scheme, no credential
        r = httpx.post(service.url + "/v1/exec", json={"cmd": ["true"]}, headers={"Authorization": header})
        assert r.status_code == 401, header
    assert httpx.get(service.url + "/v1/health").status_code == 401
    assert httpx.delete(service.url + "/v1/sessions/whatever").status_code == 401
    assert service.backend.runs == before
    with pytest.raises(SandboxError, match="token"):
        RemoteSandbox(service.url, "nope").exec(["true"])
    assert service.backend.runs == before


@needs_bwrap
def test_health(remote) -> None:  # noqa: ANN001
    h = remote.health()
    assert h["backend"] == "bwrap" and "isolation" in h["mechanisms"]
    assert remote.mechanisms() == h["mechanisms"]


@needs_bwrap
def test_session_flow_with_snapshot_restore(service, remote) -> None:  # noqa: ANN001
    s = remote.open(profile="shell", files={"state.txt": "v1\n"})
    try:
        assert s.exec("cat state.txt").stdout == "v1\n"
        snap = s.snapshot()
        assert s.exec("echo v2 > state.txt; echo made > new.txt").ok
        s.write("bin.dat", b"\x00\x01\x02")
        assert s.read("state.txt") == b"v2\n"
        assert s.exec("wc -c < bin.dat").stdout.strip() == "3"
        s.restore(snap)
        assert s.read("state.txt") == b"v1\n"
        assert s.exec("ls").stdout.split() == ["state.txt"]
        with pytest.raises(SandboxError, match="symlink|cannot read"):
            s.read("missing.txt")
        with pytest.raises(SandboxError, match="relative path"):
            s.write("../escape", "x")
        with pytest.raises(SandboxError, match="snapshot"):
            s.restore("nope")
        # the session's own limits are the base; an exec may override fields
        assert s.exec("sleep 5", limits={"timeout_s": 0.5}).timed_out
    finally:
        s.close()
    s.close()  # idempotent
    # the session is gone on the service: raw 404s, client exec -> infra_error (not a failed job)
    for op, body in (("exec", {"cmd": "true"}), ("read", {"name": "x"}), ("snapshot", None)):
        assert _post(service.url, f"/v1/sessions/{s.session_id}/{op}", body).status_code == 404
    assert httpx.delete(f"{service.url}/v1/sessions/{s.session_id}",
                        headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404
    from honing.sandbox.client import RemoteSession

    ghost = RemoteSession(remote, s.session_id)
    res = ghost.exec("true")
    assert res.infra_error and "404" in res.infra_error and res.exit_code == -1
    with pytest.raises(ServiceError):
        ghost.read("x")


@needs_bwrap
def test_bad_input_is_400_with_the_reason(service, remote) -> None:  # noqa: ANN001
    runs = service.backend.runs
    r = _post(service.url, "/v1/exec", {"cmd": ["true"], "limits": {"timeout_s": -1}})
    assert r.status_code == 400 and "timeout_s" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"cmd": ["true"], "limits": {"memroy_mb": 5}})
    assert r.status_code == 400 and "memroy_mb" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"cmd": ["true"], "profile": "pyhton"})
    assert r.status_code == 400 and "python" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"cmd": ["true"], "files": {"/etc/x": "a"}})
    assert r.status_code == 400 and "relative path" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"cmd": ["true"], "files": {"a": {"data": "!!", "encoding": "base64"}}})
    assert r.status_code == 400 and "base64" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"cmd": [], "profile": "shell"})
    assert r.status_code == 400 and "empty" in r.json()["detail"]
    r = _post(service.url, "/v1/exec", {"command": ["true"]})
    assert r.status_code == 400 and "cmd" in r.json()["detail"]
    r = httpx.post(service.url + "/v1/exec", content=b"{not json", timeout=10,
                   headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert r.status_code == 400
    assert service.backend.runs == runs
    with pytest.raises(SandboxError, match="memory_mb"):
        remote.exec(["true"], limits={"memory_mb": -5})
    with pytest.raises(SandboxError, match="memory_mb"):
        remote.open(profile="shell", limits={"memory_mb": 0})
    with pytest.raises(SandboxError, match="profile"):
        remote.open(profile="nope")
    # a full Limits object goes over as is
    res = remote.exec("sleep 5", profile="shell", limits=Limits(timeout_s=0.5))
    assert res.timed_out and res.infra_error is None


def test_backend_crash_is_200_with_infra_error() -> None:
    from fastapi.testclient import TestClient

    sandbox = Sandbox(CrashingBackend(), max_concurrency=1)
    with TestClient(create_app(sandbox, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}) as tc:
        r = tc.post("/v1/exec", json={"cmd": ["true"], "profile": "shell"})
        assert r.status_code == 200
        body = r.json()
        assert body["infra_error"] == "RuntimeError: box exploded" and body["exit_code"] == -1
    sandbox.close()


def test_body_size_cap_is_413_after_auth() -> None:
    from fastapi.testclient import TestClient

    sandbox = Sandbox(CrashingBackend(), max_concurrency=1)
    with TestClient(create_app(sandbox, TOKEN, max_body_bytes=1024)) as tc:
        big = {"cmd": ["true"], "files": {"a": "x" * 4096}}
        assert tc.post("/v1/exec", json=big).status_code == 401
        r = tc.post("/v1/exec", json=big, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 413
    sandbox.close()


@needs_bwrap
def test_unreachable_or_killed_server_gives_infra_error() -> None:
    from honing.sandbox.bwrap import BwrapBackend

    sandbox = Sandbox(BwrapBackend(), max_concurrency=1)
    srv = ServerThread(create_app(sandbox, TOKEN))
    with srv:
        client = RemoteSandbox(srv.url, TOKEN, timeout_s=5)
        assert client.exec(["true"], profile="shell").ok
        sess = client.open(profile="shell")
    # server stopped: a plain exec, an async exec and a session exec are infra errors, not failures
    res = client.exec(["true"], profile="shell")
    assert res.infra_error and "unreachable" in res.infra_error
    assert res.exit_code == -1 and not res.ok and not res.timed_out
    ares = asyncio.run(client.aexec(["true"], profile="shell"))
    assert ares.infra_error and "unreachable" in ares.infra_error
    assert sess.exec("true").infra_error
    with pytest.raises(ServiceError):
        sess.snapshot()
    sess.close()  # does not raise
    client.close()
    sandbox.close()

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = RemoteSandbox(f"http://127.0.0.1:{port}", TOKEN, timeout_s=5).exec("true")
    assert res.infra_error and res.backend == "http"


@needs_bwrap
def test_concurrent_async_execs(service) -> None:  # noqa: ANN001
    client = RemoteSandbox(service.url, TOKEN, timeout_s=30)

    async def main() -> list:
        try:
            return await asyncio.gather(*[
                client.aexec(["python3", "-c", f"print({i} * {i})"], files={"f.txt": str(i)}) for i in range(8)])
        finally:
            await client.aclose()

    results = asyncio.run(main())
    assert [r.infra_error for r in results] == [None] * 8
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
    assert all(r.ok for r in results)


def test_serve_refuses_remote_host_and_missing_token(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("HONING_SANDBOX_TOKEN", raising=False)
    with pytest.raises(SandboxError, match="token"):
        serve(token=None)
    with pytest.raises(SandboxError, match="token"):
        serve(token="   ")
    monkeypatch.setenv("HONING_SANDBOX_TOKEN", "")
    with pytest.raises(SandboxError, match="token"):
        serve()
    for host in ("0.0.0.0", "::", "", "example.org", "192.168.1.5"):
        with pytest.raises(SandboxError, match="allow_remote"):
            serve(host=host, token="t" * 32)
    with pytest.raises(SandboxError, match="token"):
        create_app(Sandbox(CrashingBackend(), max_concurrency=1), "")
    with pytest.raises(SandboxError, match="token"):
        RemoteSandbox("http://127.0.0.1:1", "")


def test_files_dir_is_uploaded_not_sent_as_a_path(tmp_path: Path) -> None:
    from honing.sandbox.client import _files_payload

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.py").write_text("print(1)")
    (tmp_path / "link").symlink_to("/etc/passwd")
    out = _files_payload({"b.txt": "x"}, tmp_path)
    assert set(out) == {"sub/a.py", "b.txt"}
    assert base64.b64decode(out["sub/a.py"]["data"]) == b"print(1)"


@needs_bwrap
def test_running_job_does_not_block_the_server(service, remote) -> None:  # noqa: ANN001
    done: list = []
    t = threading.Thread(target=lambda: done.append(remote.exec("sleep 1; echo slept", profile="shell")))
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    with RemoteSandbox(service.url, TOKEN, timeout_s=5) as other:
        assert other.health()["backend"] == "bwrap"
    assert time.monotonic() - t0 < 0.5 and not done
    t.join(10)
    assert done[0].stdout == "slept\n"
