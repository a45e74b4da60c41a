"""`honing sandbox ...`: run code in a box, check what isolation this machine gives, serve boxes over HTTP."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from honing.errors import HoningError

sandbox_app = typer.Typer(help="Run code in the isolated sandbox; check what isolation this machine gives.")


@sandbox_app.command("exec", context_settings={"allow_interspersed_args": False})
def sandbox_exec(
    cmd: list[str] = typer.Argument(..., help="Command and arguments (put them after --)"),
    profile: str = typer.Option("python", "--profile", help="Toolchain profile: python, shell"),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s", help="Wall-time limit"),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", help="Memory limit"),
    cpu_s: Optional[float] = typer.Option(None, "--cpu-s", help="CPU-time limit"),
    files: Optional[Path] = typer.Option(None, "--files", help="Directory copied into the box's /work"),
    backend: str = typer.Option("bwrap", "--backend", help="bwrap (default) or local (UNSAFE, no isolation)"),
    as_json: bool = typer.Option(False, "--json", help="Print the ExecResult as JSON"),
) -> None:
    """Run CMD in a fresh box and print the result; exits with the command's exit code."""
    from honing.sandbox import Limits, Sandbox

    limits = Limits().replace(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s)
    res = Sandbox(backend, limits).exec(cmd, profile=profile, files_dir=files)
    if as_json:
        typer.echo(json.dumps(res.to_json(), indent=1))
    else:
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        flags = [f for f in ("timed_out", "oom", "truncated") if getattr(res, f)]
        typer.echo(f"[exit {res.exit_code}{' signal ' + str(res.signal) if res.signal else ''} "
                   f"{res.wall_s * 1000:.0f} ms {res.backend}{' ' + ' '.join(flags) if flags else ''}]", err=True)
    if res.infra_error:
        typer.echo(f"honing: sandbox infrastructure error: {res.infra_error}", err=True)
        raise typer.Exit(3)
    raise typer.Exit(res.exit_code if 0 <= res.exit_code < 256 else 1)


@sandbox_app.command("doctor")
def sandbox_doctor(backend: str = typer.Option("bwrap", "--backend")) -> None:
    """Report which isolation and limit mechanisms are active here, and prove them with a probe."""
    from honing.sandbox import Limits, Sandbox

    sb = Sandbox(backend)
    for k, v in sb.mechanisms().items():
        typer.echo(f"{k:<11} {v}")
    probe = sb.exec(["python3", "-c", "import os, socket\ntry:\n socket.create_connection(('1.1.1.1', 53), 1)"
                     "\n print('network: REACHABLE')\nexcept OSError:\n print('network: blocked')\n"
                     "print('uid:', os.getuid(), 'procs visible:', len([p for p in os.listdir('/proc') if p.isdigit()]))"],
                    limits=Limits(timeout_s=10))
    typer.echo(f"probe       {probe.stdout.strip()} ({probe.wall_s * 1000:.0f} ms, exit {probe.exit_code})")
    if probe.infra_error or probe.exit_code != 0 or "REACHABLE" in probe.stdout:
        typer.echo(f"honing: sandbox doctor: probe failed: {probe.infra_error or probe.stderr.strip()}", err=True)
        raise typer.Exit(1)
    from honing.sandbox.doctor import check_profiles

    checks = check_profiles(sb)
    for c in checks:
        typer.echo(f"profile     {c.name:<7} {c.status:<8} {c.detail}")
    broken = [c.name for c in checks if c.failed]
    if broken:
        typer.echo(f"honing: sandbox doctor: profile(s) {', '.join(broken)} do not work here", err=True)
        raise typer.Exit(1)


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (loopback only unless --allow-remote)"),
    port: int = typer.Option(8787, "--port", help="TCP port"),
    backend: str = typer.Option("bwrap", "--backend", help="Isolation backend: bwrap (default) or local (UNSAFE)"),
    token_env: str = typer.Option("HONING_SANDBOX_TOKEN", "--token-env", metavar="NAME",
                                  help="Environment variable holding the bearer token (never pass it as an argument)"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", min=1,
                                                  help="Boxes running at once (default: CPU count)"),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host (put TLS in front)"),
) -> None:
    """Serve the sandbox over HTTP (POST /v1/exec, /v1/sessions...), bearer-token protected."""
    from honing.sandbox.service import serve

    token = os.environ.get(token_env, "")
    if not token.strip():
        raise HoningError(f"sandbox serve: ${token_env} is not set or empty; "
                          f"e.g. `export {token_env}=$(openssl rand -hex 32)`")
    serve(host=host, port=port, token=token, backend=backend, max_concurrency=max_concurrency,
          allow_remote=allow_remote)


@sandbox_app.command("health")
def sandbox_health(
    url: str = typer.Option("http://127.0.0.1:8787", "--url", help="Base URL of a running sandbox service"),
    token_env: str = typer.Option("HONING_SANDBOX_TOKEN", "--token-env", metavar="NAME",
                                  help="Environment variable holding the bearer token"),
) -> None:
    """Check a running sandbox service: print its backend and isolation mechanisms as JSON."""
    from honing.sandbox.client import RemoteSandbox

    with RemoteSandbox(url, os.environ.get(token_env, ""), timeout_s=10) as remote:
        typer.echo(json.dumps(remote.health(), indent=2))


@sandbox_app.command("bench")
def sandbox_bench(jobs: int = typer.Option(200, "--jobs"), pool: int = typer.Option(2, "--pool")) -> None:
    """Cold box vs warm pool vs plain subprocess throughput (benchmarks/sandbox_throughput.py)."""
    import runpy

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "sandbox_throughput.py"
    if not script.exists():
        raise HoningError(f"benchmark script not found: {script} (it ships with the source checkout)")
    sys.argv = [str(script), "--jobs", str(jobs), "--pool", str(pool)]
    runpy.run_path(str(script), run_name="__main__")
