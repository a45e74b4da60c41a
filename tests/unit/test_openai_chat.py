"""OpenAIChat against a real FastAPI+uvicorn server on 127.0.0.1 speaking /v1/chat/completions."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from honing.engine.chat import make_chat  # noqa: E402
from honing.engine.openai import ChatHTTPError, ChatTimeout, OpenAIChat, chat_url  # noqa: E402
from honing.errors import ConfigError  # noqa: E402

KEY = "sk-test-" + "k" * 24
KEY_ENV = "HONING_TEST_CHAT_KEY"


class FakeOpenAI:
    """Scripted /v1/chat/completions: each request pops (status, content or body, delay_s)."""

    def __init__(self) -> None:
        self.script: list[tuple[int, object, float]] = []
        self.requests: list[dict] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def completions(req: Request) -> JSONResponse:
            body = await req.json()
            self.requests.append({"auth": req.headers.get("authorization"), "json": body})
            if req.headers.get("authorization") != f"Bearer {KEY}":
                return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
            status, payload, delay = self.script.pop(0) if self.script else (200, "default reply", 0.0)
            await asyncio.sleep(delay)
            if status == 200 and isinstance(payload, str):
                payload = {"id": "x", "object": "chat.completion", "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": payload}}]}
            headers = {"retry-after": "0"} if status == 429 else None
            return JSONResponse(payload, status_code=status, headers=headers)


class ServerThread:
    """uvicorn on a pre-bound 127.0.0.1 socket in a background thread."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def server():  # noqa: ANN201
    fake = FakeOpenAI()
    with ServerThread(fake.app) as srv:
        srv.fake = fake
        yield srv


@pytest.fixture()
def fake(server, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv(KEY_ENV, KEY)
    server.fake.script.clear()
    server.fake.requests.clear()
    return server.fake


def client(server, **kw) -> OpenAIChat:  # noqa: ANN001
    return OpenAIChat(server.url, "judge-model", api_key_env=KEY_ENV, backoff_s=0.01, **kw)


def test_sends_openai_json_and_bearer_key(server, fake) -> None:  # noqa: ANN001
    fake.script.append((200, "hello there", 0.0))
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert client(server).chat(msgs, max_new_tokens=17, temperature=0.5, seed=3) == "hello there"
    [req] = fake.requests
    assert req["auth"] == f"Bearer {KEY}"
    assert req["json"] == {"model": "judge-model", "messages": msgs, "max_tokens": 17, "temperature": 0.5, "seed": 3}


def test_retries_500_and_429_then_succeeds(server, fake) -> None:  # noqa: ANN001
    fake.script += [(500, {"error": "boom"}, 0.0), (429, {"error": "slow down"}, 0.0), (200, "finally", 0.0)]
    assert client(server, max_retries=3).chat([{"role": "user", "content": "x"}]) == "finally"
    assert len(fake.requests) == 3


def test_gives_up_after_max_retries_naming_url_and_status(server, fake) -> None:  # noqa: ANN001
    fake.script += [(503, {"error": "down"}, 0.0)] * 5
    with pytest.raises(ChatHTTPError) as e:
        client(server, max_retries=2).chat([{"role": "user", "content": "x"}])
    msg = str(e.value)
    assert "/v1/chat/completions" in msg and server.url in msg and "HTTP 503" in msg and "3 attempts" in msg
    assert KEY not in msg
    assert len(fake.requests) == 3


def test_client_errors_are_not_retried_and_name_the_key_env(server, fake, monkeypatch) -> None:  # noqa: ANN001
    fake.script.append((400, {"error": "bad request"}, 0.0))
    with pytest.raises(ChatHTTPError, match="HTTP 400"):
        client(server).chat([{"role": "user", "content": "x"}])
    assert len(fake.requests) == 1
    monkeypatch.setenv(KEY_ENV, "wrong-key")
    with pytest.raises(ChatHTTPError, match=f"HTTP 401.*{KEY_ENV}"):
        client(server).chat([{"role": "user", "content": "x"}])
    assert len(fake.requests) == 2


def test_timeout_raises_chat_timeout_without_retrying(server, fake) -> None:  # noqa: ANN001
    fake.script.append((200, "too late", 1.5))
    t0 = time.monotonic()
    with pytest.raises(ChatTimeout, match="no answer within 0.3s"):
        client(server, timeout_s=0.3, max_retries=3).chat([{"role": "user", "content": "x"}])
    assert time.monotonic() - t0 < 1.2 and len(fake.requests) == 1


def test_malformed_response_is_an_error(server, fake) -> None:  # noqa: ANN001
    fake.script.append((200, {"choices": []}, 0.0))
    with pytest.raises(ChatHTTPError, match="unexpected response"):
        client(server).chat([{"role": "user", "content": "x"}])


def test_connection_refused_is_retried_then_named() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    chat = OpenAIChat(f"http://127.0.0.1:{port}/v1/", "m", api_key_env=KEY_ENV, max_retries=1, backoff_s=0.01)
    with pytest.raises(ChatHTTPError, match=rf"127.0.0.1:{port}/v1/chat/completions: gave up after 2 attempts.*connection"):
        chat.chat([{"role": "user", "content": "x"}])


def test_config_errors_and_spec_parsing(server, fake, monkeypatch) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="http:// or https://"):
        OpenAIChat("localhost:8000", "m")
    with pytest.raises(ConfigError, match="model name"):
        make_chat("openai:@http://x")
    with pytest.raises(ConfigError, match="no base URL"):
        make_chat("openai:gpt-x")
    with pytest.raises(ConfigError, match="unknown chat model 'gpt-x'.*openai:<model>@<base_url>"):
        make_chat("gpt-x")
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions" == chat_url("http://h:1")
    chat = make_chat(f"openai:judge-model@{server.url}", api_key_env=KEY_ENV)
    assert KEY not in repr(chat) and KEY_ENV in repr(chat)
    assert chat.chat([{"role": "user", "content": "x"}]) == "default reply"
