"""Sandbox throughput: plain subprocess vs cold bubblewrap boxes vs the warm pool.

Runs the same small Python "unit test" job N times through
  (a) subprocess: `python3 main.py` in a fresh temp dir, NO isolation at all (the floor a
      sandbox is compared against);
  (b) cold:       a fresh bwrap box per job (honing.sandbox.bwrap.BwrapBackend);
  (c) warm:       honing.sandbox.warm.WarmPool (forks per job inside long-lived boxes);
each with --pool concurrent callers, in interleaved rounds (so that a slow patch of a
shared machine hits every mode alike), and prints jobs/s, p50 and p99 latency and ratios.
Also times Session snapshot + restore of a 100-file workspace.

    python benchmarks/sandbox_throughput.py --jobs 200 --pool 2

The last line is `RATIO warm_vs_cold=<x> warm_vs_subprocess=<y>` (jobs/s ratios).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from honing.sandbox import Limits, Sandbox
from honing.sandbox.bwrap import BwrapBackend
from honing.sandbox.profiles import get_profile
from honing.sandbox.warm import WarmPool
from honing.sandbox.workspace import Workspace

SYSTEM_PYTHON = "/usr/bin/python3"

JOB = '''\
def fizzbuzz(n):
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)


def test_fizzbuzz():
    assert fizzbuzz(3) == "Fizz"
    assert fizzbuzz(10) == "Buzz"
    assert fizzbuzz(30) == "FizzBuzz"
    assert [fizzbuzz(i) for i in range(1, 6)] == ["1", "2", "Fizz", "4", "Buzz"]


test_fizzbuzz()
print("PASS")
'''


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class _Mode:
    """Latencies and busy time of one mode, accumulated over interleaved rounds."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.total = 0.0
        self.failures = 0

    def drive(self, n: int, conc: int, job: Callable[[], bool]) -> None:
        """Run `job` n times from `conc` threads."""

        def one(_: int) -> None:
            t = time.perf_counter()
            ok = job()
            self.lat.append(time.perf_counter() - t)
            if not ok:
                self.failures += 1

        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as ex:
            list(ex.map(one, range(n)))
        self.total += time.perf_counter() - t0

    def summary(self) -> dict[str, float]:
        return {"jobs_s": len(self.lat) / self.total, "p50_ms": _pct(self.lat, 0.5) * 1e3,
                "p99_ms": _pct(self.lat, 0.99) * 1e3, "failures": self.failures, "total_s": self.total}


def plain_job() -> bool:
    d = tempfile.mkdtemp(prefix="bench-plain-")
    try:
        Path(d, "main.py").write_text(JOB)
        p = subprocess.run([SYSTEM_PYTHON, "main.py"], cwd=d, capture_output=True, timeout=30)
        return p.returncode == 0 and p.stdout == b"PASS\n"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def make_cold_job(limits: Limits) -> Callable[[], bool]:
    backend = BwrapBackend()
    profile = get_profile("python")

    def job() -> bool:
        ws = Workspace({"main.py": JOB})
        try:
            r = backend.run([SYSTEM_PYTHON, "main.py"], ws.path, profile, limits)
            return r.ok and r.stdout == "PASS\n"
        finally:
            ws.close()

    return job


def snapshot_roundtrip(rounds: int) -> dict[str, float]:
    """Session snapshot + restore of a 100-file workspace, one file changed in between."""
    files = {f"pkg/mod_{i:03d}.py": f"VALUE_{i} = {i}\n" * 4 for i in range(100)}
    sb = Sandbox()
    snap, rest, both = [], [], []
    try:
        with sb.open(files=files) as session:
            for i in range(rounds):
                t0 = time.perf_counter()
                sid = session.snapshot()
                t1 = time.perf_counter()
                session.write("pkg/mod_000.py", f"changed = {i}\n")
                t2 = time.perf_counter()
                session.restore(sid)
                t3 = time.perf_counter()
                snap.append(t1 - t0)
                rest.append(t3 - t2)
                both.append((t1 - t0) + (t3 - t2))
            assert session.read("pkg/mod_000.py") == files["pkg/mod_000.py"].encode()
    finally:
        sb.close()
    return {"snapshot_p50_ms": _pct(snap, 0.5) * 1e3, "restore_p50_ms": _pct(rest, 0.5) * 1e3,
            "p50_ms": _pct(both, 0.5) * 1e3, "p99_ms": _pct(both, 0.99) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs per mode (default 200)")
    ap.add_argument("--pool", type=int, default=2, help="warm cells = concurrent callers in every mode (default 2)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds the jobs are split into (default 4)")
    ap.add_argument("--snapshot-rounds", type=int, default=50)
    args = ap.parse_args()
    if not os.path.exists(SYSTEM_PYTHON):
        print(f"needs {SYSTEM_PYTHON}", file=sys.stderr)
        return 2
    limits = Limits(timeout_s=30)
    busy = subprocess.run(["pgrep", "-f", "honing train"], capture_output=True, text=True).stdout.split()
    args.rounds = max(1, min(args.rounds, args.jobs))
    print(f"cpus={os.cpu_count()} jobs={args.jobs} concurrency={args.pool} rounds={args.rounds} "
          f"loadavg={os.getloadavg()[0]:.2f}"
          + (f"  NOTE: {len(busy)} 'honing train' process(es) running: numbers include CPU contention" if busy else ""))

    t = time.perf_counter()
    pool = WarmPool(size=args.pool, limits=limits)
    start_ms = (time.perf_counter() - t) * 1e3

    def warm_job() -> bool:
        r = pool.run_python(JOB)
        return r.ok and r.stdout == "PASS\n"

    cold_job = make_cold_job(limits)
    for job in (plain_job, cold_job, warm_job):  # warm-up: page cache, first-use costs
        job()
    jobs = {"subprocess (no isolation)": plain_job, "cold bwrap box per job": cold_job, "warm pool": warm_job}
    modes = {name: _Mode() for name in jobs}
    try:
        # Interleaved rounds, so that a slow patch of the machine hits every mode alike.
        per_round = [args.jobs // args.rounds + (1 if r < args.jobs % args.rounds else 0) for r in range(args.rounds)]
        for n in per_round:
            for name, job in jobs.items():
                modes[name].drive(n, args.pool, job)
        stats = dict(pool.stats)
    finally:
        pool.close()
    results = {name: m.summary() for name, m in modes.items()}
    snap = snapshot_roundtrip(args.snapshot_rounds)

    print(f"\n{'mode':<28}{'jobs/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'failed':>8}")
    for name, r in results.items():
        print(f"{name:<28}{r['jobs_s']:>10.1f}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['failures']:>8d}")
    plain, cold, warm = (results[k]["jobs_s"] for k in results)
    print(f"\nwarm pool start ({args.pool} cells): {start_ms:.0f} ms; pool stats: {stats}")
    print(f"session snapshot+restore round trip, 100 files, {args.snapshot_rounds} rounds: "
          f"p50 {snap['p50_ms']:.2f} ms  p99 {snap['p99_ms']:.2f} ms "
          f"(snapshot p50 {snap['snapshot_p50_ms']:.2f} ms, restore p50 {snap['restore_p50_ms']:.2f} ms)")
    print(f"warm/cold = {warm / cold:.1f}x   warm/subprocess = {warm / plain:.2f}x   "
          f"cold/subprocess = {cold / plain:.2f}x")
    print(f"RATIO warm_vs_cold={warm / cold:.2f} warm_vs_subprocess={warm / plain:.2f}")
    return 0 if all(r["failures"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
