"""Rollout workers as Ray actors (`schedule.workers: ray`), behind the worker-pool interface.

Each `RolloutActor` builds its own `LocalRollout` from the run's config (`rollout_side.build`: its own
policy copy, task setup, verifiers and sandbox, so grading runs through the same sandbox code as in
process) and answers `load_weights(state, version)` and `run(payload, seed)`, one call at a time in
submission order. `RaySlot` wraps one actor as a slot of `honing.schedule.pool.WorkerPool`: weights
go into Ray's object store once per policy version (`ray.put`, the pool's snapshot) and every actor
that needs that version reads them from there. The pool does the rest: timeouts, dead or hung actors
replaced and their requests resubmitted, elastic resizing (`honing workers RUN_DIR --rollout N`).

This is the only module that imports Ray: tasks/, verify/, rollout/ and train/ run the same code in
process. Cluster: `schedule.ray.address` None starts a local one (`ray.init(num_cpus=local_cpus)`,
shut down with the pool); an address is checked with a plain TCP connect (and `ray.init` is given
`connect_timeout_s`) so an unreachable cluster is one `HoningError`, never a hang.

Not covered: actors on other machines need honing (and the task/verifier code) installed there and
the same paths for task files; the trainer stays in the driver process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from honing.config import RunConfig
from honing.errors import HoningError
from honing.schedule.pool import RolloutSplit, SlotDied, WorkerPool
from honing.schedule.workers import WorkerTimeout

try:
    import ray
    from ray import exceptions as rex
except ImportError:  # pragma: no cover - the message is the point
    ray = None  # type: ignore[assignment]

_DEATH = () if ray is None else (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError,
                                 rex.OwnerDiedError, rex.NodeDiedError, rex.LocalRayletDiedError)


def _need_ray() -> Any:
    if ray is None:
        raise HoningError("schedule.workers=ray needs Ray: pip install 'honing[ray]' (or pip install ray)")
    return ray


class GradingActor:
    """A grading worker (`schedule.ray.grading_workers`): the run's verifiers and its own sandbox,
    no policy. Stateless, so Ray restarts one that dies and retries the call on it."""

    def __init__(self, cfg_dict: dict) -> None:
        from honing.schedule.rollout_side import worker_config
        from honing.schedule.setup import build_tasks

        self.error, self.calls, self.setup = "", 0, None
        try:
            self.setup = build_tasks(worker_config(cfg_dict))
        except HoningError as e:
            self.error = f"Ray grading actor on {socket.gethostname()}: {e}"

    def ready(self) -> int:
        if self.error:
            raise HoningError(self.error)
        return os.getpid()

    def grade(self, task: Any, traj: Any, opts: Any) -> Any:
        from honing.verify.batch import grade_batch

        self.calls += 1
        return grade_batch([task], [traj], self.setup.ctx, self.setup.reward, opts)[0]

    def close(self) -> None:
        if self.setup is not None and self.setup.sandbox is not None:
            self.setup.sandbox.close()


def remote_grader(graders: list[Any], slack_s: float = 30.0) -> Any:
    """The orchestrator's `remote_grade` over grading actors: round robin; a call that fails or runs past
    the sample's grading timeout (+ slack) is an infrastructure-error verdict (the job is retried), and
    a hung actor is killed so that Ray restarts it."""
    import asyncio
    import itertools

    from honing.verify.batch import Graded
    from honing.verify.reward import Reward
    from honing.verify.types import Verdict

    turn = itertools.count()

    async def grade(task: Any, traj: Any, opts: Any) -> Any:
        actor = graders[next(turn) % len(graders)]
        try:
            return await asyncio.wait_for(actor.grade.remote(task, traj, opts), timeout=opts.timeout_s + slack_s)
        except asyncio.TimeoutError:
            ray.kill(actor, no_restart=False)
            why = f"no answer within {opts.timeout_s + slack_s:g} s (the actor is restarted)"
        except rex.RayError as e:
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return Graded(Verdict.infra(f"grading actor: {why}"), Reward(0.0, {}), {})

    return grade


class RolloutActor:
    """The remote side (made a Ray actor by `ray.remote` in `make_ray_pool`)."""

    def __init__(self, cfg_dict: dict, threads: int, graders: list[Any] | None = None) -> None:
        import torch

        from honing.schedule.rollout_side import build

        torch.set_num_threads(threads)
        self.error = ""
        try:
            self.side = build(cfg_dict, remote_grader(graders) if graders else None)
        except HoningError as e:  # reported by ready(): an __init__ error would only say the actor died
            self.error = f"Ray rollout actor on {socket.gethostname()}: {e}"

    def ready(self) -> int:
        """The actor's pid once it is built; else its build error, e.g. a worker image without
        bubblewrap when the run grades in boxes (one clear error, not a run of infra errors)."""
        if self.error:
            raise HoningError(self.error)
        return os.getpid()

    def load_weights(self, state: Any, version: int) -> float:
        t0 = time.perf_counter()
        self.side.load_weights(state, version)
        return time.perf_counter() - t0

    def run(self, payload: Any, seed: int) -> tuple[Any, dict[str, float]]:
        t0 = time.perf_counter()
        result = self.side.run(payload, seed)
        return result, {"worker/busy_s": time.perf_counter() - t0, "worker/pid": float(os.getpid())}

    def close(self) -> None:
        self.side.close()


class RaySlot:
    """One rollout actor as a pool slot. `pid` is the actor's process id once it has started."""

    def __init__(self, actor_cls: Any, cfg_dict: dict, threads: int, num_cpus: float,
                 env: dict[str, str] | None = None, graders: list[Any] | None = None) -> None:
        opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "max_task_retries": 0}
        if env:
            opts["runtime_env"] = {"env_vars": dict(env)}
        self.actor = actor_cls.options(**opts).remote(cfg_dict, threads, graders)
        self.started = self.actor.ready.remote()
        self.pid: int | None = None
        self._refs: dict[int, tuple[Any, Any]] = {}

    def wait_ready(self, timeout_s: float) -> int:
        try:
            self.pid = ray.get(self.started, timeout=timeout_s)
        except rex.GetTimeoutError:
            raise HoningError(f"a Ray rollout actor did not start within {timeout_s:g} s (schedule.ray.call_timeout_s; "
                              f"free in the cluster now: {ray.available_resources()})") from None
        except rex.RayError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, HoningError):  # the actor's own clear message (e.g. no bwrap there)
                raise HoningError(str(cause)) from None
            raise HoningError(f"a Ray rollout actor failed to start:\n{e}") from None
        return self.pid

    def submit(self, batch_id: int, payload: Any, seed: int, version: int, weights: Any) -> None:
        load = self.actor.load_weights.remote(weights, version) if weights is not None else None
        self._refs[batch_id] = (load, self.actor.run.remote(payload, seed))

    def collect(self, batch_id: int, timeout_s: float | None = None) -> tuple[Any, dict[str, float]]:
        load, run = self._refs[batch_id]
        done, _ = ray.wait([run], timeout=timeout_s)
        if not done:
            raise WorkerTimeout(f"batch {batch_id} from a Ray rollout actor was not ready within {timeout_s} s")
        del self._refs[batch_id]
        try:
            load_s = ray.get(load) if load is not None else 0.0
            result, info = ray.get(run)
        except _DEATH as e:
            raise SlotDied(f"the Ray rollout actor (pid {self.pid}) died: {type(e).__name__}: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
        return result, {**info, "worker/load_weights_s": load_s}

    def close(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


class RayPool(WorkerPool):
    """A `WorkerPool` of `RaySlot`s that checks free CPUs before it grows and shuts down the local
    cluster it started."""

    def __init__(self, *args: Any, num_cpus: float, owns_cluster: bool, graders: list[Any] = (), **kw: Any) -> None:
        self.num_cpus, self.owns_cluster, self.graders = num_cpus, owns_cluster, list(graders)
        super().__init__(*args, **kw)

    def resize(self, n: int) -> None:
        more = n - self.size()
        free = ray.available_resources().get("CPU", 0.0)
        if more > 0 and more * self.num_cpus > free + 1e-9:
            raise HoningError(f"{more} more rollout actor(s) x {self.num_cpus:g} CPUs need {more * self.num_cpus:g} "
                              f"CPUs; the Ray cluster has {free:g} free")
        super().resize(n)

    def close(self) -> None:
        super().close()
        for g in self.graders:
            try:
                ray.kill(g, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.owns_cluster and ray.is_initialized():
            ray.shutdown()


def _host_port(address: str) -> tuple[str, int]:
    a = address.removeprefix("ray://")
    host, sep, port = a.rpartition(":")
    if not sep:
        return a, 10001 if address.startswith("ray://") else 6379
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise HoningError(f"schedule.ray.address={address!r}: expected 'host:port', 'ray://host:port' or 'auto'") from None


def connect(rc: Any) -> bool:
    """Join (or start) the Ray cluster; True if this call started it (then the pool shuts it down)."""
    _need_ray()
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
    if rc.address is None:
        ray.init(num_cpus=rc.local_cpus or os.cpu_count() or 1, **quiet)
        return True
    where = rc.address
    if where != "auto":
        host, port = _host_port(where)
        try:
            socket.create_connection((host, port), timeout=rc.connect_timeout_s).close()
        except OSError as e:
            raise HoningError(f"schedule.ray.address={where!r}: no Ray cluster answers at {host}:{port} "
                              f"({type(e).__name__}: {e}; waited at most {rc.connect_timeout_s:g} s)") from None
    box: dict[str, Any] = {}

    def join() -> None:
        try:
            ray.init(address=where, **quiet)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=join, daemon=True, name="ray-connect")
    t.start()
    t.join(rc.connect_timeout_s + 5.0)
    if t.is_alive():
        raise HoningError(f"schedule.ray.address={where!r}: joining the Ray cluster took longer than "
                          f"{rc.connect_timeout_s + 5:g} s")
    if "error" in box:
        e = box["error"]
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise HoningError(f"schedule.ray.address={where!r}: cannot join the Ray cluster: {type(e).__name__}: {first}")
    return False


def start_graders(rc: Any, cfg_dict: dict) -> list[Any]:
    """`schedule.ray.grading_workers` grading actors (fractional CPUs), each ready; [] when none."""
    if not rc.grading_workers:
        return []
    opts: dict[str, Any] = {"num_cpus": rc.grading_num_cpus, "max_restarts": -1, "max_task_retries": 2}
    if rc.env:
        opts["runtime_env"] = {"env_vars": dict(rc.env)}
    cls = ray.remote(GradingActor)
    graders = [cls.options(**opts).remote(cfg_dict) for _ in range(rc.grading_workers)]
    try:
        for g in graders:
            try:
                ray.get(g.ready.remote(), timeout=rc.call_timeout_s)
            except rex.GetTimeoutError:
                raise HoningError(f"a Ray grading actor did not start within {rc.call_timeout_s:g} s") from None
            except rex.RayError as e:
                cause = getattr(e, "cause", None)
                raise HoningError(str(cause) if isinstance(cause, HoningError)
                                  else f"a Ray grading actor failed to start: {e}") from None
    except BaseException:
        for g in graders:
            ray.kill(g, no_restart=True)
        raise
    return graders


def make_ray_pool(cfg: RunConfig) -> RayPool:
    """The rollout pool of a run with `schedule.workers: ray` (started, every actor ready)."""
    rc = cfg.schedule.ray
    owns = connect(rc)
    try:
        total = ray.cluster_resources().get("CPU", 0.0)
        need = rc.rollout_workers * rc.num_cpus + rc.grading_workers * rc.grading_num_cpus
        if need > total + 1e-9:
            raise HoningError(f"schedule.ray: {rc.rollout_workers} rollout workers x {rc.num_cpus:g} CPUs and "
                              f"{rc.grading_workers} grading workers x {rc.grading_num_cpus:g} CPUs need {need:g} "
                              f"CPUs; the Ray cluster has {total:g}")
        cfg_dict = cfg.model_dump(mode="json")
        threads = cfg.schedule.worker_threads or max(1, int(rc.num_cpus))
        actor_cls = ray.remote(RolloutActor)
        graders = start_graders(rc, cfg_dict)

        def make_slot() -> RaySlot:
            return RaySlot(actor_cls, cfg_dict, threads, rc.num_cpus, rc.env, graders)

        slots = [make_slot() for _ in range(rc.rollout_workers)]
        try:
            for s in slots:
                s.wait_ready(rc.call_timeout_s)
        except BaseException:
            for s in slots:
                s.close()
            raise
        return RayPool(slots, make_slot, call_timeout_s=rc.call_timeout_s, snapshot=ray.put,
                       split=RolloutSplit(rc.tasks_per_request) if rc.tasks_per_request else None,
                       num_cpus=rc.num_cpus, owns_cluster=owns, graders=graders)
    except BaseException:
        if owns:
            ray.shutdown()
        raise
