"""The rollout worker pool (honing.schedule.pool) with fake slots: weights once per slot and version,
a dead or hung slot's request resubmitted and returned exactly once, bounded failures, elastic
add/remove (also through workers.json), batch splitting; and one real ProcessWorker killed mid-request."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from honing.errors import HoningError
from honing.schedule.orchestrate import RolloutBatch
from honing.schedule.pool import ProcessSlot, RolloutSplit, SlotDied, WorkerPool, part_seed
from honing.schedule.workers import ProcessWorker, WorkerTimeout

W0 = {"x": torch.tensor([1.0])}
W1 = {"x": torch.tensor([2.0])}


class FakeSlot:
    """Answers `delay` s after submit with what it was asked and the weights it holds.
    `die` / `hang` can be switched on at any time (a dead slot raises SlotDied; a hung one never answers)."""

    def __init__(self, name: str, delay: float = 0.0, fail: bool = False, die_on_submit: bool = False) -> None:
        self.name, self.delay, self.fail = name, delay, fail
        self.die, self.hang, self.closed, self.die_on_submit = False, False, False, die_on_submit
        self.loaded: list[int] = []
        self.ran: list[int] = []
        self.w: float | None = None
        self.version: int | None = None
        self.jobs: dict[int, tuple[float, dict]] = {}

    def submit(self, rid: int, payload, seed: int, version: int, weights) -> None:
        if self.die or self.die_on_submit:
            raise SlotDied(f"{self.name} is gone")
        if weights is not None:
            self.loaded.append(version)
            self.w, self.version = float(weights["x"][0]), version
        elif self.version != version:
            raise HoningError(f"{self.name} holds version {self.version}, asked for {version} without weights")
        self.jobs[rid] = (time.monotonic() + self.delay, {"payload": payload, "seed": seed, "w": self.w,
                                                         "version": version, "by": self.name})

    def collect(self, rid: int, timeout_s: float | None = None):
        if self.die:
            raise SlotDied(f"{self.name} died")
        ready, res = self.jobs[rid]
        if self.hang or time.monotonic() < ready:
            raise WorkerTimeout("not yet")
        del self.jobs[rid]
        if self.fail:
            raise RuntimeError(f"rollout failed in {self.name}")
        self.ran.append(res["payload"]["i"])
        return res, {"worker/busy_s": 1.0, "version": res["version"]}

    def close(self) -> None:
        self.closed = True


def collect_all(pool: WorkerPool, ids, timeout_s: float = 10.0) -> dict[int, dict]:
    return {i: pool.collect(i, timeout_s)[0] for i in ids}


def test_results_weights_once_per_slot_and_version_and_snapshots() -> None:
    a, b = FakeSlot("a", 0.02), FakeSlot("b", 0.02)
    w = {"x": torch.tensor([1.0])}
    with WorkerPool([a, b]) as pool:
        for i in range(6):
            pool.submit(i, {"i": i}, seed=100 + i, version=0, weights=w if i == 0 else None)
        w["x"].fill_(99.0)  # the caller trains on: the pool sent a snapshot
        for i in range(6, 12):
            pool.submit(i, {"i": i}, seed=100 + i, version=1, weights={"x": torch.tensor([2.0])} if i == 6 else None)
        assert pool.pending() == list(range(12))
        got = collect_all(pool, range(12))
        assert pool.pending() == []
        with pytest.raises(HoningError, match="already collected"):
            pool.collect(3)
    for i, r in got.items():
        assert r["payload"] == {"i": i} and r["seed"] == 100 + i
        assert r["w"] == (1.0 if i < 6 else 2.0) and r["version"] == (0 if i < 6 else 1)
    for s in (a, b):  # each slot loaded each version at most once
        assert len(s.loaded) == len(set(s.loaded)) and s.loaded == sorted(s.loaded)
    assert sorted(a.ran + b.ran) == list(range(12)) and a.ran and b.ran
    assert a.closed and b.closed


def test_dead_slot_request_is_resubmitted_and_returned_once() -> None:
    a, b = FakeSlot("a", 0.3), FakeSlot("b", 0.01)
    with WorkerPool([a, b]) as pool:
        pool.submit(0, {"i": 0}, 1, 0, W0)   # goes to a (least recently used, then slot id)
        time.sleep(0.1)
        assert 0 in [r["payload"]["i"] for _, r in a.jobs.values()]
        a.die = True
        res, info = pool.collect(0, 5.0)
        assert res["by"] == "b" and res["w"] == 1.0 and info["worker/busy_s"] == 1.0
        assert pool.stats["died"] == 1 and pool.stats["resubmitted"] == 1
        assert pool.size() == 1 and a.closed
        pool.submit(1, {"i": 1}, 2, 0, None)  # the survivor keeps serving
        assert pool.collect(1, 5.0)[0]["by"] == "b"
    assert b.ran == [0, 1]


def test_hung_slot_is_replaced_and_its_late_answer_never_counts() -> None:
    hung = FakeSlot("hung", 0.0)
    hung.hang = True
    made: list[FakeSlot] = []

    def make() -> FakeSlot:
        made.append(FakeSlot(f"new{len(made)}", 0.01))
        return made[-1]

    with WorkerPool([hung], make_slot=make, call_timeout_s=0.3) as pool:
        t0 = time.monotonic()
        pool.submit(0, {"i": 0}, 1, 0, W0)
        res, _ = pool.collect(0, 10.0)
        assert 0.3 <= time.monotonic() - t0 < 5.0
        assert res["by"] == "new0" and res["w"] == 1.0  # the replacement got the weights of the version
        hung.hang = False  # it answers after all: nobody reads it any more
        pool.submit(1, {"i": 1}, 2, 0, None)
        assert pool.collect(1, 5.0)[0]["by"] == "new0"
        assert pool.stats["hung"] == 1 and pool.size() == 1 and hung.closed and hung.ran == []
    kinds = [e["event"] for e in pool.events]
    assert kinds.count("hung") == 1 and kinds.count("add") == 2


def test_rollout_error_fails_its_batch_only() -> None:
    bad, good = FakeSlot("bad", fail=True), FakeSlot("good", 0.05)
    with WorkerPool([bad, good]) as pool:
        pool.submit(0, {"i": 0}, 1, 0, W0)
        pool.submit(1, {"i": 1}, 1, 0, None)
        with pytest.raises(HoningError, match="rollout failed in bad"):
            pool.collect(0, 5.0)
        assert pool.collect(1, 5.0)[0]["by"] == "good"


def test_lost_too_often_fails_in_bounded_time_and_no_slots_left_fails() -> None:
    with WorkerPool([], make_slot=lambda: FakeSlot("doomed", die_on_submit=True), max_attempts=3) as pool:
        pool.resize(2)
        pool.submit(0, {"i": 0}, 1, 0, W0)
        with pytest.raises(HoningError, match="lost on 3 workers"):
            pool.collect(0, 10.0)
    a = FakeSlot("a", 0.2)
    with WorkerPool([a]) as pool:  # no make_slot: when the last slot dies, the batch fails
        pool.submit(0, {"i": 0}, 1, 0, W0)
        time.sleep(0.05)
        a.die = True
        with pytest.raises(HoningError, match="no rollout workers are left"):
            pool.collect(0, 10.0)


def test_collect_times_out_and_a_batch_can_still_be_collected_later() -> None:
    a = FakeSlot("a", 0.4)
    with WorkerPool([a]) as pool:
        pool.submit(0, {"i": 0}, 1, 0, W0)
        with pytest.raises(WorkerTimeout):
            pool.collect(0, 0.05)
        assert pool.collect(0, 5.0)[0]["payload"] == {"i": 0}


def test_added_slot_gets_work_removed_slot_finishes_or_hands_back(tmp_path: Path) -> None:
    a = FakeSlot("a", 0.05)
    made: list[FakeSlot] = []

    def make() -> FakeSlot:
        made.append(FakeSlot(f"n{len(made)}", 0.05))
        return made[-1]

    with WorkerPool([a], make_slot=make) as pool:
        pool.submit(0, {"i": 0}, 1, 0, W0)
        pool.collect(0, 5.0)
        sid = pool.add_slot()
        for i in range(1, 5):
            pool.submit(i, {"i": i}, 1, 0, None)
        collect_all(pool, range(1, 5))
        assert made[0].ran, "the added worker received work"
        assert made[0].loaded == [0]  # and the weights of the version its first request needed
        # remove: it finishes what it runs, then gets nothing more
        made[0].delay = 0.3
        pool.submit(5, {"i": 5}, 1, 0, None)
        pool.submit(6, {"i": 6}, 1, 0, None)
        time.sleep(0.05)
        busy_with = [r["payload"]["i"] for _, r in made[0].jobs.values()]
        pool.remove_slot(sid)
        for i in range(7, 10):
            pool.submit(i, {"i": i}, 1, 0, None)
        collect_all(pool, range(5, 10))
        assert busy_with and made[0].ran[-1] == busy_with[0] and made[0].closed
        assert all(i not in made[0].ran for i in range(7, 10))
        # hand back: the request goes to another slot at once
        sid2 = pool.add_slot()
        made[1].hang = True
        pool.submit(10, {"i": 10}, 1, 0, None)
        pool.submit(11, {"i": 11}, 1, 0, None)
        time.sleep(0.1)
        pool.remove_slot(sid2, hand_back=True)
        got = collect_all(pool, [10, 11])
        assert all(r["by"] == "a" for r in got.values()) and made[1].closed
        with pytest.raises(HoningError, match="at least 1 worker"):
            pool.remove_slot()
        # workers.json in the run directory resizes the pool
        pool.attach(tmp_path)
        (tmp_path / "workers.json").write_text(json.dumps({"rollout": 3}))
        deadline = time.monotonic() + 10
        while pool.size() != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.size() == 3
        for i in range(12, 18):
            pool.submit(i, {"i": i}, 1, 0, None)
        collect_all(pool, range(12, 18))
    log = [json.loads(line) for line in (tmp_path / "workers.log").read_text().splitlines()]
    assert [e["to"] for e in log if e["event"] == "resize"] == [3]
    assert made[-1].ran and made[-2].ran


def _batch(tasks, seed: int) -> RolloutBatch:
    """A deterministic fake rollout result: one trajectory stub per task, a function of (task, seed)."""
    from types import SimpleNamespace

    trajs = [SimpleNamespace(group=i, reward=float((hash((t, seed)) % 7) / 7)) for i, t in enumerate(tasks)]
    dropped = [i for i, t in enumerate(tasks) if t.endswith("!")]
    return RolloutBatch(trajs, dropped, {"jobs": float(len(tasks))}, [f"err {t}" for t in tasks if t.endswith("!")])


class SplitSlot(FakeSlot):
    def collect(self, rid: int, timeout_s: float | None = None):
        ready, res = self.jobs[rid]
        if time.monotonic() < ready:
            raise WorkerTimeout("not yet")
        del self.jobs[rid]
        return _batch(res["payload"]["tasks"], res["seed"]), {"worker/busy_s": 1.0}


def test_split_batches_merge_in_order_independent_of_pool_size() -> None:
    tasks = [f"t{i}" + ("!" if i in (2, 7) else "") for i in range(10)]
    out = []
    for n_slots in (1, 4):
        with WorkerPool([SplitSlot(f"s{j}", 0.01 * j) for j in range(n_slots)], split=RolloutSplit(3)) as pool:
            pool.submit(0, {"tasks": tasks, "round": 0}, 42, 0, W0)
            res, info = pool.collect(0, 10.0)
        out.append(res)
        assert info["worker/busy_s"] == 4.0  # 4 chunks: 3 + 3 + 3 + 1 tasks
    a, b = out
    assert [t.group for t in a.trajs] == list(range(10)) and a.dropped == [2, 7]
    assert [t.reward for t in a.trajs] == [t.reward for t in b.trajs] and a.stats == b.stats == {"jobs": 10.0}
    assert a.errors == ["err t2!", "err t7!"]
    seeds = [s for _, s in RolloutSplit(3).split({"tasks": tasks}, 42)]
    assert seeds[0] == 42 and len(set(seeds)) == 4 and seeds[1] == part_seed(42, 1)
    expect = [t.reward for i, c in enumerate([tasks[0:3], tasks[3:6], tasks[6:9], tasks[9:]])
              for t in _batch(c, part_seed(42, i)).trajs]
    assert [t.reward for t in a.trajs] == expect


def test_a_killed_process_worker_slot_loses_nothing() -> None:
    """Real parts: two ProcessWorkers (echo side); the one running the request is SIGKILLed."""
    factory = "honing.schedule._testing_side:make_echo_side"
    slots = [ProcessSlot(ProcessWorker(factory, threads=1)) for _ in range(2)]
    with WorkerPool(slots, call_timeout_s=60) as pool:
        pool.submit(0, {"i": 0, "sleep": 1.5}, 7, 0, W0)
        time.sleep(0.5)
        os.kill(slots[0].worker.pid, signal.SIGKILL)
        res, _ = pool.collect(0, 30.0)
        assert res["payload"] == {"i": 0, "sleep": 1.5} and res["seed"] == 7 and res["checksum"] == 1.0
        assert pool.stats["died"] == 1 and pool.stats["resubmitted"] == 1 and pool.size() == 1
        assert "died" in next(e["why"] for e in pool.events if e["event"] == "died")


def test_workers_request_file_is_checked(tmp_path: Path) -> None:
    from honing.schedule.pool import request_size

    with pytest.raises(HoningError, match="no config.yaml"):
        request_size(tmp_path, 2)
    (tmp_path / "config.yaml").write_text("schedule:\n  workers: process\n")
    with pytest.raises(HoningError, match="only schedule.workers=ray"):
        request_size(tmp_path, 2)
    (tmp_path / "config.yaml").write_text("schedule:\n  workers: ray\n")
    with pytest.raises(HoningError, match="at least 1"):
        request_size(tmp_path, 0)
    assert json.loads(request_size(tmp_path, 5).read_text())["rollout"] == 5
