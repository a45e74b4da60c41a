"""sft.source=teacher:http://HOST/v1#MODEL over real HTTP: an OpenAI-compatible endpoint writes the
replies, honing re-encodes them with the policy's tokenizer through the rollout path and grades
each one; only verified replies are kept. Two endpoints: a scripted teacher on real uvicorn (it
answers some tasks right and some wrong, so the verifier's filter is what is tested) and
`honing serve` on the tiny model (the client and honing's own server agree on the protocol)."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from fastapi import FastAPI  # noqa: E402

from honing.config import RunConfig  # noqa: E402
from honing.models import load_tokenizer  # noqa: E402
from honing.schedule.setup import build_tasks  # noqa: E402
from honing.train.demos import collect  # noqa: E402

ARITH = {"name": "gym:basic_arithmetic", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                                    "operators": ["+"], "allow_negation": False,
                                                    "allow_parentheses": False}}


def _cfg(url: str, tasks: int = 12, samples: int = 1) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"name": "tiny-random"}, "tasks": {"sources": [ARITH]}, "verify": {"extractor": "last_number"},
        "eval": {"heldout_tasks": 8}, "generation": {"max_new_tokens": 16},
        "sft": {"source": f"teacher:{url}", "tasks": tasks, "samples": samples, "keep": "all"}})


def _teacher_app(seen: list[dict]) -> FastAPI:
    """Answers 'a + b' with the sum when a is even and with sum + 1 when a is odd."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict) -> dict:
        seen.append(body)
        q = body["messages"][-1]["content"]
        a, b = map(int, re.search(r"(\d+) \+ (\d+)", q).groups())
        answer = a + b + (a % 2)
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"The sum is {answer}."}}]}

    return app


class _Uvicorn:
    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.th = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.th.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            assert time.monotonic() < deadline and self.th.is_alive(), "uvicorn did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.uv.should_exit = True
        self.th.join(10)
        self.sock.close()


def test_http_teacher_replies_are_graded_and_only_verified_ones_kept() -> None:
    seen: list[dict] = []
    srv = _Uvicorn(_teacher_app(seen))
    try:
        cfg = _cfg(srv.url + "#teacher-7b")
        setup = build_tasks(cfg)
        tok = load_tokenizer("tiny-random")
        demos = collect(cfg, setup, tok, None)
    finally:
        srv.stop()
    assert len(seen) == len(demos) == 12 and {b["model"] for b in seen} == {"teacher-7b"}
    for d in demos:
        assert d.source == f"teacher:{srv.url}#teacher-7b"
        a = int(re.search(r"(\d+) \+ (\d+)", d.question).group(1))
        assert d.passed is (a % 2 == 0), (d.question, d.text)  # the verifier, not the teacher, decides
        assert d.kept is d.passed and d.status == ("kept" if d.passed else "failed")
        assert "The sum is" in tok.decode(list(d.completion_ids)) and sum(d.loss_mask) == len(d.completion_ids)
    assert 0 < sum(d.kept for d in demos) < len(demos)


def test_http_teacher_against_honing_serve(tmp_path) -> None:
    """The OpenAI client of the teacher source against honing's own server: every request arrives
    (logged once by the server), every reply becomes a graded demonstration with the policy's ids."""
    pytest.importorskip("httpx")
    from honing.serve import read_records, start_server

    with start_server("tiny-random", log_dir=tmp_path / "logs") as s:
        cfg = _cfg(s.url + "/v1#tiny-random", tasks=4, samples=2)
        setup = build_tasks(cfg)
        tok = load_tokenizer("tiny-random")
        demos = collect(cfg, setup, tok, None)
    records = [r for _, _, r in read_records(tmp_path / "logs") if r is not None]
    assert len(demos) == 8 and len(records) == 8
    assert all(d.passed is not None and d.status in ("kept", "failed") for d in demos)  # graded, every one
    assert all(len(d.prompt_ids) > 0 for d in demos)
