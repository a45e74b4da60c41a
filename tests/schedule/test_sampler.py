"""TaskSampler: old behaviour without a schedule, curriculum, revisits, domain balance, exact state."""

from __future__ import annotations

import itertools
import json
import random
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from honing.config import BalanceConfig, CurriculumConfig, PriorityConfig, ScheduleConfig
from honing.errors import ConfigError
from honing.schedule.sampler import Outcome, TaskSampler
from honing.tasks import Task, TaskSource, VerifierSpec, make_source


class GenSource:
    """A streamed in-test source; counts how many tasks its iterators yielded."""

    def __init__(self, domain: str, prefix: str, n: int = 100_000, difficulty: Sequence[float | None] | None = None,
                 repeat_every: int = 0) -> None:
        self.domain, self.prefix, self.n = domain, prefix, n
        self.difficulty = difficulty
        self.repeat_every = repeat_every
        self.yielded = 0

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        rng = random.Random(f"{self.prefix}/{split}/{seed}")
        for i in range(self.n):
            q = i % self.repeat_every if self.repeat_every else i
            diff = self.difficulty[i % len(self.difficulty)] if self.difficulty else rng.random()
            self.yielded += 1
            yield Task(id=f"{self.prefix}/{split}/{i}", domain=self.domain,
                       prompt=({"role": "user", "content": f"{self.prefix} q{q}"},),
                       verifier=VerifierSpec("exact"), hidden={"answer": str(i)}, difficulty=diff,
                       metadata={"i": i})


class OldTaskSampler:
    """The sampler before schedules (reference for the no-config sequence)."""

    def __init__(self, sources, weights, seed, exclude_questions=frozenset()) -> None:
        self.sources = list(sources)
        self.weights = list(weights)
        self.rng = random.Random(seed)
        self.iters = [s.tasks("train", seed) for s in sources]
        self.exclude = set(exclude_questions)
        self.skipped = 0

    def next(self, count: int) -> list[Task]:
        out = []
        while len(out) < count:
            i = self.rng.choices(range(len(self.sources)), weights=self.weights)[0]
            try:
                task = next(self.iters[i])
            except StopIteration:
                raise ConfigError(f"task source {self.sources[i].domain} ran out of training tasks") from None
            if task.question in self.exclude:
                self.skipped += 1
                continue
            out.append(task)
        return out


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sched(**kw) -> ScheduleConfig:
    return ScheduleConfig(**kw)


def _outcomes(tasks: Sequence[Task], rate_of, samples: int = 8) -> list[Outcome]:
    out = []
    for t in tasks:
        k = rate_of(t)
        out.append(Outcome(t.id, t.domain, samples, k, k / samples))
    return out


# --- no schedule: the old sequence ---------------------------------------------------------------


@pytest.mark.parametrize("cfg", [None, ScheduleConfig(), ScheduleConfig(balance=BalanceConfig(boost=3.0),
                                                                         curriculum=CurriculumConfig(window=5))])
def test_sequence_identical_to_old_sampler_without_schedule(tmp_path: Path, cfg) -> None:
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i % 40}", "answer": "1", "split": "train"} for i in range(400)])
    mk = lambda: [GenSource("x", "x", repeat_every=30), make_source(f"jsonl:{a}"), GenSource("y", "y"),
                  GenSource("x", "x2")]
    weights = [2.0, 1.0, 0.5, 1.5]
    exclude = {"x q3", "a7", "y q1", "x q11", "x2 q2"}
    old = OldTaskSampler(mk(), weights, 7, exclude)
    new = TaskSampler(mk(), weights, 7, exclude, levels=[0, 0, 0, 1], cfg=cfg)
    for step, n in enumerate([1, 5, 17, 3, 64, 2, 33]):
        assert [t.id for t in new.next(n, step)] == [t.id for t in old.next(n)]
        new.observe(step, [])
    assert new.skipped == old.skipped > 0
    # without on_heldout calls the weights never change
    assert new.domain_weights() == pytest.approx({"x": 3.5 / 5, "jsonl:a": 1 / 5, "y": 0.5 / 5})
    assert new.drain_events() == []
    with pytest.raises(ConfigError, match="ran out"):
        TaskSampler([make_source(f"jsonl:{a}")], [1.0], seed=0).next(401)


# --- curriculum ------------------------------------------------------------------------------------


def test_curriculum_advances_on_pass_rate_after_min_samples() -> None:
    cur = CurriculumConfig(enabled=True, advance_at=0.7, min_samples=64, window=32)
    srcs = [GenSource("m", "easy"), GenSource("m", "hard"), GenSource("o", "other")]
    s = TaskSampler(srcs, [1.0, 1.0, 1.0], seed=1, levels=[0, 1, 0], cfg=_sched(curriculum=cur))
    assert s.metrics()["sched/level/m"] == 0.0
    assert s.domain_weights() == pytest.approx({"m": 2 / 3, "o": 1 / 3})  # domain weight = all its sources
    step, seen_m = 0, 0
    while seen_m < 64:  # everyone passes, but only at level 0 until 64 samples of m
        tasks = s.next(4, step)
        assert not any(t.id.startswith("hard/") for t in tasks)
        s.observe(step, _outcomes(tasks, lambda t: 8))
        seen_m += 8 * sum(t.domain == "m" for t in tasks)
        events = s.drain_events()
        if seen_m < 64:
            assert events == [] and s.metrics()["sched/level/m"] == 0.0
        step += 1
    assert [(e["kind"], e["domain"], e["old"], e["new"]) for e in events] == [("level", "m", 0, 1)]
    assert "pass rate 1.000 >= 0.700" in events[0]["reason"] and events[0]["step"] == step - 1
    assert s.metrics()["sched/level/m"] == 1.0 and "sched/pass_rate/m" not in s.metrics()  # window reset
    tasks = s.next(200, step)
    m_tasks = [t for t in tasks if t.domain == "m"]
    assert m_tasks and all(t.id.startswith("hard/") for t in m_tasks)
    assert 0.5 < len(m_tasks) / 200 < 0.8  # the domain keeps its share (2/3)


def test_curriculum_does_not_advance_below_threshold_and_ignores_stale_levels() -> None:
    cur = CurriculumConfig(enabled=True, advance_at=0.7, min_samples=16, window=16)
    s = TaskSampler([GenSource("m", "easy"), GenSource("m", "hard")], [1.0, 1.0], seed=2, levels=[0, 1],
                    cfg=_sched(curriculum=cur))
    for step in range(10):  # pass rate 5/8 < 0.7: never advances
        tasks = s.next(4, step)
        s.observe(step, _outcomes(tasks, lambda t: 5))
    assert s.drain_events() == [] and s.metrics()["sched/pass_rate/m"] == pytest.approx(5 / 8)
    stale = s.next(4, 10)  # drawn at level 0
    s.observe(10, _outcomes(s.next(2, 10), lambda t: 8))  # 16 passes: the window is now all passes
    assert [e["new"] for e in s.drain_events()] == [1]
    s.observe(11, _outcomes(stale, lambda t: 0))  # level-0 results after advancing do not count at level 1
    assert "sched/pass_rate/m" not in s.metrics()


def test_lookahead_serves_easiest_buffered_first() -> None:
    diffs = [5, 3, 9, 1, 7, 2, None, 8, 6, 4]
    src = GenSource("m", "m", n=10, difficulty=diffs)
    s = TaskSampler([src], [1.0], seed=0, cfg=_sched(curriculum=CurriculumConfig(lookahead=3)))
    got = [int(t.id.rsplit("/", 1)[1]) for t in s.next(10)]
    # buffer [5,3,9]->3, [5,9,1]->1, [5,9,7]->5, [9,7,2]->2, [9,7,None]->None(0), [9,7,8]->7, [9,8,6]->6,
    # [9,8,4]->4, then the stream is out: [9,8]->8, [9]->9
    assert [diffs[i] for i in got] == [3, 1, 5, 2, None, 7, 6, 4, 8, 9]
    assert src.yielded == 10
    with pytest.raises(ConfigError, match="ran out"):
        s.next(1)


# --- revisits --------------------------------------------------------------------------------------


def test_revisits_informative_first_rest_and_max_visits() -> None:
    pri = PriorityConfig(revisit_frac=0.5, rest_steps=3, max_visits=2, queue_size=100)
    s = TaskSampler([GenSource("m", "m")], [1.0], seed=0, cfg=_sched(priority=pri))
    rates = {"m/train/0": 4, "m/train/1": 0, "m/train/2": 8, "m/train/3": 2,  # 0.5, 0 (rest), 1 (rest), 0.25
             "m/train/4": 4, "m/train/5": 8}
    ids = lambda ts: [t.id for t in ts]
    t0 = s.next(4, 0)
    assert ids(t0) == [f"m/train/{i}" for i in range(4)]  # queue empty: all fresh
    s.observe(0, _outcomes(t0, lambda t: rates.get(t.id, 4)))
    assert s.metrics()["sched/revisit_queue"] == 4 and s.metrics()["sched/rested"] == 2
    t1 = s.next(4, 1)
    assert ids(t1) == ["m/train/0", "m/train/3", "m/train/4", "m/train/5"]  # informative first, then fresh
    assert t1[0].hidden["answer"] == "0" and t1[0].metadata["i"] == 0  # the whole task comes back
    s.observe(1, _outcomes(t1, lambda t: rates.get(t.id, 4)))  # 0 and 3: second visit -> max_visits, dropped
    t2 = s.next(4, 2)
    assert ids(t2) == ["m/train/4", "m/train/6", "m/train/7", "m/train/8"]  # 1, 2 still resting until step 3
    s.observe(2, [])
    t3 = s.next(4, 3)
    assert ids(t3)[:2] == ["m/train/1", "m/train/2"]  # rested ones are back after rest_steps
    s.observe(3, _outcomes(t3, lambda t: 4))
    drawn = Counter(ids(t0 + t1 + t2 + t3))
    for step in range(4, 30):
        ts = s.next(6, step)
        drawn.update(ids(ts))
        s.observe(step, _outcomes(ts, lambda t: 1 + zlib.crc32(t.id.encode()) % 7))
    assert max(drawn.values()) == 2  # nobody drawn more than max_visits times
    m = s.metrics()
    assert m["sched/revisited_tasks"] > 20 and m["sched/fresh_tasks"] + m["sched/revisited_tasks"] == sum(drawn.values())


def test_revisit_queue_is_bounded() -> None:
    pri = PriorityConfig(revisit_frac=0.1, rest_steps=100, max_visits=4, queue_size=8)
    s = TaskSampler([GenSource("m", "m")], [1.0], seed=0, cfg=_sched(priority=pri))
    for step in range(5):
        ts = s.next(10, step)
        s.observe(step, _outcomes(ts, lambda t: 4 if int(t.id.rsplit("/", 1)[1]) % 2 else 8))
    assert s.metrics()["sched/revisit_queue"] == 8
    assert s.metrics()["sched/rested"] == 0  # all-pass (priority 0) tasks are forgotten first


# --- domain balance --------------------------------------------------------------------------------


def test_two_domain_regression_boosts_then_restores() -> None:
    bal = BalanceConfig(regression_threshold=0.05, boost=3.0)
    s = TaskSampler([GenSource("A", "a"), GenSource("B", "b")], [1.0, 1.0], seed=3, cfg=_sched(balance=bal))

    def share_b(n: int = 3000) -> float:
        return sum(t.domain == "B" for t in s.next(n)) / n

    s.on_heldout(0, {"A": 0.50, "B": 0.60, "unknown": 0.1})
    assert s.drain_events() == [] and s.domain_weights() == {"A": 0.5, "B": 0.5}
    assert 0.45 < share_b() < 0.55
    s.on_heldout(10, {"A": 0.45, "B": 0.50})  # A: exactly the threshold (no); B: 0.10 below its best
    ev = s.drain_events()
    assert [(e["step"], e["kind"], e["domain"]) for e in ev] == [(10, "weight", "B")]
    assert ev[0]["old"] == pytest.approx(0.5) and ev[0]["new"] == pytest.approx(0.75)
    assert "held-out pass@1 0.500 < best 0.600 - 0.050" in ev[0]["reason"]
    assert s.domain_weights() == pytest.approx({"A": 0.25, "B": 0.75})
    assert s.metrics()["sched/weight/B"] == pytest.approx(0.75)
    assert 0.70 < share_b() < 0.80  # draws shift toward B
    s.on_heldout(20, {"A": 0.5, "B": 0.40})  # still regressed: no compounding, no new event
    assert s.drain_events() == [] and s.domain_weights() == pytest.approx({"A": 0.25, "B": 0.75})
    s.on_heldout(30, {"A": 0.5, "B": 0.57})  # 0.03 below best: not yet within threshold/2
    assert s.drain_events() == []
    s.on_heldout(40, {"A": 0.5, "B": 0.58})
    ev = s.drain_events()
    assert [(e["step"], e["kind"], e["domain"]) for e in ev] == [(40, "weight", "B")]
    assert ev[0]["old"] == pytest.approx(0.75) and ev[0]["new"] == pytest.approx(0.5) and ev[0]["reason"]
    assert s.domain_weights() == pytest.approx({"A": 0.5, "B": 0.5})
    assert 0.45 < share_b() < 0.55


# --- state -----------------------------------------------------------------------------------------


def _full_config() -> ScheduleConfig:
    return ScheduleConfig(
        curriculum=CurriculumConfig(enabled=True, advance_at=0.6, min_samples=24, window=40, lookahead=4),
        priority=PriorityConfig(revisit_frac=0.25, rest_steps=2, max_visits=3, queue_size=12),
        balance=BalanceConfig(regression_threshold=0.05, boost=2.0))


def _make(tmp_path: Path) -> tuple[list[TaskSource], list[float], list[int]]:
    rows = [{"prompt": f"j{i}", "answer": "1", "split": "train", "difficulty": (i * 7) % 5} for i in range(3000)]
    path = tmp_path / "j.jsonl"
    if not path.exists():
        _jsonl(path, rows)
    sources = [GenSource("A", "a0"), GenSource("A", "a1"), GenSource("A", "a2"), GenSource("B", "b0", repeat_every=50),
               GenSource("B", "b1"), make_source(f"jsonl:{path}")]
    return sources, [1.0, 2.0, 1.0, 1.0, 1.0, 0.5], [0, 1, 2, 0, 1, 0]


def _successes(t: Task, step: int) -> int:
    h = zlib.crc32(f"{t.id}@{step}".encode())
    return {"A": min(8, h % 5 + step // 4), "B": min(8, h % 5 + step // 6)}.get(t.domain, 8 if h % 3 else 0)


def _drive(s: TaskSampler, steps: range) -> list:
    trace = []
    for step in steps:
        tasks = s.next(10, step)
        s.observe(step, _outcomes(tasks[:8], lambda t, step=step: _successes(t, step)))  # 2 drawn, never trained
        if step % 4 == 3:
            s.on_heldout(step, {"A": 0.5 + 0.2 * ((step // 4) % 2), "B": 0.6 - 0.1 * ((step // 4) % 3)})
        trace.append(([t.id for t in tasks], [(t.prompt, dict(t.hidden), t.difficulty) for t in tasks],
                      s.metrics(), s.drain_events()))
    return trace


def test_state_round_trip_is_exact_with_all_features(tmp_path: Path) -> None:
    exclude = {"b0 q5", "j17"}
    a = TaskSampler(*_make(tmp_path)[:2], seed=11, exclude_questions=exclude, levels=_make(tmp_path)[2],
                    cfg=_full_config())
    before = _drive(a, range(12))
    state = json.loads(json.dumps(a.state_dict()))
    sources, weights, levels = _make(tmp_path)
    b = TaskSampler(sources, weights, seed=11, exclude_questions=exclude, levels=levels, cfg=_full_config())
    b.load_state_dict(state)
    assert [s.yielded for s in sources[:5]] == [st["consumed"] for st in state["streams"][:5]]  # skipped, not more
    assert b.metrics() == a.metrics()
    ta, tb = _drive(a, range(12, 40)), _drive(b, range(12, 40))
    assert ta == tb
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())
    # the run exercised every feature
    events = [e for step in before + ta for e in step[3]]
    assert {e["kind"] for e in events} == {"level", "weight"}
    assert {e["kind"] for e in events if e["step"] >= 12} == {"level", "weight"}
    assert a.metrics()["sched/level/A"] == 2.0 and a.revisited > 20 and a.skipped > 0
    assert a.dropped_max_visits > 0 and len(a.queue) == 12


def test_state_mismatch_is_refused(tmp_path: Path) -> None:
    sources, weights, levels = _make(tmp_path)
    a = TaskSampler(sources, weights, seed=0, levels=levels, cfg=_full_config())
    a.next(5)
    b = TaskSampler(sources[:5], weights[:5], seed=0, levels=levels[:5], cfg=_full_config())
    with pytest.raises(ConfigError, match="saved for sources"):
        b.load_state_dict(a.state_dict())
    short = TaskSampler([GenSource("m", "m", n=3)], [1.0], seed=0)
    with pytest.raises(ConfigError, match="fewer tasks"):
        short.load_state_dict({**short.state_dict(), "streams": [{"consumed": 5, "buffer": [], "exhausted": False}]})


def test_a_source_named_twice_gets_its_own_task_ids() -> None:
    """configs/mixed.yaml names finance twice (level 1, level 2): both streams yield 'finance/<split>/<seed>'.
    Per-task records are keyed by id (held-out maps, revisits, state), so the repeat's ids carry '@s<index>';
    the first occurrence keeps its ids (runs without a repeat are unchanged)."""
    from honing.config import load_config
    from honing.schedule.setup import build_tasks

    cfg, _ = load_config("smoke", [
        "eval.heldout_tasks=12", "tasks.sources=[{name: finance, params: {level: [1]}}, "
        "{name: 'gym:basic_arithmetic'}, {name: finance, level: 1, params: {level: [2]}}]"])
    setup = build_tasks(cfg)
    ids = [t.id for t in setup.heldout]
    assert len(ids) == len(set(ids)) == 12
    fin = [t for t in setup.heldout if t.domain == "finance"]
    assert sum(t.id.endswith("@s2") for t in fin) == 4 and sum("@" not in t.id for t in fin) == 4
    plain = list(itertools.islice(make_source("finance", {"level": [1]}).tasks("heldout", cfg.tasks.heldout_seed), 4))
    assert [t.id for t in fin if "@" not in t.id] == [t.id for t in plain]  # the first keeps its ids and tasks
    level2 = list(itertools.islice(make_source("finance", {"level": [2]}).tasks("heldout", cfg.tasks.heldout_seed), 4))
    assert [t for t in fin if t.id.endswith("@s2")] == [replace(t, id=t.id + "@s2") for t in level2]
    a, b = (list(itertools.islice(setup.sources[i].tasks("train", 7), 50)) for i in (0, 2))
    assert not {t.id for t in a} & {t.id for t in b} and setup.sources[2].domain == "finance"
