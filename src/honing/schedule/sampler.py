"""Task sampling across sources by mixing weight, streamed, never overlapping held-out tasks.

With a `ScheduleConfig` the sampler also runs the schedule's data side:

- curriculum (`schedule.curriculum`): each domain draws only from its sources at its current level
  and moves up a level when its rolling pass rate at that level reaches `advance_at`; with
  `lookahead` each stream buffers that many tasks and serves the easiest (`task.difficulty`) first;
- priorities (`schedule.priority`): seen tasks whose groups had mixed results come back first,
  all-pass / all-fail ones rest, nobody is drawn more than `max_visits` times;
- domain balance (`schedule.balance`): a domain whose held-out pass@1 regresses gets its weight
  boosted until it recovers.

Sources are never materialised: a stream's position is the number of tasks taken from it, and a
restore re-opens the stream and skips that many. Without a config (or with every feature off)
the task sequence is exactly the one of the plain weighted sampler.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from honing.errors import ConfigError
from honing.schedule.curriculum import DomainLevels, RegressionGuard, RevisitEntry, RevisitQueue, informativeness
from honing.tasks.gym import TRAIN_SEED_SPAN
from honing.tasks.types import Task, TaskSource, task_from_json, task_to_json

if TYPE_CHECKING:
    from honing.config import ScheduleConfig

STATE_VERSION = 1
PENDING_MAX = 16384  # drawn-but-not-yet-observed tasks remembered (oldest forgotten first)


def heldout_tasks(sources: Sequence[TaskSource], count: int, seed: int) -> list[Task]:
    """`count` held-out tasks spread evenly over the sources (round-robin)."""
    its = [s.tasks("heldout", seed) for s in sources]
    out: list[Task] = []
    live = list(range(len(its)))
    while len(out) < count and live:
        for i in list(live):
            if len(out) >= count:
                break
            try:
                out.append(next(its[i]))
            except StopIteration:
                live.remove(i)
    return out


def check_seed_ranges(train_seed: int, heldout_seed: int) -> None:
    """Procedural held-out tasks must come from seeds training never uses."""
    if train_seed <= heldout_seed < train_seed + TRAIN_SEED_SPAN or \
            heldout_seed <= train_seed < heldout_seed + TRAIN_SEED_SPAN:
        raise ConfigError(f"tasks.heldout_seed={heldout_seed} overlaps the training seed range "
                          f"[{train_seed}, {train_seed + TRAIN_SEED_SPAN}); pick seeds at least "
                          f"{TRAIN_SEED_SPAN} apart")


@dataclass(frozen=True)
class Outcome:
    """One task's result in a trained step: `samples` completions, `successes` of them passed."""

    task_id: str
    domain: str
    samples: int
    successes: int
    mean_reward: float


def _json_task(task: Task) -> dict[str, Any]:
    """`task_to_json`, normalised through JSON so a restored sampler holds exactly the same data."""
    return json.loads(json.dumps(task_to_json(task), default=str))


def _skip(it: Iterator[Task], n: int) -> int:
    """Advance `it` by up to n items without keeping them; how many were skipped."""
    return sum(1 for _ in itertools.islice(it, n))


class _Stream:
    """One source's training stream. `consumed` counts tasks taken from the iterator (the position
    a restore skips to). With `lookahead` > 0 it keeps that many tasks buffered and serves the one
    with the lowest difficulty (None counts as 0; ties: stream order)."""

    def __init__(self, source: TaskSource, seed: int, lookahead: int) -> None:
        self.source = source
        self.seed = seed
        self.lookahead = lookahead
        self.it: Iterator[Task] = source.tasks("train", seed)
        self.consumed = 0
        self.buffer: list[tuple[int, Task]] = []  # (ordinal in the stream, task), stream order
        self.exhausted = False

    def _pull(self) -> Task:
        task = next(self.it)
        self.consumed += 1
        return task

    def take(self) -> Task:
        """The next task; StopIteration when the source has run out."""
        if self.lookahead <= 0:
            return self._pull()
        while not self.exhausted and len(self.buffer) < self.lookahead:
            try:
                task = self._pull()
            except StopIteration:
                self.exhausted = True
                break
            self.buffer.append((self.consumed - 1, task))
        if not self.buffer:
            raise StopIteration
        best = min(range(len(self.buffer)), key=lambda j: self.buffer[j][1].difficulty or 0.0)
        return self.buffer.pop(best)[1]

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "buffer": [k for k, _ in self.buffer], "exhausted": self.exhausted}

    def load(self, state: dict[str, Any]) -> None:
        """Re-open the stream and skip (streaming) to the saved position, keeping buffered tasks."""
        consumed = int(state["consumed"])
        wanted = sorted(int(k) for k in state["buffer"])
        self.it = self.source.tasks("train", self.seed)
        self.buffer = []
        pos = 0
        for k in wanted:
            if not 0 <= k < consumed or _skip(self.it, k - pos) != k - pos:
                raise ConfigError(f"task source {self.source.domain}: saved sampler state does not match the "
                                  f"source (buffered task {k} of {consumed})")
            try:
                self.buffer.append((k, next(self.it)))
            except StopIteration:
                raise ConfigError(f"task source {self.source.domain} has fewer tasks than the saved sampler "
                                  f"state consumed ({consumed})") from None
            pos = k + 1
        if _skip(self.it, consumed - pos) != consumed - pos:
            raise ConfigError(f"task source {self.source.domain} has fewer tasks than the saved sampler state "
                              f"consumed ({consumed})")
        self.consumed = consumed
        self.exhausted = bool(state["exhausted"])


class TaskSampler:
    """Draws training tasks: a source by weight, then that source's next task. Tasks whose
    question equals a held-out question are skipped (small domains repeat questions).

    `levels` gives each source's curriculum level (default 0); `cfg` turns on curriculum, revisits
    and domain balance (see the module docstring). A domain's mixing weight is the sum of its
    sources' weights; under the curriculum it is split among the sources of the domain's current
    level in proportion to their weights."""

    def __init__(self, sources: Sequence[TaskSource], weights: Sequence[float], seed: int,
                 exclude_questions: set[str] | frozenset[str] = frozenset(), levels: Sequence[int] | None = None,
                 cfg: ScheduleConfig | None = None) -> None:
        from honing.config import ScheduleConfig

        self.sources = list(sources)
        self.weights = list(weights)
        if len(self.weights) != len(self.sources):
            raise ConfigError(f"{len(self.sources)} task sources but {len(self.weights)} weights")
        self.levels = [int(x) for x in levels] if levels is not None else [0] * len(self.sources)
        if len(self.levels) != len(self.sources):
            raise ConfigError(f"{len(self.sources)} task sources but {len(self.levels)} levels")
        self.seed = seed
        self.cfg = cfg if cfg is not None else ScheduleConfig()
        cur, pri, bal = self.cfg.curriculum, self.cfg.priority, self.cfg.balance
        self.curriculum = cur.enabled
        self.revisit_frac = pri.revisit_frac
        self.rng = random.Random(seed)
        self.streams = [_Stream(s, seed, cur.lookahead) for s in self.sources]
        self.exclude = set(exclude_questions)
        self.skipped = 0
        self.domains = list(dict.fromkeys(s.domain for s in self.sources))
        self.domain_base = {d: sum(w for s, w in zip(self.sources, self.weights) if s.domain == d)
                            for d in self.domains}
        self.domain_levels = {d: DomainLevels([lv for s, lv in zip(self.sources, self.levels) if s.domain == d],
                                              cur.window) for d in self.domains}
        self.guard = RegressionGuard(bal.regression_threshold, bal.boost)
        self.queue = RevisitQueue(pri.queue_size)
        self.pending: OrderedDict[str, list[Any]] = OrderedDict()  # task id -> [source, visits, task json]
        self.events: list[dict[str, Any]] = []
        self.fresh_drawn = 0
        self.revisited = 0
        self.dropped_max_visits = 0
        self._eff: list[float] | None = None

    @property
    def iters(self) -> list[Iterator[Task]]:
        return [s.it for s in self.streams]

    # --- weights ----------------------------------------------------------------------------------

    def _source_weights(self) -> list[float]:
        if self._eff is None:
            eff = []
            for i, s in enumerate(self.sources):
                mult = self.guard.multiplier(s.domain)
                if not self.curriculum:
                    eff.append(self.weights[i] * mult)
                    continue
                level = self.domain_levels[s.domain].level
                if self.levels[i] != level:
                    eff.append(0.0)
                    continue
                active = sum(w for t, w, lv in zip(self.sources, self.weights, self.levels)
                             if t.domain == s.domain and lv == level)
                eff.append(self.weights[i] / active * self.domain_base[s.domain] * mult)
            self._eff = eff
        return self._eff

    def domain_weights(self) -> dict[str, float]:
        """Effective normalised mixing weight per domain right now."""
        raw = {d: self.domain_base[d] * self.guard.multiplier(d) for d in self.domains}
        total = sum(raw.values())
        return {d: w / total for d, w in raw.items()}

    # --- drawing ----------------------------------------------------------------------------------

    def _remember(self, task_id: str, source: int, visits: int, task_json: dict[str, Any] | None) -> None:
        if not (self.curriculum or self.revisit_frac > 0):
            return
        self.pending[task_id] = [source, visits, task_json]
        self.pending.move_to_end(task_id)
        while len(self.pending) > PENDING_MAX:
            self.pending.popitem(last=False)

    def next(self, count: int, step: int = 0) -> list[Task]:
        out: list[Task] = []
        n_revisit = round(count * self.revisit_frac) if self.revisit_frac > 0 else 0
        if n_revisit:
            for e in self.queue.pop_due(step, n_revisit):
                task = task_from_json(e.task, "revisit task")
                self._remember(task.id, e.source, e.visits + 1, e.task)
                out.append(task)
                self.revisited += 1
        weights = self._source_weights()
        choices = range(len(self.sources))
        while len(out) < count:
            i = self.rng.choices(choices, weights=weights)[0]
            try:
                task = self.streams[i].take()
            except StopIteration:
                raise ConfigError(f"task source {self.sources[i].domain} ran out of training tasks") from None
            if task.question in self.exclude:
                self.skipped += 1
                continue
            out.append(task)
            self.fresh_drawn += 1
            self._remember(task.id, i, 1, _json_task(task) if self.revisit_frac > 0 else None)
        return out

    # --- feedback ---------------------------------------------------------------------------------

    def _event(self, step: int, kind: str, domain: str, old: Any, new: Any, reason: str) -> None:
        self.events.append({"step": step, "kind": kind, "domain": domain, "old": old, "new": new, "reason": reason})

    def observe(self, step: int, outcomes: Sequence[Outcome]) -> None:
        """A step trained on these tasks: update pass rates, curriculum levels and the revisit queue."""
        pri = self.cfg.priority
        for o in outcomes:
            info = self.pending.pop(o.task_id, None)
            if info is not None:
                src, visits, tj = info
                domain, level = self.sources[src].domain, self.levels[src]
            else:
                src, visits, tj, domain, level = None, 0, None, o.domain, None
            if o.samples <= 0:
                continue
            dl = self.domain_levels.get(domain)
            if dl is not None and (not self.curriculum or level is None or level == dl.level):
                dl.add(o.samples, o.successes)
            if self.revisit_frac > 0 and tj is not None:
                if visits >= pri.max_visits:
                    self.dropped_max_visits += 1
                    continue
                p = min(max(o.successes / o.samples, 0.0), 1.0)
                due = step + 1 if 0.0 < p < 1.0 else step + max(1, pri.rest_steps)
                self.queue.push(RevisitEntry(tj, src, informativeness(p), due, visits, p))
        if self.curriculum:
            cur = self.cfg.curriculum
            for d in self.domains:
                moved = self.domain_levels[d].maybe_advance(cur.advance_at, cur.min_samples)
                if moved is not None:
                    self._eff = None
                    self._event(step, "level", d, moved[0], moved[1], moved[2])

    def on_heldout(self, step: int, per_domain_pass1: dict[str, float]) -> None:
        """Held-out pass@1 per domain: boost a regressed domain's weight, restore it on recovery."""
        for d in sorted(per_domain_pass1):
            if d not in self.domain_base:
                continue
            old = self.domain_weights()[d]
            changed = self.guard.update(d, float(per_domain_pass1[d]))
            if changed is not None:
                self._eff = None
                self._event(step, "weight", d, old, self.domain_weights()[d], changed[1])

    def drain_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        for d, w in self.domain_weights().items():
            m[f"sched/weight/{d}"] = w
        for d, dl in self.domain_levels.items():
            m[f"sched/level/{d}"] = float(dl.level)
            if dl.window.rate is not None:
                m[f"sched/pass_rate/{d}"] = dl.window.rate
        m["sched/revisit_queue"] = float(len(self.queue))
        m["sched/rested"] = float(sum(not 0.0 < e.pass_rate < 1.0 for e in self.queue.entries.values()))
        m["sched/fresh_tasks"] = float(self.fresh_drawn)
        m["sched/revisited_tasks"] = float(self.revisited)
        m["sched/skipped"] = float(self.skipped)
        return m

    # --- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON (json.dumps works). Task dicts inside are shared with the sampler: serialise the
        state or keep it read-only."""
        version, internal, gauss = self.rng.getstate()
        return {
            "version": STATE_VERSION, "seed": self.seed, "domains": [s.domain for s in self.sources],
            "levels": list(self.levels),
            "rng": [version, list(internal), gauss],
            "streams": [s.state_dict() for s in self.streams],
            "skipped": self.skipped, "fresh_drawn": self.fresh_drawn, "revisited": self.revisited,
            "dropped_max_visits": self.dropped_max_visits,
            "curriculum": {d: dl.state_dict() for d, dl in self.domain_levels.items()},
            "queue": self.queue.state_dict(),
            "pending": [[tid, *info] for tid, info in self.pending.items()],
            "guard": self.guard.state_dict(),
            "events": [dict(e) for e in self.events],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"sampler state version {state.get('version')} is not {STATE_VERSION}")
        if state["domains"] != [s.domain for s in self.sources] or list(state["levels"]) != self.levels:
            raise ConfigError(f"sampler state was saved for sources {state['domains']} (levels {state['levels']}), "
                              f"not {[s.domain for s in self.sources]} (levels {self.levels})")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for stream, st in zip(self.streams, state["streams"], strict=True):
            stream.load(st)
        self.skipped = int(state["skipped"])
        self.fresh_drawn = int(state["fresh_drawn"])
        self.revisited = int(state["revisited"])
        self.dropped_max_visits = int(state["dropped_max_visits"])
        for d, st in state["curriculum"].items():
            self.domain_levels[d].load(st)
        self.queue.load(state["queue"])
        self.pending = OrderedDict((tid, [int(src), int(visits), tj]) for tid, src, visits, tj in state["pending"])
        self.guard.load(state["guard"])
        self.events = [dict(e) for e in state["events"]]
        self._eff = None
