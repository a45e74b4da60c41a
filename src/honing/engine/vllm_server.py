"""`generation.backend: vllm-server`: the Engine interface over a vLLM OpenAI-compatible server.

Either the server at `generation.server_url` (one you run) or one honing starts on loopback
(`python -m vllm.entrypoints.openai.api_server --model <dir> --host 127.0.0.1 --port <free>
--enable-prefix-caching ...`), with the interpreter of the vLLM venv: `$HONING_VLLM_PYTHON`, else
`.venv-vllm/bin/python` (in the working directory or the checkout honing runs from), else this
interpreter when it can `import vllm`. A server honing starts is stopped on `close()` and at exit.

generate: token ids in (`POST /v1/completions` takes a list of token ids as `prompt`), one request
per prompt with `n` samples (the server batches concurrent requests; prefix caching reuses a shared
history's KV), `return_tokens_as_token_ids` (tokens come back as "token_id:123") and `logprobs: 0`
(the sampled tokens' log-probs; a server honing starts runs with `--logprobs-mode processed_logprobs`,
so they are log p under the distribution actually sampled from: temperature, and top-p/top-k
truncation when set).

load_weights: only a server honing started (or a user's server run with `VLLM_SERVER_DEV_MODE=1`)
can take new weights. The whole state dict (every fused group complete) is written as one
safetensors file under /dev/shm (a temp dir where there is none), then `POST /collective_rpc`
{"method": "reload_weights", "kwargs": {"weights_path": dir}} and `POST /reset_prefix_cache`
(a cached prefix holds the old weights' KV). A failed reload is fatal (`VLLMServerError`).
A user-run server without those dev-mode endpoints serves fixed weights: fine for `honing eval` /
`honing rollout`, refused at start-up for training (`need_weight_sync=True`).

Every failure is one `VLLMServerError` line (a `HoningError`: the CLI prints it and exits 2), never
a hang: connect timeouts and bounded retries, a deadline on start-up, a timeout on every request.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from honing.engine.openai import MAX_BACKOFF_S, RETRY_STATUSES
from honing.engine.scratch import private_dir
from honing.engine.types import Sample, SamplingParams
from honing.errors import HoningError

MIN_VLLM_VERSION = (0, 10, 0)
"""Oldest vLLM whose server honing drives: token-id prompts, `return_tokens_as_token_ids`,
`--logprobs-mode` and the dev-mode `/collective_rpc` + `/reset_prefix_cache` endpoints."""
VLLM_PYTHON_ENV = "HONING_VLLM_PYTHON"
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_RELOAD_ENDPOINTS = ("/collective_rpc", "/reset_prefix_cache")


class VLLMServerError(HoningError):
    """The vLLM server is unreachable, too old, lacks an endpoint, failed to start or to reload."""


def parse_version(text: str) -> tuple[int, ...]:
    """'0.11.2', '0.11.2rc1.dev3+gabc.cpu', 'v0.9' -> (0, 11, 2) / (0, 9); () when unparseable."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        return ()
    return tuple(int(g) for g in m.groups() if g is not None)


def base_url_of(url: str) -> str:
    """`http://h:p`, `http://h:p/`, `http://h:p/v1` -> `http://h:p` (the server root)."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise VLLMServerError(f"generation.server_url must start with http:// or https://, got {url!r}")
    if base.endswith("/v1"):
        base = base[:-3]
    return base


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _can_import_vllm(python: str, timeout_s: float = 120.0) -> str | None:
    """vLLM's version when `python -c 'import vllm'` works, else None."""
    try:
        r = subprocess.run([python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                           capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def find_vllm_python() -> str:
    """The interpreter that starts the server: $HONING_VLLM_PYTHON, a .venv-vllm, or this one."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    if env:
        if _can_import_vllm(env) is None:
            raise VLLMServerError(f"${VLLM_PYTHON_ENV}={env}: that interpreter cannot `import vllm`")
        return env
    roots = [Path.cwd(), Path(__file__).resolve().parents[3]]  # the checkout of an editable install
    for root in roots:
        cand = root / ".venv-vllm" / "bin" / "python"
        if cand.is_file() and _can_import_vllm(str(cand)) is not None:
            return str(cand)
    if importlib.util.find_spec("vllm") is not None and _can_import_vllm(sys.executable) is not None:
        return sys.executable
    raise VLLMServerError("generation.backend=vllm-server needs vLLM: run `make setup-vllm` (creates .venv-vllm), "
                          f"set ${VLLM_PYTHON_ENV} to a Python that has vllm, or set generation.server_url "
                          "to a running server")




def state_dict_of(state: Any) -> dict[str, Any]:
    """A state dict from a state dict or a module; a PEFT (LoRA) module gives its merged weights
    under the base model's names (what the server's checkpoint format expects)."""
    if isinstance(state, Mapping):
        return dict(state)
    if hasattr(state, "merge_adapter") and hasattr(state, "get_base_model"):  # peft.PeftModel
        state.merge_adapter()
        try:
            sd = state.get_base_model().state_dict()
            return {k.replace(".base_layer", ""): v.detach().clone() for k, v in sd.items() if "lora_" not in k}
        finally:
            state.unmerge_adapter()
    if hasattr(state, "state_dict"):
        return dict(state.state_dict())
    raise VLLMServerError(f"load_weights: expected a state dict or a module, got {type(state).__name__}")


def write_checkpoint(sd: Mapping[str, Any], out_dir: Path, dtype: Any = None) -> int:
    """All of `sd` as one model.safetensors in `out_dir` (tied/shared tensors copied, not aliased);
    returns the bytes written."""
    import torch
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        ptr = t.untyped_storage().data_ptr()
        t = t.contiguous().clone() if ptr in seen else t.contiguous()
        seen.add(ptr)
        tensors[name] = t
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / "model.safetensors")
    return (out_dir / "model.safetensors").stat().st_size


class _Http:
    """Bounded HTTP: a connect timeout with retries (exponential backoff) for refused/reset
    connections, 429 and 5xx; a read timeout is not retried. The style of honing.engine.openai."""

    def __init__(self, base: str, timeout_s: float, connect_timeout_s: float, max_retries: int,
                 backoff_s: float, api_key_env: str | None = None, pool: int = 64) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - httpx ships with the `service`/`dev` extras
            raise VLLMServerError("generation.backend=vllm-server needs httpx: pip install 'honing[service]'") from None
        self._httpx = httpx
        self.base, self.timeout_s = base, float(timeout_s)
        self.max_retries, self.backoff_s = int(max_retries), float(backoff_s)
        self.api_key_env = api_key_env
        limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=connect_timeout_s), limits=limits)

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, method: str, path: str, json: Any = None, timeout_s: float | None = None,
                retries: int | None = None, ok_statuses: tuple[int, ...] = ()) -> Any:
        """The response (status < 400 or in ok_statuses); VLLMServerError otherwise."""
        url = self.base + path
        tries = (self.max_retries if retries is None else retries) + 1
        last = "no attempt made"
        timeout = self._httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        for attempt in range(tries):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                r = self._client.request(method, url, json=json, headers=self._headers(), timeout=timeout)
            except self._httpx.TimeoutException as e:
                if isinstance(e, (self._httpx.ConnectTimeout, self._httpx.PoolTimeout)):
                    last = f"connect timeout ({type(e).__name__})"
                    continue
                t = self.timeout_s if timeout_s is None else timeout_s
                raise VLLMServerError(f"vLLM server {url}: no answer within {t:g}s") from None
            except self._httpx.TransportError as e:  # refused, reset, DNS
                last = f"connection error ({type(e).__name__}: {e})"
                continue
            if r.status_code in ok_statuses or r.status_code < 400:
                return r
            if r.status_code in RETRY_STATUSES or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {_one_line(r.text)}"
                continue
            raise VLLMServerError(f"vLLM server {url}: HTTP {r.status_code}: {_one_line(r.text)}")
        raise VLLMServerError(f"vLLM server {url}: gave up after {tries} attempt(s); last: {last}")


def _one_line(text: str, n: int = 300) -> str:
    return " ".join(text.split())[:n]


class ServerProcess:
    """A vLLM OpenAI-compatible server honing started on loopback; stopped on stop() and at exit."""

    def __init__(self, model_dir: Path, python: str, *, port: int | None = None, dtype: str = "auto",
                 max_model_len: int | None = None, seed: int = 0, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, log_dir: Path | None = None) -> None:
        self.model_dir, self.python = Path(model_dir), python
        self.host, self.port = "127.0.0.1", port or free_port()
        self.url = f"http://{self.host}:{self.port}"
        self.served_name = "honing-policy"
        self.cleanup_dir: Path | None = None  # an exported model directory, removed on stop()
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="honing-vllm-log-"))
        self.log_path = self.log_dir / "vllm-server.log"
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
               "--enable-prefix-caching", "--dtype", dtype, "--seed", str(seed),
               "--logprobs-mode", "processed_logprobs", "--disable-uvicorn-access-log"]
        if max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        cmd += list(extra_args)
        self.cmd = cmd
        full_env = dict(os.environ)
        full_env.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                         "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        full_env.update(env or {})
        self.env = full_env
        self.starts = 0
        self._spawn()
        atexit.register(self.stop)

    def _spawn(self) -> None:
        self._log = open(self.log_path, "ab")  # a restart appends: the dead server's last words stay
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        except OSError as e:
            self._log.close()
            raise VLLMServerError(f"cannot start the vLLM server with {self.python}: {e}") from None
        self.starts += 1

    def restart(self, http: _Http, deadline_s: float) -> None:
        """Stop what is left of this server (its whole process group) and start it again on the
        same port with the same model directory; returns once it is healthy."""
        self.stop(remove_files=False)
        self._spawn()
        atexit.register(self.stop)
        self.wait_healthy(http, deadline_s)

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        keep = [ln for ln in text.splitlines() if ln.strip()]
        return "\n".join(keep[-lines:])

    def error_line(self) -> str:
        """The most telling line of the log: the last exception/`Error` line, else the last line."""
        tail = self.log_tail(60).splitlines()
        for i in range(len(tail) - 1, -1, -1):
            ln = tail[i]
            if re.search(r"(Error|Exception|error:)", ln) and not ln.lstrip().startswith("File "):
                nxt = tail[i + 1] if i + 1 < len(tail) else ""
                if nxt and not nxt.lstrip().startswith(("File ", "Traceback")):  # pydantic puts the reason next
                    ln = f"{ln} {nxt}"
                return _one_line(ln)
        return _one_line(tail[-1]) if tail else "(no output)"

    def wait_healthy(self, http: _Http, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            code = self.proc.poll()
            if code is not None:
                raise VLLMServerError(f"the vLLM server for {self.model_dir} exited with code {code} while starting: "
                                      f"{self.error_line()} (full log: {self.log_path})")
            try:
                r = http.request("GET", "/health", timeout_s=2.0, retries=0, ok_statuses=(503,))
                if r.status_code == 200:
                    return
            except VLLMServerError:
                pass
            time.sleep(0.5)
        tail = self.error_line()
        self.stop()
        raise VLLMServerError(f"the vLLM server for {self.model_dir} was not healthy within {deadline_s:g}s "
                              f"(last log line: {tail}; full log: {self.log_path})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0, remove_files: bool = True) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine workers it spawned
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None:  # a server that died leaves its engine workers behind, in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with contextlib.suppress(Exception):
            self._log.close()
        if remove_files and self.cleanup_dir is not None:
            shutil.rmtree(self.cleanup_dir, ignore_errors=True)
            self.cleanup_dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)


class VLLMServerEngine:
    """The Engine protocol (honing.engine.types) over a vLLM OpenAI-compatible server."""

    def __init__(self, http: _Http, model_name: str, eos_ids: Sequence[int], *, server: ServerProcess | None = None,
                 vllm_version: str = "", can_reload: bool = False, weights_dtype: Any = None,
                 request_timeout_s: float = 600.0, reload_timeout_s: float = 300.0, max_concurrency: int = 64) -> None:
        self.http, self.model_name, self.server = http, model_name, server
        self.eos_ids = sorted(set(int(e) for e in eos_ids))
        self.vllm_version, self.can_reload = vllm_version, can_reload
        self.weights_dtype = weights_dtype
        self.request_timeout_s, self.reload_timeout_s = request_timeout_s, reload_timeout_s
        self.max_concurrency = max_concurrency
        self.version = 0
        self.source: Any = None  # the trainer's module: load_weights(None, v) pushes its weights
        self.last_push: dict[str, float] = {}
        self._weights_root: Path | None = None
        self._served: Path | None = None  # the pushed checkpoint the server now serves (re-pushed after a restart)
        self._lock = threading.RLock()
        self.stats = {"restarts": 0}
        self._poisoned = False  # a reload failed: the server's weights are unknown until it restarts
        self.max_restarts = 3
        self.restart_timeout_s = 300.0

    @property
    def url(self) -> str:
        return self.http.base

    def __repr__(self) -> str:
        where = "started by honing" if self.server else "user-run"
        return f"VLLMServerEngine(url={self.url!r}, model={self.model_name!r}, vllm={self.vllm_version!r}, {where})"

    # -- Engine protocol ---------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        """The module whose weights `load_weights(None, v)` pushes (as TransformersEngine.set_model)."""
        self.source = model

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None) -> list[list[Sample]]:
        if not prompts:
            return []
        bodies = [self._body(p, params, None if seed is None else seed + i) for i, p in enumerate(prompts)]
        workers = max(1, min(self.max_concurrency, len(bodies)))

        def run() -> list[list[Sample]]:
            if workers == 1:
                return [self._complete(b, params.n) for b in bodies]
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm-req") as pool:
                return list(pool.map(lambda b: self._complete(b, params.n), bodies))

        return self._restarting(run)  # seeded requests: a resubmitted batch draws the same samples

    # -- a server that dies ------------------------------------------------------------------------
    def _server_down(self) -> bool:
        """Whether the server honing started is gone: exited, or alive but no longer healthy
        (an API process whose engine core died), in which case it is stopped here."""
        if self.server is None:
            return False
        if not self.server.alive():
            return True
        end = time.monotonic() + 15.0
        while time.monotonic() < end:  # vLLM's API server exits shortly after its engine core dies
            if not self.server.alive():
                return True
            try:
                if self.http.request("GET", "/health", timeout_s=2.0, retries=0, ok_statuses=(503,)).status_code == 200:
                    return False
            except VLLMServerError:
                pass
            time.sleep(0.5)
        return True

    def _restarting(self, fn: Any) -> Any:
        """fn(); if it fails because the server honing started died, restart the server, re-push the
        weights it served and run fn once more. A user-run server, or a second failure, is fatal.
        A server whose last reload failed (its weights unknown) is restarted before fn runs."""
        if self._poisoned:
            self._restart("had a failed weight reload (its weights are unknown)")
        try:
            return fn()
        except VLLMServerError as e:
            if self.stats["restarts"] >= self.max_restarts or not self._server_down():
                raise
            first = str(e)
        code = self.server.proc.poll() if self.server is not None else None
        self._restart(f"died ({'exit code ' + str(code) if code is not None else 'unhealthy'}: {_one_line(first, 160)})")
        return fn()

    def _restart(self, why: str) -> None:
        """Restart the server honing started on the same port and re-push the weights it last served."""
        assert self.server is not None
        with self._lock:
            sys.stderr.write(f"honing: the vLLM server {why}; restarting it with weights version {self.version}\n")
            self.stats["restarts"] += 1
            self.server.restart(self.http, self.restart_timeout_s)
            self._poisoned = False
            if self._served is not None:
                self._reload(self._served, self.version)

    def load_weights(self, state: object, version: int) -> None:
        """Push new policy weights (a state dict, a module, or None for the set_model module) and
        reload them in the server; fatal (VLLMServerError) when the server cannot or does not."""
        if state is None and self.source is None:
            self.version = version  # nothing to push: the server's weights are the policy's
            return
        if not self.can_reload:
            raise VLLMServerError(f"vLLM server {self.url} cannot take new weights (no {' / '.join(_RELOAD_ENDPOINTS)}: "
                                  "run it with VLLM_SERVER_DEV_MODE=1, or let honing start it: unset generation.server_url)")
        sd = state_dict_of(self.source if state is None else state)
        with self._lock:
            t0 = time.monotonic()
            if self._weights_root is None:
                self._weights_root = private_dir("honing-vllm-weights-")
                atexit.register(self.close)  # a /dev/shm checkpoint must not outlive the run
            root = self._weights_root
            out = root / f"v{version}"
            try:
                nbytes = write_checkpoint(sd, out, self.weights_dtype)
            except OSError as e:
                raise VLLMServerError(f"cannot write the weights for version {version} to {out}: {e}") from None
            t1 = time.monotonic()
            try:
                self._restarting(lambda: self._reload(out, version))
            except VLLMServerError:
                self._poisoned = self.server is not None  # restarted before its next use
                raise
            t2 = time.monotonic()
            self._served = out
            for old in root.iterdir():  # keep only the version the server now serves
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
            self.version = version
            self.last_push = {"bytes": float(nbytes), "write_s": t1 - t0, "reload_s": t2 - t1}

    def _reload(self, path: Path, version: int) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path), "is_checkpoint_format": True},
                "timeout": self.reload_timeout_s}
        try:
            r = self.http.request("POST", "/collective_rpc", json=body, timeout_s=self.reload_timeout_s + 30, retries=0)
            self.http.request("POST", "/reset_prefix_cache", timeout_s=60.0, retries=1)
            self.http.request("POST", "/update_weight_version", json={"new_version": str(version)}, timeout_s=30.0,
                              retries=1, ok_statuses=(404,))  # vLLM's own record of what it serves, where it has one
        except VLLMServerError as e:
            dead = f" (server exited: {self.server.error_line()})" if self.server and not self.server.alive() else ""
            raise VLLMServerError(f"weight reload to version {version} failed, the engine's weights are unknown: "
                                  f"{e}{dead}") from None
        try:
            results = r.json().get("results", [])
        except ValueError:
            results = []
        for res in results if isinstance(results, list) else []:
            if isinstance(res, dict) and res.get("error"):
                raise VLLMServerError(f"weight reload to version {version} failed: {_one_line(str(res['error']))}")

    def server_weight_version(self) -> str | None:
        """The weight version the server reports (`GET /weight_info`), None where it has no such endpoint."""
        r = self.http.request("GET", "/weight_info", timeout_s=10.0, ok_statuses=(404,))
        if r.status_code == 404:
            return None
        try:
            v = r.json().get("weight_version")
        except (ValueError, AttributeError):
            return None
        return None if v is None else str(v)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if self.server is not None:
            self.server.stop()
        self.http.close()
        if self._weights_root is not None:
            shutil.rmtree(self._weights_root, ignore_errors=True)
            self._weights_root = None

    def __enter__(self) -> "VLLMServerEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------------
    def _body(self, prompt: Sequence[int], params: SamplingParams, seed: int | None) -> dict[str, Any]:
        if not prompt:
            raise VLLMServerError("vllm-server: an empty prompt (the server needs at least one token)")
        body: dict[str, Any] = {
            "model": self.model_name, "prompt": [int(t) for t in prompt], "n": int(params.n),
            "max_tokens": int(params.max_new_tokens), "temperature": float(params.temperature),
            "top_p": float(params.top_p), "logprobs": 0, "return_tokens_as_token_ids": True,
            "stop_token_ids": self.eos_ids, "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if params.top_k > 0:
            body["top_k"] = int(params.top_k)
        if seed is not None:
            body["seed"] = int(seed)
        return body

    def _complete(self, body: dict[str, Any], n: int) -> list[Sample]:
        r = self.http.request("POST", "/v1/completions", json=body, timeout_s=self.request_timeout_s)
        try:
            choices = sorted(r.json()["choices"], key=lambda c: c.get("index", 0))
        except (ValueError, KeyError, TypeError):
            raise VLLMServerError(f"vLLM server {self.url}/v1/completions: unexpected response: {_one_line(r.text)}") from None
        if len(choices) != n:
            raise VLLMServerError(f"vLLM server {self.url}: asked for n={n} samples, got {len(choices)}")
        return [self._sample(c) for c in choices]

    def _sample(self, choice: Mapping[str, Any]) -> Sample:
        lp = choice.get("logprobs") or {}
        tokens, logprobs = lp.get("tokens"), lp.get("token_logprobs")
        if not isinstance(tokens, list) or not isinstance(logprobs, list) or len(tokens) != len(logprobs):
            raise VLLMServerError(f"vLLM server {self.url}: a completion without per-token logprobs "
                                  f"(does it support `logprobs` and `return_tokens_as_token_ids`?): {_one_line(str(choice))}")
        ids = []
        for t in tokens:
            m = _TOKEN_ID.match(str(t))
            if not m:
                raise VLLMServerError(f"vLLM server {self.url}: token {t!r} is not 'token_id:N' "
                                      "(this server ignores return_tokens_as_token_ids; vLLM >= "
                                      f"{'.'.join(map(str, MIN_VLLM_VERSION))} needed)")
            ids.append(int(m.group(1)))
        lps = tuple(float(x) if x is not None else 0.0 for x in logprobs)
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise VLLMServerError(f"vLLM server {self.url}: finish_reason {reason!r} (expected stop or length)")
        return Sample(tuple(ids), lps, reason)  # type: ignore[arg-type]


def probe_server(http: _Http, need_reload: bool) -> tuple[str, str, bool]:
    """(vLLM version, served model name, has reload endpoints) of the server at `http.base`;
    VLLMServerError when it is unreachable, not vLLM, too old, or lacks an endpoint it needs."""
    t = min(10.0, http.timeout_s)
    r = http.request("GET", "/version", timeout_s=t, ok_statuses=(404,))
    if r.status_code == 404:
        raise VLLMServerError(f"{http.base} is not a vLLM server (no /version endpoint); generation.backend=vllm-server "
                              "needs vLLM's OpenAI-compatible server")
    try:
        version = str(r.json()["version"])
    except (ValueError, KeyError, TypeError):
        raise VLLMServerError(f"{http.base}/version: unexpected answer {_one_line(r.text)!r} (not a vLLM server?)") from None
    parsed = parse_version(version)
    need = ".".join(map(str, MIN_VLLM_VERSION))
    if not parsed or parsed < MIN_VLLM_VERSION:
        raise VLLMServerError(f"vLLM server {http.base} runs vLLM {version}; honing needs vLLM >= {need} "
                              "(token-id prompts with return_tokens_as_token_ids and sampled-token logprobs)")
    r = http.request("GET", "/v1/models", timeout_s=t, ok_statuses=(404,))
    if r.status_code == 404:
        raise VLLMServerError(f"vLLM server {http.base} has no /v1/models endpoint (vLLM {version}); "
                              "honing needs the OpenAI-compatible API server")
    try:
        model = str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise VLLMServerError(f"vLLM server {http.base}/v1/models lists no model: {_one_line(r.text)}") from None
    r = http.request("GET", "/v1/completions", timeout_s=t, ok_statuses=(404, 405))
    if r.status_code == 404:
        raise VLLMServerError(f"vLLM server {http.base} has no /v1/completions endpoint (vLLM {version})")
    # A route that exists answers a GET on a POST-only endpoint with 405; a missing one with 404.
    can_reload = all(http.request("GET", p, timeout_s=t, ok_statuses=(404, 405)).status_code != 404
                     for p in _RELOAD_ENDPOINTS)
    if need_reload and not can_reload:
        raise VLLMServerError(f"vLLM server {http.base} (vLLM {version}) cannot take new weights: no "
                              f"{' and '.join(_RELOAD_ENDPOINTS)} endpoints. A user-run server serves fixed weights "
                              "(fine for `honing eval` / `honing rollout`); to train, run it with VLLM_SERVER_DEV_MODE=1 "
                              "or unset generation.server_url so honing starts one")
    return version, model, can_reload


def _export_model(model: Any, tok: Any) -> Path:
    """Save an in-memory model (and its tokenizer) as a Hugging Face directory the server can load."""
    out = private_dir("honing-vllm-model-", Path(tempfile.gettempdir()))
    try:
        model.save_pretrained(out, safe_serialization=True)
        if tok is not None:
            tok.save_pretrained(out)
    except Exception as e:  # noqa: BLE001 - any failure means "cannot hand this model to vLLM"
        shutil.rmtree(out, ignore_errors=True)
        raise VLLMServerError(f"vllm-server: cannot save the model for the server: {type(e).__name__}: {e}") from None
    return out


def default_dtype() -> str:
    """bf16 where matmuls in bf16 are fast (CUDA, or a CPU with AMX / AVX512-BF16), else fp32."""
    try:
        import torch

        from honing.engine.hf import bf16_supported
    except ImportError:  # pragma: no cover
        return "float32"
    return "bfloat16" if (torch.cuda.is_available() or bf16_supported("cpu")) else "float32"


def make_server_engine(cfg: Any, model_dir: Any, tok: Any, eos_ids: Sequence[int], *,
                       need_weight_sync: bool = False, start_timeout_s: float = 300.0, connect_timeout_s: float = 5.0,
                       max_retries: int = 3, backoff_s: float = 0.5, request_timeout_s: float = 600.0,
                       dtype: str | None = None, max_model_len: int | None = None, enforce_eager: bool | None = None,
                       extra_args: Sequence[str] = (), server_env: Mapping[str, str] | None = None,
                       seed: int | None = None, api_key_env: str | None = None) -> VLLMServerEngine:
    """A VLLMServerEngine for `cfg.generation` (a RunConfig, a GenerationConfig, or None for the
    defaults): the server at `server_url`, or one started here for `model_dir`: a Hugging Face model
    directory, or an in-memory model (saved to a temp dir with `tok`; `load_weights(None, v)` then
    pushes that module's current weights, as with TransformersEngine).

    `need_weight_sync=True` (training) makes a user-run server without the reload endpoints an error
    here, at start-up; otherwise that surfaces at the first weight push (`set_model` + `load_weights`).
    `tok` is only used to save an in-memory model."""
    gen = getattr(cfg, "generation", cfg)
    url = getattr(gen, "server_url", None) if gen is not None else None
    conc = int(getattr(gen, "max_batch_size", 64) or 64)
    if seed is None:
        seed = int(getattr(cfg, "seed", 0) or 0)
    if url:
        http = _Http(base_url_of(url), request_timeout_s, connect_timeout_s, max_retries, backoff_s, api_key_env, conc)
        try:
            version, model, can_reload = probe_server(http, need_weight_sync)
        except BaseException:
            http.close()
            raise
        return VLLMServerEngine(http, model, eos_ids, vllm_version=version, can_reload=can_reload,
                                request_timeout_s=request_timeout_s, max_concurrency=conc)
    if model_dir is None:
        raise VLLMServerError("generation.backend=vllm-server without generation.server_url needs a model "
                              "(a Hugging Face model directory or a loaded model)")
    source, exported = None, None
    if isinstance(model_dir, (str, os.PathLike)):
        mdir = Path(model_dir).expanduser()
        if not mdir.is_dir():
            raise VLLMServerError(f"vllm-server: model directory {mdir} does not exist")
        if not (mdir / "config.json").is_file():
            raise VLLMServerError(f"vllm-server: {mdir} is not a Hugging Face model directory (no config.json)")
    elif hasattr(model_dir, "save_pretrained"):
        source = model_dir
        python = find_vllm_python()  # before the (slow) save: no vLLM is the likelier failure
        mdir = exported = _export_model(model_dir, tok)
    else:
        raise VLLMServerError(f"vllm-server: expected a model directory or a model, got {type(model_dir).__name__}")
    dtype = dtype or default_dtype()
    if enforce_eager is None:  # CUDA graphs pay off on a GPU; on CPU they only slow start-up
        import torch

        enforce_eager = not torch.cuda.is_available()
    args = [*extra_args, *(["--enforce-eager"] if enforce_eager else [])]
    try:
        if source is None:
            python = find_vllm_python()
        server = ServerProcess(mdir.resolve(), python, dtype=dtype, max_model_len=max_model_len, seed=seed,
                               extra_args=args, env=server_env)
    except BaseException:
        if exported is not None:
            shutil.rmtree(exported, ignore_errors=True)
        raise
    server.cleanup_dir = exported
    http = _Http(server.url, request_timeout_s, connect_timeout_s, max_retries, backoff_s, None, conc)
    try:
        server.wait_healthy(http, start_timeout_s)
        version, model, can_reload = probe_server(http, True)
    except BaseException:
        server.stop()
        http.close()
        raise
    import torch

    wdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
              "float32": torch.float32, "float": torch.float32}.get(dtype)
    eng = VLLMServerEngine(http, model, eos_ids, server=server, vllm_version=version, can_reload=can_reload,
                           weights_dtype=wdtype, request_timeout_s=request_timeout_s, max_concurrency=conc)
    eng.source = source
    return eng
