"""honing serve: the OpenAI-compatible API over real uvicorn on 127.0.0.1 and the tiny in-code model."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402

from honing.errors import HoningError  # noqa: E402
from honing.serve.app import Decoder, apply_stop  # noqa: E402
from honing.serve.logstore import LogStore, log_files, read_records  # noqa: E402
from honing.serve.server import build_server, start_server  # noqa: E402

TOKEN = "serve-test-token-" + "y" * 24
CHAT = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    logs = tmp_path_factory.mktemp("serve") / "logs"
    # a long batch window, so that concurrent requests of the batching test land in one batch
    with start_server("tiny-random", log_dir=logs, window_s=0.25) as s:
        s.logs = logs
        yield s


@pytest.fixture(scope="module")
def client(server) -> httpx.Client:  # noqa: ANN001
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _records(server) -> list[dict]:  # noqa: ANN001
    return [r for _, _, r in read_records(server.logs) if r is not None]


def test_chat_completion_shape_and_usage(client: httpx.Client, server) -> None:  # noqa: ANN001
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny-random"
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    u = body["usage"]
    assert 0 < u["completion_tokens"] <= 6 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    rec = next(x for x in _records(server) if x["id"] == body["id"])
    assert rec["request"] == CHAT and rec["response"]["choices"][0]["message"]["content"] == \
        choice["message"]["content"]


def test_stream_matches_whole_response(client: httpx.Client) -> None:
    whole = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 12}).json()
    deltas, finishes, done = [], [], False
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 12, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
                continue
            ch = json.loads(line[6:])["choices"][0]
            deltas.append(ch["delta"].get("content", ""))
            finishes.append(ch["finish_reason"])
    assert done and finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]  # greedy: the same text


def test_completions_n_and_stop(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "temperature": 0, "n": 2})
    assert r.status_code == 200
    texts = [c["text"] for c in r.json()["choices"]]
    assert len(texts) == 2 and texts[0] == texts[1]  # greedy samples agree
    if texts[0]:
        stop = texts[0][-1]
        s = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "temperature": 0, "stop": stop})
        c = s.json()["choices"][0]
        assert stop not in c["text"] and c["finish_reason"] == "stop"


def test_models_health_metrics(client: httpx.Client) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-random"
    assert client.get("/health").json()["status"] == "ok"
    m = client.get("/metrics").json()
    assert m["requests"] >= 1 and m["completion_tokens"] > 0 and m["tokens_per_s"] > 0
    assert m["latency_s"]["p50"] is not None and m["latency_s"]["p99"] >= m["latency_s"]["p50"]


def test_metrics_in_prometheus_text_format(client: httpx.Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
    js = client.get("/metrics").json()
    scraped = client.get("/metrics", headers={"Accept": "text/plain;version=0.0.4;q=0.3,*/*;q=0.1"})  # Prometheus' own
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(scraped.text)}  # the reference parser accepts it
    assert {"honing_requests", "honing_completion_tokens", "honing_request_latency_seconds",
            "honing_tokens_per_second", "honing_batches"} <= set(fams)
    assert fams["honing_requests"].type == "counter" and fams["honing_request_latency_seconds"].type == "summary"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    ok = samples[("honing_requests_total", (("model", "tiny-random"), ("status", "200")))]
    assert ok >= js["requests_by_status"]["200"]  # counters only grow between the two reads
    assert samples[("honing_completion_tokens_total", (("model", "tiny-random"),))] >= js["completion_tokens"] > 0
    count = samples[("honing_request_latency_seconds_count", (("model", "tiny-random"),))]
    assert count >= js["latency_s"]["count"] > 0
    p50 = samples[("honing_request_latency_seconds", (("model", "tiny-random"), ("quantile", "0.5")))]
    assert 0 < p50 <= samples[("honing_request_latency_seconds", (("model", "tiny-random"), ("quantile", "0.99")))]
    assert client.get("/metrics?format=prometheus").text.startswith("# HELP honing_requests_total")
    assert "requests" in client.get("/metrics", headers={"Accept": "application/json"}).json()
    bad = client.get("/metrics?format=xml")
    assert bad.status_code == 400 and "format=xml" in bad.json()["error"]["message"]


def test_concurrent_requests_share_a_batch_each_logged_once(client: httpx.Client, server) -> None:  # noqa: ANN001
    before = client.get("/metrics").json()["max_batch_requests"]
    out: list = [None] * 6
    barrier = threading.Barrier(6)

    def one(i: int) -> None:
        barrier.wait()
        out[i] = client.post("/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4,
                                   "temperature": 0})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None and r.status_code == 200 for r in out)
    assert max(before, client.get("/metrics").json()["max_batch_requests"]) > 1  # batched, not one by one
    ids = [r.json()["id"] for r in out]
    logged = [x["id"] for x in _records(server)]
    assert all(logged.count(i) == 1 for i in ids)


def test_no_log_header_and_bad_requests(client: httpx.Client, server) -> None:  # noqa: ANN001
    r = client.post("/v1/chat/completions", json=CHAT, headers={"X-Honing-No-Log": "1"})
    assert r.status_code == 200
    assert r.json()["id"] not in {x["id"] for x in _records(server)}
    assert client.post("/v1/chat/completions", content=b"{not json").status_code == 400
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}).status_code == 404
    bad = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**6})
    assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    long = client.post("/v1/completions", json={"prompt": "x" * 600, "max_tokens": 8})  # tiny model: 512 positions
    assert long.status_code == 400 and "context" in long.json()["error"]["message"]


def test_log_store_permissions(server) -> None:  # noqa: ANN001
    assert stat.S_IMODE(os.stat(server.logs).st_mode) == 0o700
    files = log_files(server.logs)
    assert files and all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in files)


def test_bearer_token_required_and_never_logged(tmp_path) -> None:  # noqa: ANN001
    with start_server("tiny-random", log_dir=tmp_path / "logs", token=TOKEN) as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/health").status_code == 200  # probes need no token
        ok = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
    text = "".join(p.read_text() for p in log_files(tmp_path / "logs"))
    assert ok.json()["id"] in text and TOKEN not in text


def test_non_loopback_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HONING_SERVE_TOKEN", raising=False)
    with pytest.raises(HoningError, match="needs a bearer token"):
        build_server("tiny-random", host="0.0.0.0")


def test_log_rotation_and_retention(tmp_path) -> None:  # noqa: ANN001
    store = LogStore(tmp_path / "l", max_file_bytes=300, retention_files=3, retention_days=None)
    for i in range(40):
        store.append({"id": f"r{i}", "text": "x" * 100})
    store.close()
    files = log_files(tmp_path / "l")
    assert len(files) == 3  # rotated by size, oldest files dropped past the retention limit
    ids = [r["id"] for _, _, r in read_records(tmp_path / "l")]
    assert ids == sorted(set(ids), key=lambda x: int(x[1:])) and ids[-1] == "r39"  # append order, no duplicates
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in files)


def test_stop_strings_in_streaming_decoder() -> None:
    from honing.models import load_tokenizer

    tok = load_tokenizer("tiny-random")
    d = Decoder(tok, ["END"])
    ids = tok("abcENDxyz", add_special_tokens=False)["input_ids"]
    text = "".join(d.add(t) for t in ids) + d.flush()
    assert text == "abc" and d.stopped
    assert apply_stop("hello world", ["o w", "zz"]) == ("hell", True)
