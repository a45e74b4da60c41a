"""Concurrent clients against `honing serve` on loopback (a real server process, real uvicorn):
throughput, latency p50/p99, and the check that no request is lost or logged twice.

The same request stream is sent twice, side by side in one script: by one client at a time (the
baseline: no batching possible) and by --clients concurrent clients (the batcher merges them).
Every request carries a unique marker; afterwards the log store must hold each answered request
exactly once (by response id and by marker) and none of the --no-log ones.

    .venv/bin/python benchmarks/serve_load.py                            # tiny-random, 8 clients
    .venv/bin/python benchmarks/serve_load.py --model smollm2-135m-instruct --requests 48 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))] if s else float("nan")


async def phase(url: str, tag: str, n: int, clients: int, max_tokens: int, deadline: float,
                no_log_every: int) -> dict:
    sem = asyncio.Semaphore(clients)
    lat: list[float] = []
    results: dict[str, dict] = {}
    failures: list[str] = []

    async def one(c: httpx.AsyncClient, i: int) -> None:
        marker = f"{tag}-{i:05d}"
        headers = {"X-Honing-No-Log": "1"} if no_log_every and i % no_log_every == 0 else {}
        async with sem:
            if time.monotonic() > deadline:
                failures.append(f"{marker}: not sent (time limit)")
                return
            t0 = time.perf_counter()
            try:
                r = await c.post("/v1/chat/completions", headers=headers, json={
                    "messages": [{"role": "user", "content": f"request {marker}: say something"}],
                    "max_tokens": max_tokens, "temperature": 0})
            except httpx.HTTPError as e:
                failures.append(f"{marker}: {type(e).__name__}")
                return
            lat.append(time.perf_counter() - t0)
            if r.status_code != 200:
                failures.append(f"{marker}: HTTP {r.status_code}")
                return
            results[marker] = {"id": r.json()["id"], "tokens": r.json()["usage"]["completion_tokens"],
                               "logged": not headers}

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients + 2)) as c:
        await asyncio.gather(*(one(c, i) for i in range(n)))
    wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in results.values())
    return {"tag": tag, "sent": n, "ok": len(results), "failures": failures, "wall_s": wall,
            "req_per_s": len(results) / wall, "tokens_per_s": toks / wall, "p50": pct(lat, 50), "p99": pct(lat, 99),
            "results": results}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--time-limit-s", type=float, default=300.0, help="stop sending after this (bounded run)")
    ap.add_argument("--no-log-every", type=int, default=8, help="every k-th request opts out of logging")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="honing-serve-load-")) / "logs"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    honing = str(Path(sys.executable).with_name("honing"))
    proc = subprocess.Popen([honing, "serve", args.model, "--port", str(port), "--log-dir", str(logs),
                             "--max-batch-size", str(max(args.clients, 1) * 2)], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("honing serve did not come up")
            time.sleep(0.5)
        stop_at = time.monotonic() + args.time_limit_s
        base_n = max(args.requests // 4, args.clients)
        base = asyncio.run(phase(url, "seq", base_n, 1, args.max_tokens, stop_at, args.no_log_every))
        conc = asyncio.run(phase(url, "conc", args.requests, args.clients, args.max_tokens, stop_at,
                                 args.no_log_every))
        metrics = httpx.get(url + "/metrics", timeout=10).json()
    finally:
        proc.terminate()
        proc.wait(30)

    from honing.serve.logstore import read_records

    recs = [r for _, _, r in read_records(logs)]
    bad_lines = sum(r is None for r in recs)
    ids = [r["id"] for r in recs if r]
    markers = [m for r in recs if r for m in [r["request"]["messages"][0]["content"].split()[1].rstrip(":")]]
    problems: list[str] = []
    for ph in (base, conc):
        problems += ph["failures"]
        for marker, r in ph["results"].items():
            want = 1 if r["logged"] else 0
            if ids.count(r["id"]) != want or markers.count(marker) != want:
                problems.append(f"{marker}: logged {ids.count(r['id'])} times (want {want})")
    if bad_lines:
        problems.append(f"{bad_lines} unreadable log lines")
    for ph in (base, conc):
        clients = 1 if ph is base else args.clients
        print(f"{ph['tag']:<5} clients {clients:>2}: {ph['ok']}/{ph['sent']} ok in {ph['wall_s']:.1f} s, "
              f"{ph['req_per_s']:.2f} req/s, {ph['tokens_per_s']:.1f} tokens/s, latency p50 {ph['p50']:.3f} s "
              f"p99 {ph['p99']:.3f} s")
    print(f"server /metrics: {metrics['requests']} requests, mean batch {metrics['mean_batch_requests']}, "
          f"max batch {metrics['max_batch_requests']}, p50 {metrics['latency_s']['p50']}, "
          f"p99 {metrics['latency_s']['p99']}")
    print(f"log store: {len(ids)} records in {len(list(logs.iterdir()))} file(s); lost or duplicated: "
          f"{len(problems)}" + (f" (first: {problems[0]})" if problems else ""))
    print(f"RATIO concurrent_vs_sequential_tokens_per_s={conc['tokens_per_s'] / max(base['tokens_per_s'], 1e-9):.2f} "
          f"p50_s={conc['p50']:.3f} p99_s={conc['p99']:.3f} lost_or_duplicated={len(problems)}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
