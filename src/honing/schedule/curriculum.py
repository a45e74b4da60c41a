"""Small, pure pieces of the task schedule (used by `TaskSampler`): rolling pass-rate windows,
per-domain curriculum levels, the bounded revisit priority queue and the held-out regression guard.

Every piece has `state_dict()` / `from_state()` with plain-JSON state, and every choice it makes is
a function of that state alone (ties break on insertion order), so a restored piece behaves exactly
like the original.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

_EPS = 1e-12


def informativeness(pass_rate: float) -> float:
    """Revisit priority of a task: p*(1-p), highest at 0.5, zero for all-pass or all-fail groups."""
    return pass_rate * (1.0 - pass_rate)


class PassWindow:
    """Pass/fail of the last `size` samples (one bit each) with a running sum."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.bits: deque[int] = deque(maxlen=size)
        self.passes = 0

    def add(self, samples: int, successes: int) -> None:
        successes = max(0, min(successes, samples))
        for bit in [1] * successes + [0] * (samples - successes):
            if len(self.bits) == self.size:
                self.passes -= self.bits[0]
            self.bits.append(bit)
            self.passes += bit

    def __len__(self) -> int:
        return len(self.bits)

    @property
    def rate(self) -> float | None:
        return self.passes / len(self.bits) if self.bits else None

    def clear(self) -> None:
        self.bits.clear()
        self.passes = 0

    def state_dict(self) -> str:
        return "".join("1" if b else "0" for b in self.bits)

    def load(self, bits: str) -> None:
        self.clear()
        for ch in bits[-self.size:]:
            self.bits.append(1 if ch == "1" else 0)
        self.passes = sum(self.bits)


class DomainLevels:
    """One domain's curriculum: its sorted levels, the current one, and the pass-rate window and
    sample count at the current level (both reset on advancing)."""

    def __init__(self, levels: Iterable[int], window: int) -> None:
        self.levels = sorted(set(levels))
        self.index = 0
        self.window = PassWindow(window)
        self.seen = 0  # samples at the current level (not capped by the window)

    @property
    def level(self) -> int:
        return self.levels[self.index]

    @property
    def at_top(self) -> bool:
        return self.index == len(self.levels) - 1

    def add(self, samples: int, successes: int) -> None:
        self.window.add(samples, successes)
        self.seen += samples

    def maybe_advance(self, advance_at: float, min_samples: int) -> tuple[int, int, str] | None:
        """Move to the next level if the rolling pass rate reached `advance_at` over at least
        `min_samples` samples at this level: (old level, new level, reason), else None."""
        rate = self.window.rate
        if self.at_top or rate is None or self.seen < min_samples or rate < advance_at - _EPS:
            return None
        old = self.level
        reason = (f"pass rate {rate:.3f} >= {advance_at:.3f} over the last {len(self.window)} samples "
                  f"({self.seen} at level {old})")
        self.index += 1
        self.window.clear()
        self.seen = 0
        return old, self.level, reason

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index, "seen": self.seen, "window": self.window.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
        if not 0 <= self.index < len(self.levels):
            raise ValueError(f"curriculum level index {self.index} out of range for levels {self.levels}")
        self.seen = int(state["seen"])
        self.window.load(state["window"])


@dataclass
class RevisitEntry:
    """A seen task waiting for a revisit. `task` is its `task_to_json` dict; `source` the index of
    the source it came from; `visits` how many times it was drawn so far."""

    task: dict[str, Any]
    source: int
    priority: float
    due: int
    visits: int
    pass_rate: float
    seq: int = 0

    @property
    def id(self) -> str:
        return str(self.task["id"])


class RevisitQueue:
    """At most `size` entries. `pop_due(step, n)` returns up to n entries whose `due` step has come,
    highest priority first (then oldest); when full, the lowest priority (then oldest) entry is
    forgotten. Heaps with lazy deletion keep both operations O(log n)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: dict[str, RevisitEntry] = {}
        self.seq = 0
        self._waiting: list[tuple[int, int, str]] = []  # (due, seq, id)
        self._ready: list[tuple[float, int, str]] = []  # (-priority, seq, id), due already
        self._evict: list[tuple[float, int, str]] = []  # (priority, seq, id)
        self._clock = -(10 ** 18)  # largest step pop_due has seen (entries due by then are in _ready)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.entries

    def _live(self, seq: int, tid: str) -> bool:
        e = self.entries.get(tid)
        return e is not None and e.seq == seq

    def push(self, entry: RevisitEntry) -> RevisitEntry | None:
        """Add (or replace) an entry; returns the entry forgotten to make room, if any."""
        entry.seq = self.seq
        self.seq += 1
        self.entries[entry.id] = entry
        self._index(entry)
        dropped = None
        while len(self.entries) > self.size:
            _, seq, tid = heapq.heappop(self._evict)
            if self._live(seq, tid):
                dropped = self.entries.pop(tid)
        self._compact()
        return dropped

    def _index(self, e: RevisitEntry) -> None:
        heapq.heappush(self._evict, (e.priority, e.seq, e.id))
        if e.due <= self._clock:
            heapq.heappush(self._ready, (-e.priority, e.seq, e.id))
        else:
            heapq.heappush(self._waiting, (e.due, e.seq, e.id))

    def _compact(self) -> None:
        if len(self._evict) + len(self._ready) + len(self._waiting) > 4 * len(self.entries) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._evict, self._ready, self._waiting = [], [], []
        for e in self.entries.values():
            self._evict.append((e.priority, e.seq, e.id))
            if e.due <= self._clock:
                self._ready.append((-e.priority, e.seq, e.id))
            else:
                self._waiting.append((e.due, e.seq, e.id))
        for h in (self._evict, self._ready, self._waiting):
            heapq.heapify(h)

    def pop_due(self, step: int, n: int) -> list[RevisitEntry]:
        self._clock = max(self._clock, step)
        while self._waiting and self._waiting[0][0] <= self._clock:
            _, seq, tid = heapq.heappop(self._waiting)
            if self._live(seq, tid):
                heapq.heappush(self._ready, (-self.entries[tid].priority, seq, tid))
        out: list[RevisitEntry] = []
        later: list[tuple[float, int, str]] = []  # due by the clock but not by `step` (an earlier step)
        while self._ready and len(out) < n:
            item = heapq.heappop(self._ready)
            _, seq, tid = item
            if not self._live(seq, tid):
                continue
            if self.entries[tid].due <= step:
                out.append(self.entries.pop(tid))
            else:
                later.append(item)
        for item in later:
            heapq.heappush(self._ready, item)
        self._compact()
        return out

    def resting(self, step: int) -> int:
        """Entries not yet due at `step`."""
        return sum(e.due > step for e in self.entries.values())

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON; the task dicts are shared with the queue, not copied (serialise, don't mutate)."""
        fields = ("task", "source", "priority", "due", "visits", "pass_rate", "seq")
        return {"seq": self.seq, "clock": self._clock,
                "entries": [{f: getattr(e, f) for f in fields}
                            for e in sorted(self.entries.values(), key=lambda e: e.seq)]}

    def load(self, state: dict[str, Any]) -> None:
        self.seq = int(state["seq"])
        self._clock = int(state["clock"])
        self.entries = {}
        for d in state["entries"]:
            e = RevisitEntry(**d)
            self.entries[e.id] = e
        self._rebuild()


class RegressionGuard:
    """Per-domain best held-out pass@1. A domain whose score falls more than `threshold` below its
    best is boosted (its weight multiplied by `boost`, once); it is restored once a score is back
    within `threshold / 2` of the best."""

    def __init__(self, threshold: float, boost: float) -> None:
        self.threshold = threshold
        self.boost = boost
        self.best: dict[str, float] = {}
        self.boosted: set[str] = set()

    def multiplier(self, domain: str) -> float:
        return self.boost if domain in self.boosted else 1.0

    def update(self, domain: str, score: float) -> tuple[str, str] | None:
        """Record a score; ('boost' | 'restore', reason) when the domain's state changes, else None."""
        best = max(self.best.get(domain, score), score)
        self.best[domain] = best
        if domain not in self.boosted and best - score > self.threshold + _EPS:
            self.boosted.add(domain)
            return "boost", (f"held-out pass@1 {score:.3f} < best {best:.3f} - {self.threshold:.3f}: "
                             f"weight x{self.boost:g} until back within {self.threshold / 2:.3f} of best")
        if domain in self.boosted and best - score <= self.threshold / 2 + _EPS:
            self.boosted.discard(domain)
            return "restore", (f"held-out pass@1 {score:.3f} back within {self.threshold / 2:.3f} of best "
                               f"{best:.3f}: weight restored")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(sorted(self.best.items())), "boosted": sorted(self.boosted)}

    def load(self, state: dict[str, Any]) -> None:
        self.best = {str(k): float(v) for k, v in state["best"].items()}
        self.boosted = set(state["boosted"])
