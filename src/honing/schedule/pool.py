"""A pool of rollout workers behind the one-worker interface (`submit` / `collect` / `pending` /
`close`, as `ProcessWorker`), so the pipeline does not know where rollouts run.

    pool = WorkerPool([ProcessSlot(ProcessWorker(...)) for _ in range(4)], make_slot=new_slot,
                      call_timeout_s=600)
    pool.submit(7, payload, seed, version=3, weights=state)   # weights: only when the version changes
    result, info = pool.collect(7)

A *slot* is anything with `submit(rid, payload, seed, version, weights)`, `collect(rid, timeout_s)`
and `close()`: an `InProcessWorker`, a `ProcessWorker` (wrapped in `ProcessSlot`), a Ray actor
(`honing.schedule.ray_workers.RaySlot`) or a simulated worker. Each slot runs one request at a time;
requests wait in the pool until a slot is free. A background thread ("the pump") harvests finished
requests, dispatches waiting ones and watches the slots, so slots keep working while the caller trains.

Weights. `submit` snapshots the weights it is given (`snapshot`: a clone by default, `ray.put` for
Ray) and keeps them per version while a waiting or running request needs that version (and always the
latest). A slot gets a version's weights once: the first time it runs a request of that version.

Faults. Every slot call is bounded: `collect` is polled with a zero timeout, and a request running
longer than `call_timeout_s` marks its slot hung. A slot that raises `SlotDied` (or hangs) is closed and
dropped, its request goes back to the front of the queue for another slot, and `make_slot` (if given)
starts a replacement. A request that was lost `max_attempts` times in a row fails its batch with a
`HoningError` instead of looping. A request whose slot reports an ordinary error (the rollout itself
raised) fails its batch at once: running it elsewhere would fail the same way. Results are keyed by
a fresh request id per attempt: a late answer from an abandoned attempt, or for a batch already
collected, is dropped (counted in `stats["duplicates_dropped"]`), so a batch's result is returned
exactly once.

Elastic. `resize(n)`, `add_slot()` and `remove_slot()` change the pool mid-run; a removed slot
finishes its running request (or, with `hand_back=True`, is closed and its request goes back to the
queue). `attach(run_dir)` makes the pump follow `run_dir/workers.json` (`{"rollout": N}`, written by
`honing workers RUN_DIR --rollout N`) and append its events to `run_dir/workers.log` (JSON lines).

Splitting. With `split` (`honing.schedule.split.RolloutSplit`) one batch becomes several requests (chunks of its tasks,
each with a seed derived from the batch's), spread over slots and merged back in order: the result
depends on the chunk size, never on how many slots there are or which ran what.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from honing.errors import HoningError
from honing.schedule.split import RolloutSplit, part_seed
from honing.schedule.workers import WorkerTimeout

__all__ = ["ProcessSlot", "RolloutSplit", "Slot", "SlotDied", "WorkerPool", "clone_state", "part_seed",
           "request_size"]

CONTROL_FILE = "workers.json"
LOG_FILE = "workers.log"
_CONTROL_POLL_S = 1.0


class SlotDied(HoningError):
    """The slot is gone (its process or actor died); its work goes to another slot."""


class Slot(Protocol):
    def submit(self, batch_id: int, payload: Any, seed: int, version: int, weights: Any) -> None: ...
    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]: ...
    def close(self) -> None: ...


def clone_state(weights: Any) -> Any:
    """The default weight snapshot: the caller keeps training on its tensors after `submit`."""
    return {k: v.detach().clone() for k, v in weights.items()}


class ProcessSlot:
    """A `ProcessWorker` as a slot: its death is `SlotDied` (an error inside its rollout is not)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def _died(self, e: HoningError) -> None:
        if self.worker._dead():
            raise SlotDied(str(e)) from e

    def submit(self, batch_id: int, payload: Any, seed: int, version: int, weights: Any) -> None:
        try:
            self.worker.submit(batch_id, payload, seed, version, weights)
        except HoningError as e:
            self._died(e)
            raise

    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]:
        try:
            return self.worker.collect(batch_id, timeout_s)
        except WorkerTimeout:
            raise
        except HoningError as e:
            self._died(e)
            raise

    def close(self) -> None:
        self.worker.close()


def request_size(run_dir: Path, rollout: int) -> Path:
    """`honing workers RUN_DIR --rollout N`: ask the run's pool for `rollout` workers (atomically
    written `workers.json`; the pool checks it about once a second, a resumed run starts with it)."""
    import yaml

    from honing.schedule.runlog import atomic_write_text

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise HoningError(f"{run_dir}: no config.yaml there (is it a run directory?)")
    if rollout < 1:
        raise HoningError(f"--rollout {rollout}: a run needs at least 1 rollout worker")
    mode = ((yaml.safe_load(cfg_path.read_text()) or {}).get("schedule") or {}).get("workers", "auto")
    if mode != "ray":
        raise HoningError(f"{run_dir} runs its rollouts with schedule.workers={mode}; only schedule.workers=ray "
                          "pools can be resized")
    path = run_dir / CONTROL_FILE
    atomic_write_text(path, json.dumps({"rollout": rollout, "requested_at": time.time()}) + "\n")
    return path


# ----------------------------------------------------------------------------------------------
# The pool


@dataclass
class _Req:
    """One request of a batch (the whole batch, or one chunk of it)."""

    batch_id: int
    part: int
    payload: Any
    seed: int
    version: int
    rid: int = -1          # the id the slot sees; fresh for every attempt
    attempts: int = 0
    started: float = 0.0


@dataclass
class _Batch:
    version: int
    payloads: list[Any]
    results: list[Any]
    infos: list[dict]
    left: int
    error: str | None = None


@dataclass(eq=False)
class _SlotState:
    sid: int
    slot: Any
    version: int | None = None
    busy: _Req | None = None
    last_used: float = 0.0
    served: int = 0
    draining: bool = False


class WorkerPool:
    """See the module docstring. `slots`: the starting slots; `make_slot()`: a new slot (for
    replacements and `resize`); `log`: called with every event dict (also kept in `events`)."""

    def __init__(self, slots: Sequence[Any] = (), make_slot: Callable[[], Any] | None = None, *,
                 call_timeout_s: float = 600.0, max_attempts: int = 3, split: RolloutSplit | None = None,
                 snapshot: Callable[[Any], Any] = clone_state, poll_s: float = 0.01,
                 log: Callable[[dict], None] | None = None) -> None:
        if call_timeout_s <= 0:
            raise HoningError(f"call_timeout_s must be > 0, got {call_timeout_s}")
        self.make_slot, self.call_timeout_s, self.max_attempts = make_slot, call_timeout_s, max_attempts
        self.split, self.snapshot, self.poll_s, self._log_fn = split, snapshot, poll_s, log
        self._cond = threading.Condition()
        self._slots: dict[int, _SlotState] = {}
        self._next_sid = 0
        self._next_rid = 0
        self._queue: deque[_Req] = deque()
        self._running: dict[int, _Req] = {}          # rid -> request (the live attempt only)
        self._batches: dict[int, _Batch] = {}        # submitted, not yet collected
        self._order: list[int] = []
        self._weights: dict[int, Any] = {}
        self._latest: int | None = None
        self._closed = False
        self._fatal: str | None = None
        self._run_dir: Path | None = None
        self._control_mtime: float | None = None
        self._control_checked = 0.0
        self.events: list[dict] = []
        self.stats: dict[str, int] = defaultdict(int)
        self.served_by: dict[int, int] = defaultdict(int)  # requests finished per slot id (retired ones too)
        for s in slots:
            self._add(s)
        self.target = len(self._slots)
        self._thread = threading.Thread(target=self._pump_forever, name="worker-pool", daemon=True)
        self._thread.start()

    # --- the worker interface ---------------------------------------------------------------------

    def submit(self, batch_id: int, payload: Any, seed: int, version: int, weights: Any) -> None:
        parts = self.split.split(payload, seed) if self.split else [(payload, seed)]
        snap = self.snapshot(weights) if weights is not None else None
        with self._cond:
            if self._closed:
                raise HoningError("the rollout worker pool is closed")
            if batch_id in self._batches:
                raise HoningError(f"batch {batch_id} was already submitted and not yet collected")
            if snap is not None:
                self._weights[version] = snap
                self._latest = version if self._latest is None else max(self._latest, version)
            self._batches[batch_id] = _Batch(version, [p for p, _ in parts], [None] * len(parts),
                                             [{} for _ in parts], len(parts))
            self._order.append(batch_id)
            self._queue.extend(_Req(batch_id, i, p, s, version) for i, (p, s) in enumerate(parts))
            self._cond.notify_all()

    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]:
        t0 = time.monotonic()
        with self._cond:
            if batch_id not in self._batches:
                raise HoningError(f"batch {batch_id} was not submitted or was already collected")
            b = self._batches[batch_id]
            while b.left and b.error is None and self._fatal is None:
                left = None if timeout_s is None else t0 + timeout_s - time.monotonic()
                if left is not None and left <= 0:
                    raise WorkerTimeout(f"batch {batch_id} from the rollout workers was not ready "
                                        f"within {timeout_s:g} s")
                self._cond.wait(0.1 if left is None else min(0.1, left))
            if self._fatal is not None:
                raise HoningError(f"the rollout worker pool stopped:\n{self._fatal}")
            del self._batches[batch_id]
            self._order.remove(batch_id)
            self._drop_unused_weights()
        if b.error is not None:
            raise HoningError(f"rollout worker failed on batch {batch_id}:\n{b.error}")
        result = self.split.merge(b.payloads, b.results) if self.split else b.results[0]
        info: dict[str, float] = defaultdict(float)
        for i in b.infos:
            for k, v in i.items():
                if k != "version" and isinstance(v, (int, float)):
                    info[k] += v
        return result, {**info, "version": b.version, "transfer_s": time.monotonic() - t0}

    def pending(self) -> list[int]:
        with self._cond:
            return list(self._order)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._event("close", None, served=dict(self.served_by), **{k: v for k, v in self.stats.items()
                                                                        if k in ("resubmitted", "duplicates_dropped")})
            slots = list(self._slots.values())
            self._slots.clear()
            self._cond.notify_all()
        self._thread.join(5.0)
        for s in slots:
            self._close_slot(s)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- elastic ----------------------------------------------------------------------------------

    def add_slot(self, slot: Any = None) -> int:
        """Add `slot` (or a new one from `make_slot`); it gets work from the next dispatch on."""
        slot = slot if slot is not None else self._new_slot()
        with self._cond:
            sid = self._add(slot)
            self.target = len(self._live())
            self._cond.notify_all()
        return sid

    def remove_slot(self, sid: int | None = None, hand_back: bool = False) -> int:
        """Remove slot `sid` (default: the newest). It finishes its running request first, unless
        `hand_back`: then it is closed now and its request goes back to the queue."""
        with self._cond:
            live = self._live()
            if sid is None:
                if not live:
                    raise HoningError("the rollout worker pool has no worker to remove")
                sid = max(live, key=lambda s: (s.busy is None, s.sid)).sid
            if sid not in self._slots:
                raise HoningError(f"no rollout worker {sid} in the pool")
            if len(live) <= 1 and self._slots[sid] in live:
                raise HoningError("a rollout worker pool needs at least 1 worker: cannot remove the last one")
            s = self._slots[sid]
            s.draining = True
            self.target = len(self._live())
            self._event("remove", sid, hand_back=hand_back)
            if hand_back and s.busy is not None:
                self._requeue(s, "handed back")
        if hand_back:
            self._retire(s)
        return sid

    def resize(self, n: int) -> None:
        """Grow (with `make_slot`) or shrink (idle slots first) to `n` slots."""
        if n < 1:
            raise HoningError(f"a rollout worker pool needs at least 1 worker, got {n}")
        while len(self._live()) < n:
            self.add_slot()
        while len(self._live()) > n:
            self.remove_slot()
        self.target = n

    def size(self) -> int:
        return len(self._live())

    def slots(self) -> list[Any]:
        with self._cond:
            return [s.slot for s in self._slots.values()]

    def served(self) -> dict[int, int]:
        """Requests finished per slot id (every slot the pool has had)."""
        with self._cond:
            return dict(self.served_by)

    def attach(self, run_dir: Path) -> None:
        """Follow `run_dir/workers.json` and log events to `run_dir/workers.log` (see the module docstring).
        An existing request file sets the size now (a resumed run keeps the size it was given)."""
        with self._cond:
            self._run_dir = Path(run_dir)
            self._write_log(self.events)  # what happened before (the starting slots)
        self._check_control(force=True)

    # --- internals (the pump thread; `_cond` held unless said otherwise) --------------------------

    def _live(self) -> list[_SlotState]:
        return [s for s in self._slots.values() if not s.draining]

    def _add(self, slot: Any) -> int:
        sid, self._next_sid = self._next_sid, self._next_sid + 1
        self._slots[sid] = _SlotState(sid, slot)
        self._event("add", sid)
        return sid

    def _new_slot(self) -> Any:
        if self.make_slot is None:
            raise HoningError("this rollout worker pool cannot start workers (no make_slot)")
        return self.make_slot()

    def _event(self, kind: str, sid: int | None = None, **kw: Any) -> None:
        e = {"t": round(time.time(), 3), "event": kind, **({"slot": sid} if sid is not None else {}), **kw}
        self.events.append(e)
        self.stats[kind] += 1
        if self._log_fn is not None:
            self._log_fn(e)
        self._write_log([e])

    def _write_log(self, events: list[dict]) -> None:
        if self._run_dir is not None and events:
            try:
                with open(self._run_dir / LOG_FILE, "a") as f:
                    f.write("".join(json.dumps(e) + "\n" for e in events))
            except OSError:
                pass

    def _requeue(self, s: _SlotState, why: str) -> None:
        r, s.busy = s.busy, None
        self._running.pop(r.rid, None)
        if r.batch_id not in self._batches:
            return
        if r.attempts >= self.max_attempts:
            self._fail(r.batch_id, f"its request was lost on {r.attempts} workers in a row (last: {why})")
            return
        self.stats["resubmitted"] += 1
        self._queue.appendleft(r)

    def _fail(self, batch_id: int, msg: str) -> None:
        b = self._batches.get(batch_id)
        if b is not None and b.error is None:
            b.error = msg
            self._queue = deque(r for r in self._queue if r.batch_id != batch_id)

    def _close_slot(self, s: _SlotState) -> None:
        """Outside `_cond`: closing a process or actor can take seconds."""
        try:
            s.slot.close()
        except Exception:  # noqa: BLE001 - a slot that is already gone
            pass

    def _retire(self, s: _SlotState) -> None:
        with self._cond:
            self._slots.pop(s.sid, None)
        self._close_slot(s)

    def _harvest(self, s: _SlotState, now: float) -> None:
        r = s.busy
        try:
            result, info = s.slot.collect(r.rid, 0)
        except WorkerTimeout:
            if now - r.started > self.call_timeout_s:
                self._lose(s, f"no answer within call_timeout_s={self.call_timeout_s:g}", "hung")
            return
        except SlotDied as e:
            self._lose(s, str(e).splitlines()[0] if str(e) else "died", "died")
            return
        except Exception:  # noqa: BLE001 - the rollout itself failed: the batch fails (see the docstring)
            s.busy = None
            self._running.pop(r.rid, None)
            self._fail(r.batch_id, traceback.format_exc())
            return
        s.busy, s.last_used, s.served = None, now, s.served + 1
        self.served_by[s.sid] += 1
        self._running.pop(r.rid, None)
        b = self._batches.get(r.batch_id)
        if b is None or b.results[r.part] is not None:
            self.stats["duplicates_dropped"] += 1
            return
        b.results[r.part], b.infos[r.part] = result, dict(info)
        b.left -= 1

    def _lose(self, s: _SlotState, why: str, kind: str) -> None:
        self._event(kind, s.sid, batch=s.busy.batch_id if s.busy else None, why=why)
        if s.busy is not None:
            self._requeue(s, why)
        s.draining = True  # retired (closed) by the pump; a replacement keeps the pool at `target`

    def _dispatch(self, now: float) -> None:
        """Waiting requests, oldest first, to idle slots: one that holds the request's version if any
        (no weight push), else the least recently used (so a new slot gets work at once)."""
        idle = deque(sorted((s for s in self._live() if s.busy is None), key=lambda s: (s.last_used, s.sid)))
        by_version: dict[int | None, deque[_SlotState]] = defaultdict(deque)
        for s in idle:
            by_version[s.version].append(s)
        taken: set[int] = set()

        def first(d: deque[_SlotState]) -> _SlotState | None:
            while d and d[0].sid in taken:
                d.popleft()
            return d.popleft() if d else None

        while self._queue:
            r = self._queue[0]
            s = first(by_version[r.version]) or first(idle)
            if s is None:
                break
            taken.add(s.sid)
            weights = None
            if s.version != r.version:
                weights = self._weights.get(r.version)
                if weights is None:
                    self._fail(r.batch_id, f"no weights of policy version {r.version} to send to a new worker")
                    taken.discard(s.sid)
                    idle.appendleft(s)
                    continue
            self._queue.popleft()
            r.rid, self._next_rid = self._next_rid, self._next_rid + 1
            r.attempts += 1
            r.started = now
            s.busy, s.last_used = r, now
            self._running[r.rid] = r
            try:
                s.version = None
                s.slot.submit(r.rid, r.payload, r.seed, r.version, weights)
                s.version = r.version
            except SlotDied as e:
                self._lose(s, str(e).splitlines()[0] if str(e) else "died", "died")
            except Exception:  # noqa: BLE001 - e.g. an unpicklable payload: the batch fails
                s.busy = None
                self._running.pop(r.rid, None)
                self._fail(r.batch_id, traceback.format_exc())

    def _drop_unused_weights(self) -> None:
        need = {r.version for r in self._queue} | {r.version for r in self._running.values()}
        for v in [v for v in self._weights if v not in need and v != self._latest]:
            del self._weights[v]

    def _check_control(self, force: bool = False) -> None:
        """Outside `_cond`. Apply a new `workers.json` request (bad contents are logged, not fatal)."""
        now = time.monotonic()
        if self._run_dir is None or (not force and now - self._control_checked < _CONTROL_POLL_S):
            return
        self._control_checked = now
        path = self._run_dir / CONTROL_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime == self._control_mtime:
            return
        self._control_mtime = mtime
        try:
            n = int(json.loads(path.read_text())["rollout"])
            with self._cond:
                self._event("resize", None, to=n, before=len(self._live()))
            self.resize(n)
        except Exception as e:  # noqa: BLE001 - a bad request must not stop the run
            with self._cond:
                self._event("bad_request", None, why=f"{path}: {type(e).__name__}: {e}")

    def _pump(self) -> list[_SlotState]:
        """One round: harvest, retire, dispatch. Returns slots to close (outside the lock)."""
        now = time.monotonic()
        for s in list(self._slots.values()):
            if s.busy is not None:
                self._harvest(s, now)
        done = [s for s in self._slots.values() if s.draining and s.busy is None]
        for s in done:
            del self._slots[s.sid]
        self._dispatch(now)
        if (self._queue or self._running) and not self._live() and self.make_slot is None:
            for bid in list(self._batches):
                self._fail(bid, "no rollout workers are left in the pool")
        return done

    def _pump_forever(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    retire = self._pump()
                    missing = max(0, self.target - len(self._live())) if self.make_slot else 0
                    self._cond.notify_all()
                for s in retire:
                    self._close_slot(s)
                for _ in range(missing):  # replacements for dead or hung slots
                    slot = self._new_slot()
                    with self._cond:
                        self._add(slot)
                self._check_control()
                with self._cond:
                    if not self._closed:
                        self._cond.wait(self.poll_s)
        except BaseException:  # noqa: BLE001 - reported by collect
            with self._cond:
                self._fatal = traceback.format_exc()
                self._cond.notify_all()
