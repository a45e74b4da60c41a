"""The OpenAI-compatible HTTP API of `honing serve` (FastAPI; uvicorn runs it).

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (both with `stream: true` as
server-sent events), `GET /v1/models`, `GET /health`, `GET /metrics` (JSON, or Prometheus text to a scraper).

Auth: with a token, every endpoint but `/health` needs `Authorization: Bearer <token>` (401
otherwise). `serve()` refuses a non-loopback host without one. The token is compared in constant
time and never logged: the log store records the JSON body only, never headers.

Logging: each finished request is one record in the LogStore (request body, response text,
usage, latency) unless the request carries `X-Honing-No-Log: 1`.

Supported request fields: messages / prompt, max_tokens (max_completion_tokens), temperature
(default 1), top_p, top_k, n, seed, stop, stream. Others are accepted and ignored (and logged).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import threading
import time
import uuid
from typing import Any, AsyncIterator

from honing.engine.types import SamplingParams
from honing.errors import HoningError

try:  # the `dev`/`service` extra; FastAPI resolves the handlers' annotations from module globals
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
except ImportError as e:  # pragma: no cover
    raise HoningError("honing serve needs fastapi and uvicorn: pip install 'honing[dev]'") from e
from honing.serve.batcher import Batcher, Job
from honing.serve.logstore import LogStore
from honing.serve.metrics import Metrics, prometheus_text, wants_prometheus
from honing.serve.model import Served, current_release_name, load_served

NO_LOG_HEADER = "x-honing-no-log"
MAX_BODY_BYTES = 8 << 20


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Server:
    """The state behind the app: what is served, the batcher, metrics, the log store, and (for
    `release:current`) the thread that follows the registry's pointer."""

    def __init__(self, served: Served, *, token: str | None = None, log: LogStore | None = None,
                 served_id: str | None = None, window_s: float = 0.01, max_tokens_limit: int = 1024,
                 default_max_tokens: int = 256, follow_registry: Any = None, follow_s: float = 1.0,
                 backend: str = "hf", max_batch_size: int = 32, device: str = "auto") -> None:
        self.served = served
        self.served_id = served_id or served.name
        self.token = token.strip() if token else None
        self.log = log
        self.metrics = Metrics()
        self.max_tokens_limit, self.default_max_tokens = max_tokens_limit, default_max_tokens
        self.batcher = Batcher(served.engine, served.eos_ids, window_s, max_batch_size, self.metrics.batch, served)
        self.backend, self.max_batch_size, self.device = backend, max_batch_size, device
        self.reloads: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._follow: threading.Thread | None = None
        if follow_registry is not None:
            self._follow = threading.Thread(target=self._follow_loop, args=(follow_registry, follow_s),
                                            name="honing-serve-follow", daemon=True)
            self._follow.start()

    def _follow_loop(self, registry: Any, every_s: float) -> None:
        """Poll the current pointer; on a change load that release and swap it in between batches.
        A release that fails to load (bad checksum) is reported once and the old one kept."""
        failed: str | None = None
        while not self._stop.wait(every_s):
            try:
                name = current_release_name(registry)
            except Exception as e:  # noqa: BLE001 - a registry being written is read again next time
                print(f"honing serve: cannot read the registry: {e}", file=sys.stderr)
                continue
            if name is None or name == self.served.release or name == failed:
                continue
            t0 = time.perf_counter()
            try:
                new = load_served(f"release:{name}", registry=registry, backend=self.backend,
                                  max_batch_size=self.max_batch_size, device=self.device)
            except Exception as e:  # noqa: BLE001
                failed = name
                print(f"honing serve: error: keeping {self.served.name}; cannot load release {name}: {e}",
                      file=sys.stderr)
                continue
            failed = None
            self.batcher.swap(new.engine, new.eos_ids, new)
            old, self.served = self.served.name, new
            self.reloads.append({"time": time.time(), "from": old, "to": name,
                                 "load_s": round(time.perf_counter() - t0, 3)})
            print(f"honing serve: now serving release {name} (was {old})", file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        self.batcher.close()
        if self.log is not None:
            self.log.close()

    # --- requests -------------------------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, cred = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), self.token.encode())

    def check_model(self, body: dict) -> None:
        m = body.get("model")
        if m in (None, "", self.served_id, self.served.name):
            return
        raise BadRequest(f"model {m!r} is not served here (serving {self.served_id!r})", 404, "model_not_found")

    def params(self, body: dict) -> tuple[SamplingParams, int | None, list[str]]:
        try:
            mx = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
            mx, n = int(mx), int(body.get("n") or 1)
            temp = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
            top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
            top_k = int(body.get("top_k") or 0)
            seed = None if body.get("seed") is None else int(body["seed"])
        except (TypeError, ValueError) as e:
            raise BadRequest(f"bad sampling parameter: {e}") from None
        if not 1 <= mx <= self.max_tokens_limit:
            raise BadRequest(f"max_tokens must be in [1, {self.max_tokens_limit}], got {mx}")
        if not 1 <= n <= 16:
            raise BadRequest(f"n must be in [1, 16], got {n}")
        if temp < 0 or not 0 < top_p <= 1 or top_k < 0:
            raise BadRequest("need temperature >= 0, 0 < top_p <= 1, top_k >= 0")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else [str(s) for s in stop if s]
        return SamplingParams(mx, temp, top_p, top_k, n), seed, stop

    def check_length(self, served: Served, n_prompt: int, max_new_tokens: int) -> None:
        cfg = getattr(getattr(served.engine, "model", None), "config", None)
        limit = getattr(cfg, "max_position_embeddings", None)
        if isinstance(limit, int) and n_prompt + max_new_tokens > limit:
            raise BadRequest(f"prompt ({n_prompt} tokens) + max_tokens ({max_new_tokens}) exceeds the model's "
                             f"context of {limit} tokens")

    def prompt_ids(self, body: dict, chat: bool, tok: Any) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("messages must be a non-empty list")
            clean = []
            for m in msgs:
                if not isinstance(m, dict) or "role" not in m:
                    raise BadRequest("each message needs a role and content")
                content = m.get("content") or ""
                if isinstance(content, list):  # content parts: keep the text ones
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                clean.append({"role": str(m["role"]), "content": str(content)})
            ids = tok.apply_chat_template(clean, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string (one prompt per request)")
        return list(tok(prompt, add_special_tokens=False)["input_ids"])

    def record(self, rid: str, endpoint: str, body: dict, served: Served, choices: list[dict], usage: dict,
               latency_s: float, stream: bool, no_log: bool) -> None:
        if self.log is None or no_log:
            return
        self.log.append({"id": rid, "time": time.time(), "endpoint": endpoint, "model": served.name,
                         "release": served.release, "variant": served.variant, "stream": stream,
                         "request": body, "response": {"choices": choices, "usage": usage},
                         "latency_s": round(latency_s, 6)})


def apply_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` cut before the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class Decoder:
    """Incremental detokenisation: the text a token adds, holding back an incomplete UTF-8 tail
    and (with stop strings) anything that could still become a stop string."""

    def __init__(self, tok: Any, stops: list[str]) -> None:
        self.tok, self.stops, self.ids, self.sent, self.stopped = tok, stops, [], 0, False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=True)

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        full = self.text()
        if full.endswith("\ufffd"):
            return ""
        full, hit = apply_stop(full, self.stops)
        upto = len(full) if hit else max(self.sent, len(full) - self.hold)
        delta, self.sent = full[self.sent:upto], max(self.sent, upto)
        self.stopped = hit
        return delta

    def flush(self) -> str:
        full, _ = apply_stop(self.text(), self.stops)
        delta, self.sent = full[self.sent:], len(full)
        return delta


def create_app(server: Server) -> Any:
    app = FastAPI(title="honing serve", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status_code=status)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if request.url.path != "/health" and not server.authorized(request.headers.get("authorization")):
            server.metrics.observe(401, 0.0)
            return error(401, "missing or wrong bearer token", "unauthorized")
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict:
        s = server.served
        return {"status": "ok", "model": s.name, "release": s.release, "variant": s.variant,
                "uptime_s": round(time.time() - server.metrics.started, 3), "reloads": server.reloads[-5:]}

    @app.get("/metrics", response_model=None)
    async def metrics(request: Request, format: str | None = None) -> Any:  # noqa: A002 - the query key
        try:
            prometheus = wants_prometheus(format, request.headers.get("accept"))
        except ValueError as e:
            return error(400, str(e), "invalid_request_error")
        snap = server.metrics.snapshot()
        if prometheus:
            return PlainTextResponse(prometheus_text(snap, server.served.name),
                                     media_type="text/plain; version=0.0.4; charset=utf-8")
        return {**snap, "model": server.served.name, "logging": server.log is not None}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": server.served_id, "object": "model",
                                            "created": int(server.metrics.started), "owned_by": "honing",
                                            "root": server.served.name}]}

    async def complete(request: Request, chat: bool) -> Any:
        t0 = time.perf_counter()
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                raise BadRequest(f"request body over {MAX_BODY_BYTES} bytes", 413)
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
        except (json.JSONDecodeError, UnicodeDecodeError):
            server.metrics.observe(400, time.perf_counter() - t0)
            return error(400, "the request body is not valid JSON", "invalid_request_error")
        except BadRequest as e:
            server.metrics.observe(e.status, time.perf_counter() - t0)
            return error(e.status, str(e), e.code)
        no_log = request.headers.get(NO_LOG_HEADER, "").strip().lower() in ("1", "true", "yes")
        served = server.served
        try:
            server.check_model(body)
            params, seed, stops = server.params(body)
            ids = server.prompt_ids(body, chat, served.tokenizer)
            server.check_length(served, len(ids), params.max_new_tokens)
        except BadRequest as e:
            server.metrics.observe(e.status, time.perf_counter() - t0)
            return error(e.status, str(e), e.code)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        args = (server, rid, endpoint, body, ids, params, seed, stops, chat, t0, no_log)
        if body.get("stream"):
            return StreamingResponse(_stream(*args), media_type="text/event-stream")
        return await _whole(*args)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, False)

    return app


def _choice(chat: bool, i: int, text: str, finish: str) -> dict:
    if chat:
        return {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"index": i, "text": text, "finish_reason": finish, "logprobs": None}


async def _whole(server: Server, rid: str, endpoint: str, body: dict, ids: list[int], params: SamplingParams,
                 seed: int | None, stops: list[str], chat: bool, t0: float, no_log: bool) -> Any:
    try:
        samples, served = await asyncio.wrap_future(server.batcher.submit(Job(ids, params, seed)))
    except Exception as e:  # noqa: BLE001
        server.metrics.observe(500, time.perf_counter() - t0)
        return JSONResponse({"error": {"message": f"generation failed: {e}", "type": "server_error"}}, 500)
    choices, n_out = [], 0
    for i, s in enumerate(samples):
        text, hit = apply_stop(served.tokenizer.decode(s.token_ids, skip_special_tokens=True), stops)
        choices.append(_choice(chat, i, text, "stop" if hit else s.finish_reason))
        n_out += len(s.token_ids)
    usage = {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}
    latency = time.perf_counter() - t0
    server.metrics.observe(200, latency, len(ids), n_out)
    server.record(rid, endpoint, body, served, choices, usage, latency, False, no_log)
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": served.name, "choices": choices, "usage": usage}


async def _stream(server: Server, rid: str, endpoint: str, body: dict, ids: list[int], params: SamplingParams,
                  seed: int | None, stops: list[str], chat: bool, t0: float, no_log: bool) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    tok = server.served.tokenizer
    decoders = [Decoder(tok, stops) for _ in range(params.n)]
    job = Job(ids, params, seed, on_token=lambda i, t: loop.call_soon_threadsafe(q.put_nowait, (i, t)))
    fut = server.batcher.submit(job)
    fut.add_done_callback(lambda _f: loop.call_soon_threadsafe(q.put_nowait, None))
    created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"

    def chunk(i: int, text: str | None, finish: str | None, first: bool = False) -> str:
        if chat:
            delta: dict = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            c: dict = {"index": i, "delta": delta, "finish_reason": finish}
        else:
            c = {"index": i, "text": text or "", "finish_reason": finish, "logprobs": None}
        return "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": server.served.name,
                                      "choices": [c]}) + "\n\n"

    if chat:
        for i in range(params.n):
            yield chunk(i, None, None, first=True)
    while True:
        item = await q.get()
        if item is None:
            break
        i, t = item
        delta = decoders[i].add(t)
        if delta:
            yield chunk(i, delta, None)
    try:
        samples, served = fut.result()
    except Exception as e:  # noqa: BLE001
        server.metrics.observe(500, time.perf_counter() - t0)
        yield "data: " + json.dumps({"error": {"message": f"generation failed: {e}", "type": "server_error"}}) + "\n\n"
        return
    choices, n_out = [], 0
    for i, s in enumerate(samples):
        rest = decoders[i].flush()
        text, hit = apply_stop(served.tokenizer.decode(s.token_ids, skip_special_tokens=True), stops)
        finish = "stop" if hit else s.finish_reason
        yield chunk(i, rest or None, finish)
        choices.append(_choice(chat, i, text, finish))
        n_out += len(s.token_ids)
    yield "data: [DONE]\n\n"
    usage = {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}
    latency = time.perf_counter() - t0
    server.metrics.observe(200, latency, len(ids), n_out)
    server.record(rid, endpoint, body, served, choices, usage, latency, True, no_log)
