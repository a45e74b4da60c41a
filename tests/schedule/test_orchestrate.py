"""Rollout job orchestration: infrastructure faults are retried (never scored 0) or dropped and
counted, deadlines cut hung gradings, per-verifier grading limits hold, cost buckets keep the
input order, and without faults the result is exactly roll_out + grade_batch."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import defaultdict

import pytest

from honing.config import OrchestrationConfig
from honing.rollout.types import Trajectory, Turn
from honing.schedule.orchestrate import CostModel, Orchestrator, retry_seed
from honing.tasks import Task
from honing.tasks.code import CodeFunctionsSource, reference_solution
from honing.tasks.types import VerifierSpec
from honing.verify import Verdict, VerifyContext
from honing.verify.batch import BatchOptions, grade_batch
from honing.verify.registry import register_verifier
from honing.verify.reward import RewardConfig

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
K = 2
SOLUTIONS = {
    "sum_evens": "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)\n",
    "digit_sum": "def digit_sum(n):\n    return sum(map(int, str(abs(n))))\n",
    "mean": "def mean(nums):\n    return sum(nums) / len(nums) if nums else 0.0\n",
    "dedupe": "def dedupe(nums):\n    seen = set(); out = []\n    for x in nums:\n        if x not in seen:\n"
              "            seen.add(x); out.append(x)\n    return out\n",
}


def code_tasks(n: int) -> list[Task]:
    src = CodeFunctionsSource({"templates": sorted(SOLUTIONS), "num_cases": 3})
    return [src.make("train", i) for i in range(n)]


def correct(task: Task) -> bool:
    return task.metadata.get("seed", 0) % 3 != 0


class Scripted:
    """roll_out(tasks, seed): K text-only samples per task, a right solution for `correct` tasks,
    a wrong one otherwise; records each call's (seed, task ids)."""

    def __init__(self, tokens: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[int, list[str]]] = []
        self.tokens = tokens or {}

    def text(self, task: Task) -> str:
        if task.verifier.name != "code":
            return str(task.hidden["answer"])
        fn = task.hidden["function"]
        body = reference_solution(task) if correct(task) else f"def {fn}(*args):\n    return None\n"
        return f"Here:\n```python\n{body}```\n"

    def __call__(self, tasks, seed: int) -> list[Trajectory]:
        self.calls.append((seed, [t.id for t in tasks]))
        out = []
        for g, task in enumerate(tasks):
            for _ in range(K):
                t = Trajectory.from_text(task.id, task.domain, self.text(task))
                n = self.tokens.get(task.domain, 0)
                t.completion_ids, t.logprobs, t.loss_mask = (1,) * n, (0.0,) * n, (1,) * n
                t.group = g
                out.append(t)
        return out


def make(roll_out, ctx, cfg, *, concurrency=4, timeout_s=60.0, cost=None, max_batch_tasks=0):
    sleeps: list[float] = []
    orch = Orchestrator(roll_out, ctx, RewardConfig(), BatchOptions(concurrency, timeout_s), cfg, cost=cost,
                        max_batch_tasks=max_batch_tasks, sleep=sleeps.append)
    return orch, sleeps


def check_shape(batch, tasks) -> set[int]:
    groups = [t.group for t in batch.trajs]
    assert groups == sorted(groups), "tasks in input order, a task's samples together"
    kept = set(groups)
    assert all(groups.count(g) == K for g in kept)
    assert all(t.task_id == tasks[t.group].id for t in batch.trajs)
    assert kept.isdisjoint(batch.dropped) and len(kept) + len(batch.dropped) == len(tasks)
    assert all(t.verdict is not None and t.status != "infra_error" for t in batch.trajs)
    return kept


# --- fault injection --------------------------------------------------------------------------
@needs_bwrap
def test_injected_faults_are_retried_never_scored_zero() -> None:
    from honing.sandbox import Sandbox

    sb = Sandbox("faulty:bwrap:fail=0.1,hang=0.02,hang_s=4,seed=4", max_concurrency=4)
    fb = sb.backend
    tasks = code_tasks(40)
    cfg = OrchestrationConfig(max_retries=4, backoff_s=0.01, backoff_max_s=0.05, job_deadline_s=3.0,
                              env_concurrency={"code": 4}, bucket_by_cost=False)
    roll = Scripted()
    orch, sleeps = make(roll, VerifyContext(extra={"sandbox": sb}), cfg)
    t0 = time.perf_counter()
    try:
        batch = orch.run(tasks, seed=11)
    finally:
        fb.close()  # wake gradings abandoned at their deadline
        assert fb.drain(10)
    st, inj = batch.stats, fb.injected
    kept = check_shape(batch, tasks)
    for t in batch.trajs:  # no infrastructure failure shows up as a grade
        assert t.reward == (1.0 if correct(tasks[t.group]) else 0.0), t.verdict
    assert inj["fail"] + inj["hang"] > 0
    # every fault that hit is one infra error: a failure at once, a hang when the deadline cuts it
    assert st["infra_errors"] == inj["fail"] + inj["hang"] + st["deadline_skipped"]
    assert inj["calls"] == K * st["attempts"] - st["deadline_skipped"]
    assert st["deadline_exceeded"] >= (inj["hang"] > 0)
    assert st["attempts"] == len(tasks) + st["retries"] and st["drops"] == len(batch.dropped)
    assert 1 <= st["retries"] + st["drops"] <= st["infra_errors"]  # a failed attempt has >= 1 infra sample
    assert len(kept) + st["drops"] == len(tasks) and st["jobs"] == len(tasks)
    assert len(sleeps) >= 2 and sleeps == [min(0.05, 0.01 * 2 ** i) for i in range(len(sleeps))]
    assert st["time/backoff_s"] == pytest.approx(sum(sleeps)) and st["time/sandbox_s"] > 0
    # retries roll out one task alone, seeded by (seed, task index, attempt)
    first, *retries = roll.calls
    assert first == (11, [t.id for t in tasks]) and len(retries) == st["retries"]
    seen: dict[int, int] = defaultdict(int)
    for s, ids in retries:
        i = [t.id for t in tasks].index(ids[0])
        seen[i] += 1
        assert len(ids) == 1 and s == retry_seed(11, i, seen[i])
    assert time.perf_counter() - t0 < 45


def test_retry_exhaustion_drops_every_job() -> None:
    from honing.sandbox import Sandbox
    from honing.sandbox.faulty import FaultyBackend

    class Never:
        name = "never"

        def mechanisms(self):
            return {}

        def run(self, *a, **k):
            raise AssertionError("not reached")

    fb = FaultyBackend(Never(), fail=1.0)
    tasks = code_tasks(5)
    cfg = OrchestrationConfig(max_retries=2, backoff_s=0.01, backoff_max_s=8, job_deadline_s=30)
    orch, sleeps = make(Scripted(), VerifyContext(extra={"sandbox": Sandbox(fb)}), cfg)
    batch = orch.run(tasks, seed=0)
    assert batch.trajs == [] and batch.dropped == list(range(5))
    st = batch.stats
    assert (st["drops"], st["retries"], st["attempts"], st["infra_errors"]) == (5, 10, 15, 30)
    assert fb.injected == {"fail": 30, "hang": 0, "calls": 30} and sleeps == [0.01, 0.02]


def test_episode_infra_stop_is_retried_and_env_time_counted() -> None:
    tasks = [Task(f"t{i}", "mt", ({"role": "user", "content": "q"},), VerifierSpec("exact"), {"answer": "7"})
             for i in range(3)]
    calls = []

    def roll_out(sub, seed):
        calls.append(seed)
        out = []
        for g, task in enumerate(sub):
            for j in range(K):
                turn = Turn(0, (), (), "", (), "", timings={"env_s": 0.25})
                t = Trajectory.from_text(task.id, task.domain, "7")
                t.group, t.turns = g, (turn,)
                t.stop_reason = "infra_error" if (len(calls) == 1 and g == 1 and j == 0) else "submit"
                out.append(t)
        return out

    orch, sleeps = make(roll_out, VerifyContext(extractor="last_number"), OrchestrationConfig(backoff_s=0.01))
    batch = orch.run(tasks, seed=5)
    check_shape(batch, tasks)
    assert [t.reward for t in batch.trajs] == [1.0] * 6
    st = batch.stats
    assert (st["infra_errors"], st["retries"], st["drops"]) == (1, 1, 0) and sleeps == [0.01]
    assert calls == [5, retry_seed(5, 1, 1)]
    assert st["time/sandbox_s"] == pytest.approx(0.25 * 8)  # 6 + 2 samples with one turn each


# --- per-environment limits --------------------------------------------------------------------
class Probe:
    """A slow verifier that records its peak number of concurrent calls."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()

    def verify(self, task, trajectory, ctx) -> Verdict:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            ALL.now += 1
            ALL.peak = max(ALL.peak, ALL.now)
        time.sleep(0.05)
        with self.lock:
            self.now -= 1
            ALL.now -= 1
        return Verdict(1.0, True)


ALL = Probe()


def test_env_concurrency_bounds_each_verifier() -> None:
    probes = {name: Probe() for name in ("orch-a", "orch-b", "orch-c")}
    for name, p in probes.items():
        register_verifier(name, p)
    tasks = [Task(f"{n}/{i}", n, ({"role": "user", "content": "q"},), VerifierSpec(n), {"answer": "x"})
             for i in range(8) for n in probes]
    cfg = OrchestrationConfig(env_concurrency={"orch-a": 1, "orch-b": 3}, bucket_by_cost=False)
    ALL.peak = 0
    orch, _ = make(Scripted(), VerifyContext(), cfg, concurrency=2)
    batch = orch.run(tasks, seed=0)
    check_shape(batch, tasks)
    assert probes["orch-a"].peak == 1 and probes["orch-b"].peak == 3 and probes["orch-c"].peak == 2
    assert ALL.peak > 3  # the verifiers' partitions grade at the same time


# --- cost buckets ---------------------------------------------------------------------------
def test_cost_buckets_keep_input_order_and_model_learns() -> None:
    tasks = [Task(f"{d}/{i}", d, ({"role": "user", "content": "q"},), VerifierSpec("exact"), {"answer": "3"})
             for i in range(6) for d in ("short", "long")]
    roll = Scripted(tokens={"short": 20, "long": 3000})
    cost = CostModel()
    cfg = OrchestrationConfig(bucket_by_cost=True)
    orch, _ = make(roll, VerifyContext(), cfg, cost=cost)
    first = orch.run(tasks, seed=1)  # nothing known yet: one bucket
    assert first.stats["buckets"] == 1 and roll.calls[0] == (1, [t.id for t in tasks])
    assert cost.estimate(tasks[1]) > 10 * cost.estimate(tasks[0])  # long completions cost more
    assert cost.estimate(Task("x", "unseen", (), VerifierSpec("exact"))) > cost.estimate(tasks[0])
    roll.calls.clear()
    orch.max_batch_tasks = 4
    batch = orch.run(tasks, seed=1)
    check_shape(batch, tasks)
    assert [t.group for t in batch.trajs] == [i for i in range(12) for _ in range(K)]
    assert [len(ids) for _, ids in roll.calls] == [4, 2, 4, 2] and batch.stats["buckets"] == 4
    assert all(i.startswith("short") for i in roll.calls[0][1] + roll.calls[1][1])  # cheap first
    assert roll.calls[0][0] == 1 and len({s for s, _ in roll.calls}) == 4
    assert all(t.reward == 1.0 for t in batch.trajs)

    state = json.loads(json.dumps(cost.state_dict()))
    back = CostModel()
    back.load_state_dict(state)
    assert back.state_dict() == cost.state_dict() and back.estimate(tasks[1]) == cost.estimate(tasks[1])


def test_cost_model_ema() -> None:
    cm = CostModel(alpha=0.5)
    task = Task("a", "d", (), VerifierSpec("exact"))
    assert cm.estimate(task) == 1.0
    assert cm.estimate(Task("b", "d", (), VerifierSpec("exact"), environment={"tools": []})) > 1.0

    def traj(n: int, cost_s: float) -> Trajectory:
        t = Trajectory.from_text("a", "d", "")
        t.completion_ids, t.verdict = (1,) * n, Verdict(1.0, True, cost_s=cost_s)
        return t

    cm.observe([task], [traj(256, 1.0), traj(768, 1.0)])  # first observation: the mean
    assert cm.estimate(task) == pytest.approx(512 / 256 + 1.0)
    cm.observe([task], [traj(0, 0.0)])
    assert cm.estimate(task) == pytest.approx(256 / 256 + 0.5)
    before = cm.state_dict()
    infra = traj(10_000, 0.0)
    infra.verdict = Verdict.infra("x")
    cm.observe([task], [infra])  # infrastructure errors teach nothing
    assert cm.state_dict() == before and cm.domains["d"]["n"] == 3


# --- equivalence with the plain path -------------------------------------------------------------
@needs_bwrap
def test_no_faults_equals_roll_out_plus_grade_batch() -> None:
    from honing.sandbox import Sandbox

    sb = Sandbox("faulty:bwrap:fail=0,hang=0", max_concurrency=4)
    tasks = code_tasks(6) + [Task(f"e{i}", "exact", ({"role": "user", "content": "q"},), VerifierSpec("exact"),
                                  {"answer": "3" if i else "4"}) for i in range(3)]
    tasks = [tasks[i] for i in (0, 6, 1, 2, 7, 3, 4, 8, 5)]
    ctx, opts = VerifyContext(extra={"sandbox": sb}), BatchOptions(4, 60.0)
    plain = Scripted()(tasks, 3)
    graded = grade_batch([tasks[t.group] for t in plain], plain, ctx, RewardConfig(), opts)
    for t, g in zip(plain, graded):
        t.verdict, t.reward, t.reward_layers = g.verdict, g.reward.value, dict(g.reward.layers)
    roll = Scripted()
    batch = make(roll, ctx, OrchestrationConfig(bucket_by_cost=False))[0].run(tasks, 3)

    def view(ts):
        return [(t.group, t.task_id, t.completion_text, t.verdict.score, t.verdict.passed, t.verdict.components,
                 t.reward, t.reward_layers) for t in ts]

    assert view(batch.trajs) == view(plain) and roll.calls == [(3, [t.id for t in tasks])]
    assert {t.reward for t in batch.trajs} == {0.0, 1.0}
    st = batch.stats
    assert (st["retries"], st["drops"], st["infra_errors"], st["buckets"], st["attempts"]) == (0, 0, 0, 1, 9)
    assert sb.backend.injected["calls"] == 2 * K * 6  # the plain path and the orchestrated one
