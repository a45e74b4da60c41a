"""Running `honing serve`: in the foreground (the CLI) or on a background thread (tests, the
Python API, benchmarks) with real uvicorn on a pre-bound socket."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from honing.errors import HoningError

TOKEN_ENV = "HONING_SERVE_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_server(spec: str, *, host: str = "127.0.0.1", token: str | None = None, log_dir: Path | str | None = None,
                 registry: Path | str | None = None, backend: str = "hf", max_batch_size: int = 32,
                 window_s: float = 0.01, log_max_file_bytes: int = 64 << 20, log_retention_files: int = 50,
                 log_retention_days: float | None = 30.0, follow_s: float = 1.0, max_tokens_limit: int = 1024,
                 default_max_tokens: int = 256, device: str = "auto") -> Any:
    """Load the model and build the `Server` state (checks first: a missing release or a
    non-loopback host without a token fails here, before anything listens)."""
    from honing.serve.app import Server
    from honing.serve.logstore import LogStore
    from honing.serve.model import is_release_spec, load_served

    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    if not is_loopback(host) and not (token and token.strip()):
        raise HoningError(f"serving on non-loopback host {host!r} needs a bearer token: set ${TOKEN_ENV} "
                          f"(e.g. `export {TOKEN_ENV}=$(openssl rand -hex 32)`) or pass --token-env")
    served = load_served(spec, registry=registry, backend=backend, max_batch_size=max_batch_size, device=device)
    log = (LogStore(log_dir, log_max_file_bytes, log_retention_files, log_retention_days)
           if log_dir is not None else None)
    follow = registry_path(registry) if spec.strip() == "release:current" else None
    served_id = spec.strip()[len("release:"):] if is_release_spec(spec.strip()) else None
    return Server(served, token=token, log=log, served_id=served_id, window_s=window_s,
                  max_tokens_limit=max_tokens_limit, default_max_tokens=default_max_tokens,
                  follow_registry=follow, follow_s=follow_s, backend=backend, max_batch_size=max_batch_size,
                  device=device)


def registry_path(registry: Path | str | None) -> Path:
    from honing.release.registry import default_root

    return Path(registry) if registry is not None else default_root()


class RunningServer:
    """uvicorn serving a `Server` on a background thread; `.url` is its base URL (…/v1 is the
    OpenAI base URL). Use as a context manager or call `stop()`."""

    def __init__(self, server: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        from honing.serve.app import create_app

        self.server = server
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.uv = uvicorn.Server(uvicorn.Config(create_app(server), log_level="warning", lifespan="off",
                                                access_log=False))
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise HoningError("honing serve: uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(15)
        self.sock.close()
        self.server.close()

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(spec: str, *, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> RunningServer:
    """Serve `spec` (model, run, `release:NAME` or `release:current`) in this process, in the
    background; keyword arguments as `build_server` (log_dir, registry, token, ...)."""
    return RunningServer(build_server(spec, host=host, **kwargs), host, port)


def serve_forever(spec: str, *, host: str = "127.0.0.1", port: int = 8000, on_ready: Any = None,
                  **kwargs: Any) -> None:
    """The CLI's foreground server (Ctrl-C stops it); `on_ready(server)` once the model is loaded."""
    import uvicorn

    from honing.serve.app import create_app

    server = build_server(spec, host=host, **kwargs)
    if on_ready is not None:
        on_ready(server)
    try:
        uvicorn.run(create_app(server), host=host, port=port, log_level="warning", access_log=False)
    finally:
        server.close()
