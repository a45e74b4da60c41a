"""Grade many trajectories concurrently, bounded, with the layered reward applied.

Each item is graded by its task's verifier (`averify` if it has one, else `verify` on a worker
thread) and by any extra verifiers its reward layers name, all under one concurrency bound and
a per-call timeout. Nothing one item does can fail the batch: a crash, a timeout or an unknown
verifier is that item's infrastructure error; bad completions (not UTF-8, over the size cap)
score 0 with the reason in `details`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Sequence

from honing.errors import TaskError
from honing.rollout.types import Trajectory
from honing.verify.registry import get_verifier, grade
from honing.verify.reward import Reward, RewardConfig, compose, extra_verifiers
from honing.verify.types import Verdict, VerifyContext

DEFAULT_MAX_COMPLETION_BYTES = 1 << 20


@dataclass(frozen=True)
class BatchOptions:
    concurrency: int = 16
    timeout_s: float = 120.0
    max_completion_bytes: int = DEFAULT_MAX_COMPLETION_BYTES
    max_new_tokens: int = 1 << 30  # default length for the overlong penalty


@dataclass(frozen=True)
class Graded:
    verdict: Verdict  # the task's own verifier
    reward: Reward
    layer_verdicts: dict[str, Verdict]


def _reject(reason: str) -> Verdict:
    return Verdict(0.0, False, {"correct": 0.0, "format": 0.0}, reason)


def as_trajectory(task: Any, completion: Trajectory | str | bytes, max_bytes: int) -> Trajectory | Verdict:
    """A trajectory to grade, or the 0-verdict that explains why the completion cannot be graded."""
    if isinstance(completion, Trajectory):
        text = completion.completion_text
        if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            return _reject(f"completion is {len(text.encode('utf-8', 'surrogatepass'))} bytes, over the "
                           f"{max_bytes}-byte cap")
        return completion
    if isinstance(completion, (bytes, bytearray)):
        if len(completion) > max_bytes:
            return _reject(f"completion is {len(completion)} bytes, over the {max_bytes}-byte cap")
        try:
            completion = bytes(completion).decode("utf-8")
        except UnicodeDecodeError as e:
            return _reject(f"completion is not valid UTF-8 (byte {e.start}: {e.reason})")
    return as_trajectory(task, Trajectory.from_text(task.id, task.domain, completion), max_bytes)


def _graded_inline(task: Any, completion: Any, ctx: VerifyContext, reward: RewardConfig,
                   opts: BatchOptions) -> Graded:
    traj = as_trajectory(task, completion, opts.max_completion_bytes)
    if isinstance(traj, Verdict):
        return Graded(traj, Reward(0.0, {}), {})
    own = grade(task, traj, ctx)
    if own.infra_error:
        return Graded(own, Reward(0.0, {}), {})
    return Graded(own, _compose(reward, task, traj, own, {}, opts), {})


def _compose(reward: RewardConfig, task: Any, traj: Trajectory, own: Verdict, by_layer: dict[str, Verdict],
             opts: BatchOptions) -> Reward:
    n_turns = len(getattr(traj, "turns", None) or ()) or 1
    return compose(reward, task.domain, {None: own, **by_layer}, n_tokens=len(traj.completion_ids),
                   n_turns=n_turns, truncated=traj.finish_reason == "length",
                   default_max_tokens=opts.max_new_tokens)


def _retarget(task: Any, name: str, params: dict[str, Any]) -> Any:
    """The same task graded by another verifier (for a reward layer with its own verifier)."""
    spec = replace(task.verifier, name=name, params={**dict(task.verifier.params), **params})
    return replace(task, verifier=spec)


def _is_cheap(task: Any) -> bool:
    """Verifiers marked `cheap` (pure in-process checks that cannot hang) run inline: a thread
    hop costs more than they do."""
    try:
        return bool(getattr(get_verifier(task.verifier.name), "cheap", False))
    except TaskError:
        return False


async def _one(task: Any, traj: Trajectory, ctx: VerifyContext, pool: ThreadPoolExecutor,
               sem: asyncio.Semaphore, timeout_s: float) -> Verdict:
    if _is_cheap(task):
        return grade(task, traj, ctx)
    async with sem:
        t0 = time.perf_counter()
        try:
            verifier = get_verifier(task.verifier.name)
        except TaskError as e:
            return Verdict.infra(str(e))
        try:
            averify = getattr(verifier, "averify", None)
            if averify is not None and inspect.iscoroutinefunction(averify):
                coro = averify(task, traj, ctx)
            else:
                coro = asyncio.get_running_loop().run_in_executor(pool, grade, task, traj, ctx)
            return await asyncio.wait_for(coro, timeout_s)
        except asyncio.TimeoutError:
            return Verdict.infra(f"{task.verifier.name} timed out after {timeout_s:g}s", time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - a grader crash is infra, by contract
            return Verdict.infra(f"{task.verifier.name} crashed: {type(e).__name__}: {e}", time.perf_counter() - t0)


async def agrade_batch(tasks: Sequence[Any], completions: Sequence[Trajectory | str | bytes], ctx: VerifyContext,
                       reward: RewardConfig | None = None, opts: BatchOptions = BatchOptions()) -> list[Graded]:
    """Grade `completions[i]` against `tasks[i]`, at most `opts.concurrency` at a time."""
    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    reward = reward or RewardConfig()
    sem = asyncio.Semaphore(opts.concurrency)
    pool = ThreadPoolExecutor(opts.concurrency, thread_name_prefix="grade")

    async def item(task: Any, completion: Any) -> Graded:
        traj = as_trajectory(task, completion, opts.max_completion_bytes)
        if isinstance(traj, Verdict):
            return Graded(traj, Reward(0.0, {}), {})
        layers = extra_verifiers(reward, task.domain)
        jobs = [_one(task, traj, ctx, pool, sem, opts.timeout_s)]
        jobs += [_one(_retarget(task, x.verifier, x.params), traj, ctx, pool, sem, opts.timeout_s)  # type: ignore[arg-type]
                 for x in layers]
        own, *extra = await asyncio.gather(*jobs)
        by_layer = {x.name: v for x, v in zip(layers, extra)}
        broken = [v for v in (own, *extra) if v.infra_error]
        if broken:
            infra = own if own.infra_error else Verdict.infra("reward layer: " + broken[0].details, own.cost_s)
            return Graded(infra, Reward(0.0, {}), by_layer)
        return Graded(own, _compose(reward, task, traj, own, by_layer, opts), by_layer)

    try:
        return list(await asyncio.gather(*(item(t, c) for t, c in zip(tasks, completions))))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def grade_batch(tasks: Sequence[Any], completions: Sequence[Trajectory | str | bytes], ctx: VerifyContext,
                reward: RewardConfig | None = None, opts: BatchOptions = BatchOptions()) -> list[Graded]:
    """Synchronous `agrade_batch`; safe to call from inside a running event loop too."""
    reward = reward or RewardConfig()
    if all(_is_cheap(t) and not extra_verifiers(reward, t.domain) for t in tasks) and len(tasks) == len(completions):
        return [_graded_inline(t, c, ctx, reward, opts) for t, c in zip(tasks, completions)]
    coro = agrade_batch(tasks, completions, ctx, reward, opts)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def grade_trajectories(tasks: Sequence[Any], trajs: Sequence[Trajectory], ctx: VerifyContext,
                       reward: RewardConfig | None = None, opts: BatchOptions = BatchOptions()) -> None:
    """Grade trajectories in place (verdict, layered reward, its layers), the one way RL rollouts and SFT
    demonstrations are graded. An episode its sandbox broke is an infrastructure error (reward 0, never
    trained on as a wrong answer), whatever the verifier made of its remains."""
    for t, g in zip(trajs, grade_batch(tasks, trajs, ctx, reward, opts)):
        t.verdict, t.reward, t.reward_layers = g.verdict, g.reward.value, dict(g.reward.layers)
        if t.stop_reason == "infra_error":
            t.verdict, t.reward = Verdict.infra(f"episode stopped by an infrastructure error: {t.verdict.details}"), 0.0
