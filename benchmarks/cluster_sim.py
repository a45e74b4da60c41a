"""Cluster simulation: the real Pipeline (requests, versions, staleness, state.sqlite, Parquet shards)
and the real WorkerPool drive N simulated rollout workers, at 1 / 8 / 64 / 512 workers, plus a run
at 64 where 10% of the workers die mid-request.

    .venv/bin/python benchmarks/cluster_sim.py            # prints a table and RATIO lines

Workload (weak scaling): every step asks for 2 tasks x 4 samples per worker (prompts_per_step = 2N),
split into requests of 2 tasks (schedule.ray.tasks_per_request=2), staleness 1, the real task sampler
over the smoke recipe's reasoning-gym source. The trainer takes no time here: the simulation measures
the rollout side (pipeline + pool + the driver's bookkeeping); a real trainer's step time adds to it,
overlapped by staleness.

Latency of one request (simulated seconds), drawn per request; sources in ../shared/MEASUREMENTS.md:
- generation = completion tokens / 275 tok/s (vLLM on CPU, SmolLM2-135M bf16, 4 prompts x n=8,
  measured 2026-12-01); completion length per sample ~ lognormal(median 40 tokens, sigma 0.5),
  capped at 64 (the measured max_new_tokens): the length distribution is an assumption;
- grading = samples x 52 ms (bwrap + cold python3 per sample, measured) over 2 boxes at once
  (measured: two bwrap boxes at once in an actor);
- both x lognormal(0, 0.25) machine noise (assumption); plus a Ray actor round trip
  ~ lognormal(median 0.71 ms, p99 2.75 ms) (measured).
Columns: traj/s = trajectories trained per simulated second; linear = N workers each busy all the time
(N x trajectories per request / the mean drawn request latency); util =
the workers' busy fraction; wait% = the driver's time blocked on collect; driver s/step = real seconds
per step the driver spends on its own work (sampling, SQLite, Parquet); queue = requests waiting for a
worker (mean/max, sampled every 10 ms); running = requests on workers (mean); staleness = trained
trajectories per (trainer version - generating version); resub = requests resubmitted after a death;
dup = late duplicates dropped; counts = state.sqlite's trajectory counts against steps x prompts x
samples, every batch indexed exactly once.
The clock is scaled: a simulated second lasts 1/SCALE real seconds. Throughput is measured in real
seconds and converted back (x SCALE), so the driver's own cost (Python, SQLite, Parquet) counts
SCALE times more than it would at full speed: the ratios are a lower bound for the pool itself. The
last rows repeat 512 workers with the clock unscaled (x1), to show the driver's cost in proportion, and
with staleness 2 (a third batch in flight keeps workers busy while a step waits for its stragglers).

Rewards are a pure function of (task, request seed), so which worker ran what cannot change a result.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from honing.config import load_config
from honing.errors import HoningError
from honing.rollout.types import Trajectory
from honing.schedule.orchestrate import CostModel, RolloutBatch
from honing.schedule.pipeline import Pipeline
from honing.schedule.pool import RolloutSplit, SlotDied, WorkerPool
from honing.schedule.setup import build_tasks
from honing.schedule.state import RunState
from honing.schedule.workers import WorkerTimeout
from honing.verify.types import Verdict

SCALE = 4.0                      # simulated seconds per real second
TASKS_PER_REQUEST, SAMPLES, STALENESS, STEPS = 2, 4, 1, 12
TOK_S = 275.0                    # measured: vLLM CPU, SmolLM2-135M bf16
LEN_MEDIAN, LEN_SIGMA, LEN_MAX = 40.0, 0.5, 64
BOX_S, BOXES = 0.052, 2          # measured: bwrap + cold python3; two boxes at once per actor
NOISE = 0.25                     # assumption: machine noise (lognormal sigma)
RPC_MEDIAN_S = 0.00071           # measured: Ray actor round trip p50 0.71 ms, p99 2.75 ms
RPC_SIGMA = math.log(0.00275 / 0.00071) / 2.326


def request_latency(rng: random.Random, n_samples: int) -> float:
    tokens = sum(min(LEN_MAX, rng.lognormvariate(math.log(LEN_MEDIAN), LEN_SIGMA)) for _ in range(n_samples))
    gen = tokens / TOK_S * rng.lognormvariate(0.0, NOISE)
    grade = n_samples * BOX_S / BOXES * rng.lognormvariate(0.0, NOISE)
    return gen + grade + rng.lognormvariate(math.log(RPC_MEDIAN_S), RPC_SIGMA)


def rollout(tasks: list[dict], seed: int, version: int) -> RolloutBatch:
    """Trajectories whose rewards depend only on (task, seed)."""
    trajs = []
    for i, t in enumerate(tasks):
        rng = random.Random(f"{t['id']}/{seed}")
        for _ in range(SAMPLES):
            n = int(min(LEN_MAX, rng.lognormvariate(math.log(LEN_MEDIAN), LEN_SIGMA)))
            r = float(rng.random() < 0.4)
            trajs.append(Trajectory(t["id"], t["domain"], (1, 2, 3), tuple(range(4, 4 + n)), (-0.5,) * n, "42",
                                    "stop", version, group=i, verdict=Verdict(r, r > 0.5), reward=r))
    return RolloutBatch(trajs, [], {"jobs": float(len(tasks))})


class SimSlot:
    """A simulated rollout worker: answers a request after its drawn latency (scaled clock)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.jobs: dict[int, tuple[float, float, dict, int, int]] = {}
        self.version: int | None = None
        self.dead = False
        self.busy_sim_s = 0.0

    def submit(self, rid: int, payload: dict, seed: int, version: int, weights: object) -> None:
        if self.dead:
            raise SlotDied("killed by the simulation")
        if weights is None and self.version != version:
            raise HoningError(f"no weights for version {version}")
        self.version = version
        lat = request_latency(self.rng, len(payload["tasks"]) * SAMPLES)
        self.jobs[rid] = (time.monotonic() + lat / SCALE, lat, payload, seed, version)

    def collect(self, rid: int, timeout_s: float | None = None) -> tuple[RolloutBatch, dict]:
        if self.dead:
            raise SlotDied("killed by the simulation")
        ready, lat, payload, seed, version = self.jobs[rid]
        if time.monotonic() < ready:
            raise WorkerTimeout("not yet")
        del self.jobs[rid]
        self.busy_sim_s += lat
        return rollout(payload["tasks"], seed, version), {"worker/busy_s": lat}

    def close(self) -> None:
        self.jobs.clear()


def simulate(n: int, steps: int, kill_frac: float = 0.0, kill_at: int = 3, staleness: int = STALENESS) -> dict:
    prompts = n * TASKS_PER_REQUEST
    cfg, _ = load_config("smoke", [f"tasks.prompts_per_step={prompts}", f"tasks.samples_per_prompt={SAMPLES}",
                                   f"schedule.staleness={staleness}", f"train.steps={steps}", "report_to=[]"])
    setup = build_tasks(cfg)
    run_dir = Path(tempfile.mkdtemp(prefix=f"cluster-sim-{n}-"))
    state = RunState(run_dir / "state.sqlite", create=True)
    slots = [SimSlot(1000 + i) for i in range(n)]
    pool = WorkerPool(slots, call_timeout_s=120, split=RolloutSplit(TASKS_PER_REQUEST))
    pipe = Pipeline(cfg, state, setup.sampler, pool, CostModel(), run_dir, weights=lambda: {})
    state.commit_step(0, 0, "initial", 0, None, {}, [], {}, [], [])
    depths: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:  # the pool's queue: requests waiting for a worker, requests running
        while not stop.is_set():
            depths.append((len(pool._queue), len(pool._running)))
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    stale: Counter = Counter()
    killed: list[int] = []
    wait_s = 0.0
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        if kill_frac and step == kill_at:  # workers that hold a request die now
            pipe.ensure_requested(step, step - 1)  # (what batch_for_step does first)
            time.sleep(0.2 / SCALE)
            busy = [i for i, s in enumerate(slots) if s.jobs]
            for i in random.Random(7).sample(busy, int(round(kill_frac * n))):
                slots[i].dead = True
                killed.append(i)
        t_step = time.monotonic()
        batch = pipe.batch_for_step(step, current=step - 1)
        wait_s += batch.stats.get("time/wait_s", 0.0)
        used = {(g.shard, row): "used" for g in batch.used for row in g.rows}
        for g in batch.used:
            stale[step - 1 - g.version] += len(g.trajs)
        outcomes = [(g.trajs[0].task_id, g.trajs[0].domain, len(g.trajs), sum(t.reward > 0.5 for t in g.trajs),
                     sum(t.reward for t in g.trajs)) for g in batch.used]
        # several groups of one task in a step: the outcome table keys on (step, task)
        merged: dict[str, list] = {}
        for tid, dom, k, s_, r in outcomes:
            m = merged.setdefault(tid, [dom, 0, 0, 0.0])
            m[1] += k
            m[2] += s_
            m[3] += r
        state.commit_step(step, step, "initial", 0, None, {"step_s": time.monotonic() - t_step},
                          [(tid, *v) for tid, v in merged.items()], used, batch.consumed, [])
    wall = time.monotonic() - t0
    stop.set()
    pool.close()
    counts = state.counts()
    per_batch = dict(state.db.execute("SELECT batch_id, COUNT(*) FROM trajectories GROUP BY batch_id").fetchall())
    statuses = Counter(r[0] for r in state.db.execute("SELECT status FROM batches"))
    state.close()
    expect = steps * prompts * SAMPLES
    ok = (counts["trajectories_used"] == expect and counts["outcome_samples"] == expect
          and counts["trajectories_indexed"] == expect and statuses == Counter({"consumed": steps})
          and set(per_batch.values()) == {prompts * SAMPLES})
    busy_sim = sum(s.busy_sim_s for s in slots)
    return {"workers": n, "steps": steps, "trajs": counts["trajectories_used"], "wall_s": wall,
            "tput": counts["trajectories_used"] / (wall * SCALE),   # trajectories per simulated second
            "util": busy_sim / (n * wall * SCALE), "wait_frac": wait_s / wall, "driver_s": (wall - wait_s) / steps,
            "queue_mean": statistics.fmean(d[0] for d in depths) if depths else 0.0,
            "queue_max": max((d[0] for d in depths), default=0),
            "running_mean": statistics.fmean(d[1] for d in depths) if depths else 0.0,
            "stale": dict(sorted(stale.items())), "killed": len(killed), "resubmitted": pool.stats["resubmitted"],
            "dup": pool.stats["duplicates_dropped"], "counts_ok": ok}


def main() -> None:
    # the same number of steps everywhere: filling and draining the pipeline costs the same share
    runs = [simulate(n, STEPS) for n in (1, 8, 64, 512)]
    # linear: N workers, each busy all the time with requests of the mean drawn latency (100k draws)
    rng = random.Random(0)
    mean_lat = statistics.fmean(request_latency(rng, TASKS_PER_REQUEST * SAMPLES) for _ in range(100_000))
    base = TASKS_PER_REQUEST * SAMPLES / mean_lat
    fail = simulate(64, STEPS, kill_frac=0.10, kill_at=STEPS // 2)
    global SCALE
    fast, SCALE = SCALE, 1.0
    full = simulate(512, STEPS)  # the same at full speed: the driver's cost in its true proportion
    SCALE = fast
    stale2 = simulate(512, STEPS, staleness=2)  # one more batch in flight: stragglers are hidden
    print(f"cluster simulation: clock x{SCALE:g}; per worker and step {TASKS_PER_REQUEST} tasks x {SAMPLES} samples; "
          f"staleness {STALENESS}; trainer time 0 (rollout side only); mean request latency {mean_lat:.3f} s "
          f"-> linear = N x {base:.2f} traj/s")
    head = (f"{'workers':>7} {'steps':>5} {'trajs':>6} {'traj/s':>8} {'linear':>8} {'ratio':>6} {'util':>5} "
            f"{'wait%':>5} {'driver s/step':>13} {'queue mean/max':>14} {'running':>7}  {'staleness hist (trajs)':<24} {'killed':>6} "
            f"{'resub':>5} {'dup':>3} counts")
    print(head)
    for r, label in [(r, "") for r in runs] + [(fail, f"  <- 10% killed at step {STEPS // 2}"),
                                                (full, "  <- clock x1 (unscaled)"),
                                                (stale2, "  <- staleness 2")]:
        lin = base * r["workers"]
        print(f"{r['workers']:>7} {r['steps']:>5} {r['trajs']:>6} {r['tput']:>8.1f} {lin:>8.1f} {r['tput'] / lin:>6.2f} "
              f"{r['util']:>5.2f} {100 * r['wait_frac']:>5.0f} {r['driver_s']:>13.3f} {r['queue_mean']:>8.1f}/{r['queue_max']:<5} "
              f"{r['running_mean']:>7.1f}  {str(r['stale']):<24} {r['killed']:>6} {r['resubmitted']:>5} {r['dup']:>3} "
              f"{'exact' if r['counts_ok'] else 'WRONG'}{label}")
    by = {r["workers"]: r for r in runs}
    for n in (8, 64, 512):
        print(f"RATIO throughput_{n}_vs_linear={by[n]['tput'] / (base * n):.3f}")
    print(f"RATIO throughput_64_10pct_killed_vs_64={fail['tput'] / by[64]['tput']:.3f}")
    print(f"RATIO throughput_512_clock_x1_vs_linear={full['tput'] / (base * 512):.3f}")
    print(f"RATIO throughput_512_staleness_2_vs_linear={stale2['tput'] / (base * 512):.3f}")
    if not all(r["counts_ok"] for r in runs + [fail, full, stale2]) or fail["resubmitted"] != fail["killed"]:
        print("cluster_sim: trajectory counts do not add up", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
