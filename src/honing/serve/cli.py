"""`honing serve`: the command (registered in honing/cli.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from honing.errors import HoningError


def serve_cmd(
    spec: str = typer.Argument(..., help="Model spec, run dir (RUN or RUN@step-N), release:NAME, or release:current "
                               "(follows the registry's pointer: promote/rollback switch the served model)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address; anything but loopback needs a token"),
    port: int = typer.Option(8000, "--port"),
    registry: Optional[Path] = typer.Option(None, "--registry", help="Release registry (default $HONING_RELEASES "
                                            "or ./releases)"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="Raw request/response log store (JSONL, 0700/0600); "
                                           "no logging without it. Requests with X-Honing-No-Log: 1 are never logged"),
    token_env: str = typer.Option("HONING_SERVE_TOKEN", "--token-env", help="Environment variable holding the bearer "
                                  "token (required off loopback; optional on it)"),
    engine: str = typer.Option("hf", "--engine", help="hf (honing's decode loop) or vllm (GPU, .venv-vllm)"),
    device: str = typer.Option("auto", "--device", help="hf engine device: auto (a GPU when there is one), cpu, cuda"),
    max_batch_size: int = typer.Option(32, "--max-batch-size", min=1, help="Rows per generate call"),
    batch_window_ms: float = typer.Option(10.0, "--batch-window-ms", min=0, help="How long the batcher waits for "
                                          "more requests after the first"),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=1, help="Largest max_tokens a request may ask"),
    log_max_mb: float = typer.Option(64.0, "--log-max-mb", help="Rotate a log file past this size"),
    log_retention_files: int = typer.Option(50, "--log-retention-files", min=1, help="Keep at most this many files"),
    log_retention_days: float = typer.Option(30.0, "--log-retention-days", help="Delete log files older than this "
                                             "(0: no age limit)"),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    streaming), batching concurrent requests; /health and /metrics."""
    from honing.serve.server import serve_forever

    token = os.environ.get(token_env) or None
    if token_env != "HONING_SERVE_TOKEN" and token is None:
        raise HoningError(f"--token-env {token_env}: that variable is not set")
    def ready(server: object) -> None:
        typer.echo(f"honing serve: {getattr(server, 'served').name} on http://{host}:{port}/v1 (engine {engine}, "
                   f"{'token required' if token else 'no token: loopback only'}, "
                   f"log {'to ' + str(log_dir) if log_dir else 'off'})", err=True)

    serve_forever(spec, host=host, port=port, on_ready=ready, token=token, log_dir=log_dir, registry=registry, backend=engine, device=device,
                  max_batch_size=max_batch_size, window_s=batch_window_ms / 1000,
                  log_max_file_bytes=int(log_max_mb * (1 << 20)), log_retention_files=log_retention_files,
                  log_retention_days=log_retention_days or None, max_tokens_limit=max_tokens)
