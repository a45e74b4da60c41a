"""Rollout job orchestration: retries with backoff, per-job deadlines, per-environment grading
limits and cost buckets (config: `schedule.orchestration`).

A *job* is one task's group of k samples, rolled out and graded together. `Orchestrator.run`:

1. splits the tasks into buckets (`buckets`): with `bucket_by_cost`, ordered by `CostModel.estimate`
   and cut where the estimate more than doubles (or after `max_batch_tasks` tasks), so cheap
   single-turn jobs are not padded or held up by expensive multi-turn ones; otherwise input order
   in chunks of `max_batch_tasks` (0: one bucket, i.e. exactly `roll_out(tasks, seed)`);
2. rolls out each bucket on the calling thread (bucket 0 with `seed`) while the previous buckets
   grade on a background event loop, at most `env_concurrency[verifier]` gradings at once per
   verifier name (default `grading.concurrency`);
3. retries every job with an infrastructure error (a sandbox failure, an episode stopped by one,
   or a missed deadline) alone, after `min(backoff_max_s, backoff_s * 2**(attempt-1))` seconds,
   with seed `retry_seed(seed, task index, attempt)`; after `max_retries` failed retries it is
   dropped. Jobs that succeeded keep their first result.

Deadline: a job gets `job_deadline_s` for its rollout call plus its grading; its grading clock
starts when its first sample gets a grading slot (waiting for a slot is not charged). Each grading
runs with timeout `min(grading.timeout_s, time left)`; a sample that finds no time left is not graded.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from honing.config import OrchestrationConfig
from honing.errors import TaskError
from honing.rollout.types import Trajectory
from honing.tasks import Task
from honing.verify.batch import BatchOptions, Graded, agrade_batch
from honing.verify.registry import get_verifier
from honing.verify.reward import RewardConfig
from honing.verify.types import Verdict, VerifyContext

FIELDS = ("tokens", "turns", "seconds")


class CostModel:
    """Per-domain running estimates (EMA) of completion tokens, turns and sandbox/verify seconds,
    learned from graded trajectories (infrastructure errors excluded).

    `estimate` = tokens / TOKENS_PER_UNIT + (turns - 1) + seconds, in relative units (about 1 for a
    short single-turn task). Unknown domains: the mean estimate of the known ones, or, with none
    known, 1.0 (MULTITURN_PRIOR for a task with an environment)."""

    TOKENS_PER_UNIT = 256.0
    MULTITURN_PRIOR = 4.0

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.domains: dict[str, dict[str, float]] = {}

    @staticmethod
    def measure(t: Trajectory) -> tuple[float, float, float]:
        """(tokens, turns, seconds) of one trajectory; text-only ones count 4 characters a token."""
        tokens = len(t.completion_ids) or len(t.completion_text) / 4
        seconds = (t.verdict.cost_s if t.verdict else 0.0) + sum(x.timings.get("env_s", 0.0) for x in t.turns)
        return float(tokens), float(len(t.turns) or 1), float(seconds)

    def observe(self, tasks: Sequence[Task], trajs: Sequence[Trajectory]) -> None:
        """One EMA step per domain, toward the mean of its trajectories here (`group` indexes `tasks`)."""
        rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for t in trajs:
            if t.status != "infra_error":
                rows[tasks[t.group].domain if 0 <= t.group < len(tasks) else t.domain].append(self.measure(t))
        for dom, r in rows.items():
            mean = [sum(col) / len(r) for col in zip(*r)]
            cur = self.domains.get(dom)
            if cur is None:
                self.domains[dom] = {**dict(zip(FIELDS, mean)), "n": len(r)}
                continue
            for key, v in zip(FIELDS, mean):
                cur[key] += self.alpha * (v - cur[key])
            cur["n"] += len(r)

    def _domain_cost(self, d: dict[str, float]) -> float:
        return d["tokens"] / self.TOKENS_PER_UNIT + (d["turns"] - 1) + d["seconds"]

    def estimate(self, task: Task) -> float:
        d = self.domains.get(task.domain)
        if d is not None:
            return self._domain_cost(d)
        if self.domains:
            return sum(map(self._domain_cost, self.domains.values())) / len(self.domains)
        return self.MULTITURN_PRIOR if task.environment else 1.0

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "domains": {k: dict(v) for k, v in self.domains.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.alpha = d["alpha"]
        self.domains = {k: dict(v) for k, v in d["domains"].items()}


@dataclass
class RolloutBatch:
    """Graded trajectories of the kept jobs (input order, `group` = task index), the dropped task
    indices and counters (see `Orchestrator.run`)."""

    trajs: list[Trajectory]
    dropped: list[int]
    stats: dict[str, float]
    errors: list[str] = field(default_factory=list)  # the first infrastructure errors seen, for the user


def retry_seed(seed: int, index: int, attempt: int) -> int:
    """The rollout seed of retry `attempt` of task `index` (a pure function of the three)."""
    return int(hashlib.sha256(f"{seed}/{index}/{attempt}".encode()).hexdigest()[:8], 16)


@dataclass
class _Job:
    index: int
    task: Task
    trajs: list[Trajectory]
    budget: float  # seconds left for grading once its first sample gets a slot
    start: float | None = None
    late: bool = False
    skipped: int = 0  # samples not graded: no time left


def _needs_sandbox(name: str) -> bool:
    try:
        return bool(getattr(get_verifier(name), "needs_sandbox", False))
    except TaskError:
        return False


RemoteGrade = Callable[[Task, Trajectory, BatchOptions], Awaitable[Graded]]
"""Grades one sample somewhere else (a grading worker); an unreachable one is an infra-error verdict."""


class _Grader:
    """A background event loop grading jobs: at most `limits[verifier]` samples at once per verifier name
    of the task (a sample's reward-layer verifiers run within its slot)."""

    def __init__(self, ctx: VerifyContext, reward: RewardConfig, opts: BatchOptions, limits: dict[str, int],
                 remote: RemoteGrade | None = None) -> None:
        self.ctx, self.reward, self.opts, self.limits = ctx, reward, opts, limits
        self.remote, self.remote_count = remote, 0
        self.sems: dict[str, asyncio.Semaphore] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="orchestrate-grade", daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> Future:
        return asyncio.run_coroutine_threadsafe(self._job(job), self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _job(self, job: _Job) -> _Job:
        broken = [t for t in job.trajs if t.stop_reason == "infra_error"]
        if broken:  # the job is retried anyway: do not grade the rest
            for t in broken:
                t.verdict, t.reward = Verdict.infra("episode stopped by an infrastructure error"), 0.0
            return job
        await asyncio.gather(*(self._item(job, t) for t in job.trajs))
        return job

    async def _item(self, job: _Job, t: Trajectory) -> None:
        name = job.task.verifier.name
        if name not in self.sems:
            self.sems[name] = asyncio.Semaphore(max(1, self.limits.get(name, self.opts.concurrency)))
        async with self.sems[name]:
            now = time.perf_counter()
            job.start = now if job.start is None else job.start
            left = job.start + job.budget - now
            if left <= 0:
                job.late, job.skipped = True, job.skipped + 1
                t.verdict, t.reward = Verdict.infra("job deadline passed before grading"), 0.0
                return
            opts = replace(self.opts, timeout_s=min(self.opts.timeout_s, left))
            if self.remote is not None and job.task.environment is None:  # a grading worker (multi-turn
                self.remote_count += 1                                       # episodes grade where their box is)
                g = await self.remote(job.task, t, opts)
            else:
                g = (await agrade_batch([job.task], [t], self.ctx, self.reward, opts))[0]
            if g.verdict.infra_error and time.perf_counter() - job.start >= job.budget - 1e-3:
                job.late = True
        t.verdict, t.reward, t.reward_layers = g.verdict, g.reward.value, dict(g.reward.layers)


class Orchestrator:
    """Rolls out and grades tasks as jobs with retries, deadlines, per-environment grading limits
    and cost buckets (module docstring). `roll_out(tasks, seed)` returns k trajectories per task
    with `group` = the task's index in `tasks`; `sleep` is injectable for tests."""

    def __init__(self, roll_out: Callable[[Sequence[Task], int], list[Trajectory]], ctx: VerifyContext,
                 reward: RewardConfig, grading: BatchOptions, cfg: OrchestrationConfig,
                 cost: CostModel | None = None, max_batch_tasks: int = 0,
                 sleep: Callable[[float], None] = time.sleep, remote_grade: RemoteGrade | None = None) -> None:
        self.roll_out, self.ctx, self.reward, self.grading, self.cfg = roll_out, ctx, reward, grading, cfg
        self.remote_grade = remote_grade  # single-turn samples graded elsewhere (e.g. Ray grading actors)
        self.cost = cost if cost is not None else CostModel()
        self.max_batch_tasks, self.sleep = max_batch_tasks, sleep

    def buckets(self, tasks: Sequence[Task]) -> list[list[int]]:
        """Task indices per rollout call (each in input order); cheapest bucket first."""
        cap = self.max_batch_tasks or max(len(tasks), 1)
        if not self.cfg.bucket_by_cost:
            return [list(range(i, min(i + cap, len(tasks)))) for i in range(0, len(tasks), cap)]
        est = [self.cost.estimate(t) for t in tasks]
        out: list[list[int]] = []
        for i in sorted(range(len(tasks)), key=lambda i: (est[i], i)):
            if out and len(out[-1]) < cap and est[i] <= 2.0 * max(est[out[-1][0]], 0.05):
                out[-1].append(i)
            else:
                out.append([i])
        return [sorted(b) for b in out]

    def run(self, tasks: Sequence[Task], seed: int) -> RolloutBatch:
        """Stats: time/{gen,verify,sandbox,backoff}_s (verify_s: time spent waiting for grading),
        jobs, attempts (= jobs + retries), retries, drops, infra_errors (infrastructure-error
        samples seen, retried ones included), deadline_exceeded (job attempts), deadline_skipped
        (samples not graded for lack of time), buckets."""
        t_run = time.perf_counter()
        st: dict[str, float] = defaultdict(float)
        done: dict[int, list[Trajectory]] = {}
        errors: list[str] = []
        grader = _Grader(self.ctx, self.reward, self.grading, dict(self.cfg.env_concurrency), self.remote_grade)
        try:
            buckets = self.buckets(tasks)
            futures: list[Future] = []
            for b, idx in enumerate(buckets):  # bucket b+1 rolls out while bucket b grades
                futures += self._launch(grader, tasks, idx, seed if b == 0 else retry_seed(seed, -b, 0), st)
            failed = self._collect(futures, tasks, done, st, errors)
            for attempt in range(1, self.cfg.max_retries + 1):
                if not failed:
                    break
                delay = min(self.cfg.backoff_max_s, self.cfg.backoff_s * 2 ** (attempt - 1))
                self.sleep(delay)
                st["time/backoff_s"] += delay
                st["retries"] += len(failed)
                futures = [f for i in failed
                           for f in self._launch(grader, tasks, [i], retry_seed(seed, i, attempt), st)]
                failed = self._collect(futures, tasks, done, st, errors)
        finally:
            grader.close()
        st.update(jobs=len(tasks), drops=len(failed), buckets=len(buckets), graded_remote=grader.remote_count)
        st["attempts"] = st["jobs"] + st["retries"]
        st["time/verify_s"] = max(0.0, time.perf_counter() - t_run - st["time/gen_s"] - st["time/backoff_s"])
        trajs = [t for i in range(len(tasks)) if i in done for t in done[i]]
        keys = ("time/gen_s", "time/verify_s", "time/sandbox_s", "time/backoff_s", "jobs", "attempts", "retries",
                "drops", "infra_errors", "deadline_exceeded", "deadline_skipped", "buckets")
        keys += ("graded_remote",) if self.remote_grade is not None else ()
        return RolloutBatch(trajs, sorted(failed), {k: float(st[k]) for k in keys}, errors)

    def _launch(self, grader: _Grader, tasks: Sequence[Task], idx: list[int], seed: int,
                st: dict[str, float]) -> list[Future]:
        """Roll out tasks[idx] in one call and hand each job to the grader."""
        sub = [tasks[i] for i in idx]
        t0 = time.perf_counter()
        trajs = self.roll_out(sub, seed)
        gen = time.perf_counter() - t0
        st["time/gen_s"] += gen
        per: list[list[Trajectory]] = [[] for _ in idx]
        for t in trajs:
            if not 0 <= t.group < len(idx):
                raise ValueError(f"roll_out returned group {t.group} for {len(idx)} tasks")
            per[t.group].append(t)
            t.group = idx[t.group]
        return [grader.submit(_Job(i, tasks[i], p, self.cfg.job_deadline_s - gen)) for i, p in zip(idx, per)]

    def _collect(self, futures: list[Future], tasks: Sequence[Task], done: dict[int, list[Trajectory]],
                 st: dict[str, float], errors: list[str]) -> list[int]:
        """Wait for the jobs (in submission order); keep the good ones; return the failed indices
        (the first three distinct infrastructure errors go to `errors`)."""
        failed = []
        for f in futures:
            job: _Job = f.result()
            sandboxed = _needs_sandbox(job.task.verifier.name)
            for t in job.trajs:
                st["time/sandbox_s"] += sum(x.timings.get("env_s", 0.0) for x in t.turns)
                if sandboxed and t.verdict is not None:
                    st["time/sandbox_s"] += t.verdict.cost_s
            n_infra = sum(t.status == "infra_error" for t in job.trajs)
            st["infra_errors"] += n_infra
            st["deadline_exceeded"] += job.late
            st["deadline_skipped"] += job.skipped
            self.cost.observe(tasks, job.trajs)
            if n_infra or job.late:
                failed.append(job.index)
                first = next((t.verdict.details for t in job.trajs if t.status == "infra_error" and t.verdict), None)
                if first and len(errors) < 3 and first not in errors:
                    errors.append(first)
            else:
                done[job.index] = job.trajs
        return sorted(failed)
