"""Memory of streamed task sampling over a 1,000,000-task JSONL pool: the sampler must never hold
the pool, only stream positions, lookahead buffers and the bounded revisit queue.

    .venv/bin/python benchmarks/pool_memory.py [--tasks 1000000] [--steps 200] [--batch 64]

Writes the pool (streamed) to a temp dir, builds `make_source("jsonl:<path>")`, samples
steps x batch tasks with curriculum lookahead and revisits on (simulated group outcomes, a
held-out regression halfway), and half-way saves the sampler state, JSON round-trips it and
restores it into a fresh sampler (which re-opens the file and skips to the saved position). The
restored sampler must draw exactly what the original draws. A last restore moves the saved
position ~90% into the file, so loading it streams past ~800k tasks. Peak RSS (VmHWM) is measured against
a baseline taken after imports. Ends with `RATIO extra_rss_mb=<x> limit_mb=200`.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
import zlib
from pathlib import Path

from honing.config import BalanceConfig, CurriculumConfig, PriorityConfig, ScheduleConfig
from honing.schedule.sampler import Outcome, TaskSampler
from honing.tasks import make_source

LIMIT_MB = 200


def peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_pool(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            a, b = rng.randint(0, 10 ** rng.randint(1, 6)), rng.randint(0, 999)
            f.write(json.dumps({"id": f"pool/{i}", "prompt": f"What is {a} + {b}? Answer with the number only.",
                                "answer": str(a + b), "difficulty": len(str(a))}) + "\n")


def outcomes(tasks, step: int, samples: int = 8) -> list[Outcome]:
    out = []
    for t in tasks:
        h = zlib.crc32(f"{t.id}@{step}".encode())
        k = min(samples, max(0, 9 - 2 * int(t.difficulty or 0) + h % 3 - 1))
        out.append(Outcome(t.id, t.domain, samples, k, k / samples))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    cfg = ScheduleConfig(curriculum=CurriculumConfig(enabled=True, lookahead=256, window=512, min_samples=256),
                         priority=PriorityConfig(revisit_frac=0.25, rest_steps=20, max_visits=4, queue_size=4096),
                         balance=BalanceConfig())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pool.jsonl"
        t0 = time.perf_counter()
        write_pool(path, args.tasks)
        size_mb = path.stat().st_size / 2 ** 20
        print(f"pool: {args.tasks} tasks, {size_mb:.1f} MiB on disk, written in {time.perf_counter() - t0:.1f}s")
        base = peak_rss_mb()
        print(f"peak RSS before sampling (after imports and writing): {base:.1f} MiB")

        def build() -> TaskSampler:
            return TaskSampler([make_source(f"jsonl:{path}")], [1.0], seed=0, cfg=cfg)

        sampler = build()
        shadow: TaskSampler | None = None
        mid = args.steps // 2
        evals = {mid + args.steps // 8: 0.9, mid + args.steps // 4: 0.7}  # held-out pass@1: a regression
        t0 = time.perf_counter()
        restore_s = 0.0
        for step in range(args.steps):
            if step == mid:  # save, JSON round-trip, restore into a fresh sampler; keep the old one as a check
                r0 = time.perf_counter()
                text = json.dumps(sampler.state_dict())
                shadow, sampler = sampler, build()
                sampler.load_state_dict(json.loads(text))
                restore_s = time.perf_counter() - r0
                print(f"step {step}: state {len(text) / 2 ** 20:.2f} MiB JSON, restored (skipped "
                      f"{sampler.streams[0].consumed} train tasks) in {restore_s:.2f}s; peak RSS {peak_rss_mb():.1f} MiB")
            tasks = sampler.next(args.batch, step)
            res = outcomes(tasks, step)
            sampler.observe(step, res)
            if step in evals:
                sampler.on_heldout(step, {"jsonl:pool": evals[step]})
            if shadow is not None:
                other = shadow.next(args.batch, step)
                if [t.id for t in other] != [t.id for t in tasks]:
                    sys.exit(f"restored sampler diverged at step {step}")
                shadow.observe(step, outcomes(other, step))
                if step in evals:
                    shadow.on_heldout(step, {"jsonl:pool": evals[step]})
        elapsed = time.perf_counter() - t0
        m = sampler.metrics()
        print(f"{args.steps} steps x {args.batch} tasks in {elapsed:.1f}s (restore {restore_s:.2f}s): "
              f"fresh {m['sched/fresh_tasks']:.0f}, revisited {m['sched/revisited_tasks']:.0f}, "
              f"revisit queue {m['sched/revisit_queue']:.0f}, rested {m['sched/rested']:.0f}, "
              f"stream position {sampler.streams[0].consumed}/{args.tasks}")
        print("events:", [(e["step"], e["kind"], e["reason"]) for e in sampler.drain_events()])
        print("restored sampler matched the original for every step after the restore")
        # a deep restore: the same state moved 90% into the file, so load_state_dict streams past 900k lines
        state = sampler.state_dict()
        deep = int(args.tasks * 0.9 * 0.9)  # ~90% of the file's lines are train tasks (10% held out by hash)
        state["streams"][0]["consumed"] = max(deep, state["streams"][0]["consumed"])
        r0 = time.perf_counter()
        deep_sampler = build()
        deep_sampler.load_state_dict(json.loads(json.dumps(state)))
        deep_sampler.observe(args.steps, outcomes(deep_sampler.next(args.batch, args.steps), args.steps))
        print(f"deep restore: skipped {state['streams'][0]['consumed']} train tasks in "
              f"{time.perf_counter() - r0:.1f}s; peak RSS {peak_rss_mb():.1f} MiB")
        after = peak_rss_mb()
        print(f"peak RSS after sampling: {after:.1f} MiB")
        extra = after - base
        print(f"RATIO extra_rss_mb={extra:.1f} limit_mb={LIMIT_MB}")


if __name__ == "__main__":
    main()
