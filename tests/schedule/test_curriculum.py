"""Pure schedule pieces: pass-rate windows, curriculum levels, revisit queue, regression guard."""

from __future__ import annotations

import json

from honing.schedule.curriculum import (DomainLevels, PassWindow, RegressionGuard, RevisitEntry, RevisitQueue,
                                        informativeness)


def test_pass_window_rolls_and_restores() -> None:
    w = PassWindow(4)
    assert w.rate is None and len(w) == 0
    w.add(2, 2)
    assert w.rate == 1.0
    w.add(4, 1)  # the two passes fall out: window = [1, 0, 0, 0]
    assert len(w) == 4 and w.passes == 1 and w.rate == 0.25
    w.add(3, 0)
    assert w.rate == 0.0
    w2 = PassWindow(4)
    w2.load(json.loads(json.dumps(w.state_dict())))
    assert list(w2.bits) == list(w.bits) and w2.passes == w.passes


def test_domain_levels_advance_needs_rate_and_min_samples() -> None:
    d = DomainLevels([2, 0, 2, 1], window=8)
    assert d.levels == [0, 1, 2] and d.level == 0
    d.add(4, 4)
    assert d.maybe_advance(0.7, min_samples=10) is None  # rate 1.0 but only 4 samples
    d.add(4, 1)  # 8 samples, rate 5/8 < 0.7
    assert d.maybe_advance(0.7, min_samples=8) is None
    d.add(4, 4)  # window: last 8 = [1,0,0,0, 1,1,1,1] -> 5/8 still
    assert d.window.rate == 5 / 8 and d.seen == 12
    d.add(2, 2)  # window [0,0,1,1,1,1,1,1] -> 6/8 = 0.75
    old, new, reason = d.maybe_advance(0.7, min_samples=8)
    assert (old, new) == (0, 1) and "0.750" in reason and "level 0" in reason
    assert d.seen == 0 and len(d.window) == 0
    d.add(10, 10)
    assert d.maybe_advance(0.7, 8)[:2] == (1, 2)
    d.add(10, 10)
    assert d.at_top and d.maybe_advance(0.7, 8) is None
    e = DomainLevels([0, 1, 2], window=8)
    e.load(json.loads(json.dumps(d.state_dict())))
    assert e.level == 2 and e.seen == 10 and e.window.rate == 1.0


def _entry(tid: str, p: float, due: int, visits: int = 1) -> RevisitEntry:
    return RevisitEntry({"id": tid}, 0, informativeness(p), due, visits, p)


def test_revisit_queue_order_due_and_eviction() -> None:
    q = RevisitQueue(size=4)
    q.push(_entry("a", 0.5, due=1))
    q.push(_entry("b", 0.1, due=1))
    q.push(_entry("c", 1.0, due=5))  # rested
    q.push(_entry("d", 0.4, due=1))
    assert len(q) == 4
    dropped = q.push(_entry("e", 0.3, due=2))  # full: the rested one (priority 0) is forgotten
    assert dropped is not None and dropped.id == "c" and "c" not in q
    assert q.pop_due(0, 10) == []  # nothing due yet
    assert [e.id for e in q.pop_due(1, 2)] == ["a", "d"]  # most informative first
    assert q.resting(1) == 1  # e is due at 2
    assert [e.id for e in q.pop_due(1, 5)] == ["b"]
    assert [e.id for e in q.pop_due(2, 5)] == ["e"]
    assert len(q) == 0


def test_revisit_queue_ties_break_by_age_and_state_round_trip() -> None:
    q = RevisitQueue(size=100)
    for i in range(30):
        q.push(_entry(f"t{i}", [0.5, 0.0, 0.25][i % 3], due=i % 5))
    q.pop_due(2, 3)
    r = RevisitQueue(size=100)
    r.load(json.loads(json.dumps(q.state_dict())))
    for step in range(2, 8):
        q.push(_entry(f"n{step}", 0.5, due=step + 1))
        r.push(_entry(f"n{step}", 0.5, due=step + 1))
        assert [e.id for e in q.pop_due(step, 4)] == [e.id for e in r.pop_due(step, 4)]
    # equal priority: oldest first
    s = RevisitQueue(size=10)
    for tid in ("x", "y", "z"):
        s.push(_entry(tid, 0.5, due=0))
    assert [e.id for e in s.pop_due(0, 3)] == ["x", "y", "z"]
    # entries pushed already due (the clock has passed their step) still come most informative first
    s.pop_due(10, 1)
    for tid, p in (("lo", 0.1), ("hi", 0.5), ("mid", 0.3)):
        s.push(_entry(tid, p, due=4))
    s.push(_entry("later", 0.5, due=12))
    assert [e.id for e in s.pop_due(10, 5)] == ["hi", "mid", "lo"]
    s.push(_entry("d8", 0.5, due=8))
    assert [e.id for e in s.pop_due(7, 5)] == []  # an earlier step than the clock: not due yet
    assert [e.id for e in s.pop_due(8, 5)] == ["d8"]
    assert [e.id for e in s.pop_due(12, 5)] == ["later"]


def test_regression_guard_boosts_once_and_restores() -> None:
    g = RegressionGuard(threshold=0.05, boost=2.0)
    assert g.update("B", 0.60) is None
    assert g.update("B", 0.55) is None  # exactly the threshold: not "more than"
    kind, reason = g.update("B", 0.40)
    assert kind == "boost" and "0.400 < best 0.600 - 0.050" in reason and g.multiplier("B") == 2.0
    assert g.update("B", 0.30) is None and g.multiplier("B") == 2.0  # no compounding
    assert g.update("B", 0.57) is None  # 0.03 below best > threshold/2
    kind, reason = g.update("B", 0.58)
    assert kind == "restore" and "restored" in reason and g.multiplier("B") == 1.0
    h = RegressionGuard(0.05, 2.0)
    h.load(json.loads(json.dumps(g.state_dict())))
    assert h.best == {"B": 0.60} and h.boosted == set()
