"""generation.backend=vllm-server: honing.engine.vllm_server against real HTTP servers.

The first part runs in the default venv (no vLLM): unreachable URLs, a fake vLLM on loopback
(a real `http.server`, not a mock object) that is too old, lacks endpoints or answers completions,
bad model directories, and a server that dies while starting. Every case must give one
`VLLMServerError` line (a HoningError: the CLI exits 2) quickly, never a hang.

The second part (slow) starts a real vLLM server for SmolLM2 and is skipped unless an interpreter
with vLLM is found ($HONING_VLLM_PYTHON, .venv-vllm/bin/python, or this one):
    HONING_VLLM_PYTHON=.venv-vllm/bin/python OMP_NUM_THREADS=1 .venv/bin/pytest -q -m slow tests/engine/test_vllm_server.py
"""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from honing.engine.types import SamplingParams
from honing.engine.vllm_server import (
    VLLMServerError,
    base_url_of,
    free_port,
    make_server_engine,
    parse_version,
)
from honing.errors import HoningError

QUICK = dict(connect_timeout_s=1.0, max_retries=1, backoff_s=0.05, request_timeout_s=10.0)


def test_error_is_a_honing_error_so_the_cli_exits_2() -> None:
    assert issubclass(VLLMServerError, HoningError)


def test_parse_version_and_urls() -> None:
    assert parse_version("0.32.0") == (0, 32, 0)
    assert parse_version("0.11.2rc1.dev3+gabc.cpu") == (0, 11, 2)
    assert parse_version("v0.9") == (0, 9)
    assert parse_version("weird") == ()
    assert base_url_of("http://h:1/v1/") == "http://h:1"
    with pytest.raises(VLLMServerError, match="http://"):
        base_url_of("h:1")


class _Cfg:
    def __init__(self, url: str | None) -> None:
        self.server_url, self.max_batch_size = url, 8


def test_unreachable_server_fails_fast_with_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t = time.monotonic()
    with pytest.raises(VLLMServerError) as e:
        make_server_engine(_Cfg(url), None, None, [2], **QUICK)
    assert time.monotonic() - t < 10
    msg = str(e.value)
    assert "\n" not in msg and url in msg and "gave up after 2 attempt" in msg


def test_server_that_accepts_but_never_answers_times_out() -> None:
    import socket

    with socket.socket() as sock:  # the kernel completes the handshake; nobody ever reads or answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        t = time.monotonic()
        with pytest.raises(VLLMServerError, match=r"no answer within 2s") as e:
            make_server_engine(_Cfg(url), None, None, [2], **{**QUICK, "request_timeout_s": 2.0})
        assert time.monotonic() - t < 10 and "\n" not in str(e.value)


# -- a fake vLLM server on loopback ----------------------------------------------------------------
class _Fake:
    def __init__(self, version: str | None = "0.32.0", dev_mode: bool = True, models: bool = True) -> None:
        self.version, self.dev_mode, self.models = version, dev_mode, models
        self.requests: list[tuple[str, str, Any]] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any = None) -> None:
                data = json.dumps(body if body is not None else {"detail": "Not Found"}).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                fake.requests.append((method, self.path, body))
                post_only = {"/v1/completions"} | ({"/collective_rpc", "/reset_prefix_cache"} if fake.dev_mode else set())
                if self.path == "/version" and fake.version is not None and method == "GET":
                    return self._send(200, {"version": fake.version})
                if self.path == "/health":
                    return self._send(200, {})
                if self.path == "/v1/models" and fake.models and method == "GET":
                    return self._send(200, {"data": [{"id": "served-model"}]})
                if self.path in post_only:
                    if method != "POST":
                        return self._send(405, {"detail": "Method Not Allowed"})
                    if self.path == "/v1/completions":
                        return self._send(200, fake.completion(body))
                    return self._send(200, {"results": [None]} if self.path == "/collective_rpc" else {})
                return self._send(404)

            def do_GET(self) -> None:  # noqa: N802
                self._route("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._route("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def completion(body: dict) -> dict:
        p = body["prompt"]
        choices = []
        for j in range(body["n"]):  # sample j: the prompt's last token + j, then EOS (2) unless j is odd
            toks = [p[-1] + j, 7] + ([2] if j % 2 == 0 else [])
            choices.append({"index": j, "finish_reason": "stop" if j % 2 == 0 else "length",
                            "logprobs": {"tokens": [f"token_id:{t}" for t in toks],
                                         "token_logprobs": [-0.5 * (k + 1) for k in range(len(toks))]}})
        return {"choices": list(reversed(choices))}  # out of order on purpose

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake() -> Iterator[Any]:
    made: list[_Fake] = []

    def make(**kw: Any) -> _Fake:
        made.append(_Fake(**kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_old_vllm_version_is_refused(fake: Any) -> None:
    f = fake(version="0.6.3")
    with pytest.raises(VLLMServerError, match=r"runs vLLM 0\.6\.3; honing needs vLLM >= 0\.10") as e:
        make_server_engine(_Cfg(f.url), None, None, [2], **QUICK)
    assert "\n" not in str(e.value)


def test_not_a_vllm_server_is_refused(fake: Any) -> None:
    f = fake(version=None)
    with pytest.raises(VLLMServerError, match="not a vLLM server"):
        make_server_engine(_Cfg(f.url), None, None, [2], **QUICK)


def test_missing_models_endpoint_is_refused(fake: Any) -> None:
    f = fake(models=False)
    with pytest.raises(VLLMServerError, match="/v1/models"):
        make_server_engine(_Cfg(f.url), None, None, [2], **QUICK)


def test_server_without_reload_endpoints_serves_fixed_weights(fake: Any) -> None:
    f = fake(dev_mode=False)
    with pytest.raises(VLLMServerError, match="cannot take new weights.*VLLM_SERVER_DEV_MODE=1") as e:
        make_server_engine(_Cfg(f.url), None, None, [2], need_weight_sync=True, **QUICK)
    assert "\n" not in str(e.value)
    eng = make_server_engine(_Cfg(f.url), None, None, [2], **QUICK)  # eval / rollout: fine
    try:
        assert not eng.can_reload
        eng.load_weights(None, 3)  # no module to push: only the version moves
        assert eng.version == 3
        eng.set_model(object())
        with pytest.raises(VLLMServerError, match="cannot take new weights"):
            eng.load_weights(None, 4)
    finally:
        eng.close()


def test_generate_parses_token_ids_logprobs_and_finish_reasons(fake: Any) -> None:
    f = fake()
    eng = make_server_engine(_Cfg(f.url + "/v1"), None, None, [2], **QUICK)
    try:
        assert eng.model_name == "served-model" and eng.vllm_version == "0.32.0" and eng.can_reload
        out = eng.generate([[5, 6], [9]], SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=5, n=3),
                           seed=11)
        assert [[s.token_ids for s in g] for g in out] == [[(6, 7, 2), (7, 7), (8, 7, 2)], [(9, 7, 2), (10, 7), (11, 7, 2)]]
        assert [s.finish_reason for s in out[0]] == ["stop", "length", "stop"]
        assert all(len(s.logprobs) == len(s.token_ids) for g in out for s in g)
        assert out[0][0].logprobs == (-0.5, -1.0, -1.5)
        bodies = sorted((b for m, p, b in f.requests if p == "/v1/completions" and m == "POST"), key=lambda b: b["seed"])
        assert [b["seed"] for b in bodies] == [11, 12]
        b = bodies[0]
        assert b["prompt"] == [5, 6] and b["n"] == 3 and b["logprobs"] == 0 and b["return_tokens_as_token_ids"] is True
        assert b["stop_token_ids"] == [2] and b["top_k"] == 5 and b["top_p"] == 0.9 and b["model"] == "served-model"
    finally:
        eng.close()


def test_bad_model_dirs(tmp_path: Path) -> None:
    with pytest.raises(VLLMServerError, match="does not exist"):
        make_server_engine(_Cfg(None), tmp_path / "nope", None, [2], **QUICK)
    with pytest.raises(VLLMServerError, match="no config.json"):
        make_server_engine(_Cfg(None), tmp_path, None, [2], **QUICK)
    with pytest.raises(VLLMServerError, match="needs a model"):
        make_server_engine(_Cfg(None), None, None, [2], **QUICK)


def _fake_python(tmp_path: Path, server_body: str) -> str:
    """An 'interpreter' that imports vllm fine and runs `server_body` (bash) as the server."""
    exe = tmp_path / "python"
    exe.write_text("#!/bin/bash\n"
                   'if [ "$1" = "-c" ]; then printf 0.32.0; exit 0; fi\n'
                   f"{server_body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_server_that_cannot_serve_the_model_shows_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["NopeForCausalLM"]}')
    py = _fake_python(tmp_path, 'echo "INFO starting"; echo "ValueError: Model architectures '
                                "['NopeForCausalLM'] are not supported for now\"; exit 1")
    monkeypatch.setenv("HONING_VLLM_PYTHON", py)
    t = time.monotonic()
    with pytest.raises(VLLMServerError) as e:
        make_server_engine(_Cfg(None), tmp_path / "m", None, [2], start_timeout_s=30, **QUICK)
    msg = str(e.value)
    assert time.monotonic() - t < 15 and "\n" not in msg
    assert "exited with code 1 while starting" in msg and "NopeForCausalLM" in msg and "not supported" in msg


def test_server_that_never_gets_healthy_hits_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.setenv("HONING_VLLM_PYTHON", _fake_python(tmp_path, 'echo "loading forever"; exec sleep 300'))
    t = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"not healthy within 3s \(last log line: loading forever"):
        make_server_engine(_Cfg(None), tmp_path / "m", None, [2], start_timeout_s=3, **QUICK)
    assert time.monotonic() - t < 20


def test_interpreter_without_vllm_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.setenv("HONING_VLLM_PYTHON", "/bin/false")
    with pytest.raises(VLLMServerError, match="cannot `import vllm`"):
        make_server_engine(_Cfg(None), tmp_path / "m", None, [2], **QUICK)


# -- a real vLLM server (slow; needs vLLM) ---------------------------------------------------------
def _vllm_python() -> str | None:
    from honing.engine.vllm_server import find_vllm_python

    try:
        return find_vllm_python()
    except VLLMServerError:
        return None


_VLLM: list[str | None] = []


def _need_vllm() -> str:
    if not _VLLM:  # looked up once, and only when a real-server test runs (importing vllm takes seconds)
        _VLLM.append(_vllm_python())
    if _VLLM[0] is None:
        pytest.skip("needs vLLM (make setup-vllm, or $HONING_VLLM_PYTHON)")
    return _VLLM[0]


@pytest.fixture(scope="module")
def smol() -> Any:
    _need_vllm()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from honing.models import ensure_default_model

    d = ensure_default_model()
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return d, tok, model


@pytest.fixture(scope="module")
def server(smol: Any) -> Iterator[Any]:
    d, tok, _ = smol
    os.environ["HONING_VLLM_PYTHON"] = _need_vllm()
    threads = os.environ.get("HONING_VLLM_THREADS", "2")
    eng = make_server_engine(None, d, tok, [tok.convert_tokens_to_ids("<|im_end|>")], start_timeout_s=480,
                             max_model_len=1024, server_env={"OMP_NUM_THREADS": threads, "VLLM_CPU_KVCACHE_SPACE": "1"})
    yield eng
    eng.close()
    assert not eng.server.alive()


def _prompt(tok: Any, text: str) -> list[int]:
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"])


def _hf_logprobs(model: Any, prompt: list[int], toks: tuple[int, ...], temperature: float) -> list[float]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt + list(toks)])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        lp = torch.log_softmax(logits / temperature, -1)
        return lp.gather(-1, torch.tensor(toks)[:, None]).squeeze(-1).tolist()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_generates_n_samples_with_logprobs(server: Any, smol: Any) -> None:
    _, tok, model = smol
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [_prompt(tok, "What is 2+3?"), _prompt(tok, "Name a colour.")]
    params = SamplingParams(max_new_tokens=24, temperature=0.8, n=4)
    out = server.generate(prompts, params, seed=5)
    assert len(out) == 2 and all(len(g) == 4 for g in out)
    for g in out:
        for s in g:
            assert len(s.token_ids) == len(s.logprobs) > 0 and len(s.token_ids) <= 24
            assert s.finish_reason == ("stop" if s.token_ids[-1] == eos else "length")
            assert all(lp <= 0 and math.isfinite(lp) for lp in s.logprobs)
    assert len({s.token_ids for s in out[0]}) > 1  # n samples, not n copies
    again = server.generate(prompts, params, seed=5)
    # Seeded: the same draws (batch composition and prefix-cache hits change bf16 rounding, so a
    # sample may fork later at a near-tie; its start is the seed's).
    same = sum(a.token_ids[:4] == b.token_ids[:4] for ga, gb in zip(again, out) for a, b in zip(ga, gb))
    assert same >= 6, same
    # The sampled tokens' log-probs are those of softmax(logits / T) (bf16 engine vs fp32 trainer).
    deltas = [abs(a - b) for g, p in zip(out, prompts) for s in g
              for a, b in zip(s.logprobs, _hf_logprobs(model, p, s.token_ids, 0.8))]
    assert sum(deltas) / len(deltas) < 0.15, sum(deltas) / len(deltas)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_weight_push_changes_logprobs_vs_control(server: Any, smol: Any) -> None:
    import torch

    _, tok, model = smol
    p = _prompt(tok, "Write one word.")
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = server.generate([p], greedy)[0][0]
    new = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for k, v in new.items():  # every linear layer (whole fused groups: q, k and v together) changes;
        if v.dim() == 2 and ".layers." in k:  # the tied embedding / lm_head stays (vLLM ties them)
            v.add_(torch.randn(v.shape, generator=g) * v.std() * 0.1)
    server.load_weights(new, version=1)
    assert server.version == 1 and server.last_push["bytes"] > 1e8
    assert server.server_weight_version() == "1"
    after = server.generate([p], greedy)[0][0]
    assert after.token_ids != before.token_ids or max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) > 0.1
    # the engine now serves the new weights: its log-probs match the pushed weights, not the old ones
    perturbed = type(model)(model.config)
    perturbed.load_state_dict(new)
    perturbed.eval()
    lp_new = _hf_logprobs(perturbed, p, after.token_ids, 1.0)
    lp_old = _hf_logprobs(model, p, after.token_ids, 1.0)
    d_new = sum(abs(a - b) for a, b in zip(after.logprobs, lp_new)) / len(lp_new)
    d_old = sum(abs(a - b) for a, b in zip(after.logprobs, lp_old)) / len(lp_old)
    assert d_new < 0.35 and d_old > 3 * d_new, (d_new, d_old)  # bf16 engine vs fp32; the old weights are far off
    print(f'weight push: mean |dlogp| vs new weights {d_new:.3f}, vs old {d_old:.3f}')
    # the module path (set_model + load_weights(None, v)), as the trainer calls it: back to the control
    server.set_model(model)
    server.load_weights(None, version=2)
    assert server.generate([p], greedy)[0][0].token_ids == before.token_ids
    print(f"weight push: {server.last_push['bytes'] / 1e6:.0f} MB, write {server.last_push['write_s']:.2f}s, "
          f"reload {server.last_push['reload_s']:.2f}s")


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_as_a_user_run_server(server: Any, smol: Any) -> None:
    _, tok, _ = smol
    user = make_server_engine(_Cfg(server.url), None, None, [tok.convert_tokens_to_ids("<|im_end|>")],
                              need_weight_sync=True, **QUICK)
    try:
        assert user.can_reload and user.model_name == server.model_name  # a dev-mode server can train
        out = user.generate([_prompt(tok, "Hi")], SamplingParams(max_new_tokens=4, n=2), seed=1)
        assert len(out[0]) == 2
    finally:
        user.close()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_failed_reload_is_fatal(server: Any, smol: Any) -> None:
    import torch

    _, tok, model = smol
    bad = {k: v for k, v in model.state_dict().items()}
    k = next(k for k in bad if k.endswith("q_proj.weight"))
    bad[k] = torch.zeros(3, 3)  # a shape the model cannot take
    restarts = server.stats["restarts"]
    with pytest.raises(VLLMServerError, match="weight reload to version 9 failed") as e:
        server.load_weights(bad, version=9)
    assert "\n" not in str(e.value) and server.version != 9
    # its weights are unknown now: the next use restarts the server with the last good weights
    p = _prompt(tok, "Write one word.")
    out = server.generate([p], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert server.stats["restarts"] == restarts + 1 and len(out[0][0].token_ids) > 0


@pytest.mark.slow
@pytest.mark.vllm
def test_real_server_refuses_a_model_it_cannot_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HONING_VLLM_PYTHON", _need_vllm())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["NopeForCausalLM"], "model_type": "nope"}))
    t = time.monotonic()
    with pytest.raises(VLLMServerError, match="exited with code") as e:
        make_server_engine(_Cfg(None), tmp_path / "m", None, [2], start_timeout_s=240, **QUICK)
    assert "\n" not in str(e.value) and time.monotonic() - t < 240
    print(str(e.value))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_killed_is_restarted_with_the_pushed_weights(server: Any, smol: Any, capfd: Any) -> None:
    """A server honing started that dies (SIGKILL to the API process) is restarted on the same URL,
    gets back the weights it served, and the request that failed is resubmitted."""
    import signal

    import torch

    _, tok, model = smol
    p = _prompt(tok, "Write one word.")
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    new = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for k, v in new.items():
        if v.dim() == 2 and ".layers." in k:
            v.add_(torch.randn(v.shape, generator=g) * v.std() * 0.1)
    server.load_weights(new, version=5)
    pushed = server.generate([p], greedy)[0][0]
    url, restarts = server.url, server.stats["restarts"]
    os.kill(server.server.proc.pid, signal.SIGKILL)
    out = server.generate([p], greedy)[0][0]
    assert server.stats["restarts"] == restarts + 1 and server.url == url and server.server.alive()
    assert out.token_ids == pushed.token_ids  # the version-5 weights, not the model the server started with
    perturbed = type(model)(model.config)
    perturbed.load_state_dict(new)
    perturbed.eval()
    d_new = sum(abs(a - b) for a, b in zip(out.logprobs, _hf_logprobs(perturbed, p, out.token_ids, 1.0)))
    d_old = sum(abs(a - b) for a, b in zip(out.logprobs, _hf_logprobs(model, p, out.token_ids, 1.0)))
    assert d_old > 3 * d_new, (d_new, d_old)
    assert server.server_weight_version() == "5"
    err = capfd.readouterr().err
    assert sum("vLLM server died" in ln and "restarting it with weights version 5" in ln for ln in err.splitlines()) == 1
    server.set_model(model)
    server.load_weights(None, version=6)  # back to the control weights for the tests that follow


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-server")  # one engine for the group: its tests stay on one worker
def test_real_server_serves_a_lora_runs_merged_weights(server: Any, smol: Any) -> None:
    """A LoRA run pushes the merged policy (base + adapter): the server's log-probs follow the
    adapter, and a zero adapter (a silent no-op push would look the same) is the control."""
    import copy

    import torch

    from honing.config import LoraConfig
    from honing.train.trainer import apply_lora

    _, tok, model = smol
    p = _prompt(tok, "Name a fruit.")
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    server.set_model(model)
    server.load_weights(None, version=10)
    base_out = server.generate([p], greedy)[0][0]
    torch.manual_seed(2)  # lora_A's random init: the same adapter every run (0.142 vs 3 x 0.050 once failed)
    peft = apply_lora(copy.deepcopy(model), LoraConfig(enabled=True, r=8, alpha=16))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, prm in peft.named_parameters():
            if "lora_B" in n:  # lora_B starts at zero: give the adapter a clear effect
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
    server.set_model(peft)
    server.load_weights(None, version=11)
    out = server.generate([p], greedy)[0][0]
    lp_adapted = _hf_logprobs(peft, p, out.token_ids, 1.0)
    lp_base = _hf_logprobs(model, p, out.token_ids, 1.0)
    d_ad = sum(abs(a - b) for a, b in zip(out.logprobs, lp_adapted)) / len(lp_adapted)
    d_base = sum(abs(a - b) for a, b in zip(out.logprobs, lp_base)) / len(lp_base)
    assert d_ad < 0.35 and d_base > 3 * d_ad, (d_ad, d_base)
    assert out.token_ids != base_out.token_ids or d_base > 0.1
    server.set_model(model)
    server.load_weights(None, version=12)
    assert server.generate([p], greedy)[0][0].token_ids == base_out.token_ids
