"""Verifiers by name, so YAML can refer to them. Plain functions are wrapped."""

from __future__ import annotations

import difflib
import inspect
import time
from typing import Any, Callable

from honing.errors import TaskError
from honing.rollout.types import Trajectory
from honing.verify.types import Verdict, Verifier, VerifyContext

_REGISTRY: dict[str, Verifier] = {}


class FunctionVerifier:
    """Wraps `fn(prompt, completion, **task_fields) -> float` (the TRL/verifiers reward style)."""

    def __init__(self, fn: Callable[..., float]) -> None:
        self.fn = fn
        params = inspect.signature(fn).parameters.values()
        self.takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        fields = {"answer": task.hidden.get("answer"), "task_id": task.id, "domain": task.domain}
        score = float(self.fn(task.question, trajectory.completion_text, **(fields if self.takes_kwargs else {})))
        return Verdict(score=min(max(score, 0.0), 1.0), passed=score >= 1.0, components={"correct": min(max(score, 0.0), 1.0), "fn": score})


def register_verifier(name: str, verifier: Verifier | Callable[..., float] | None = None) -> Any:
    """Register an object with `.verify` or a plain reward function; usable as a decorator."""

    def add(v: Any) -> Any:
        obj = v() if isinstance(v, type) else v  # a decorated class is instantiated once
        _REGISTRY[name] = obj if hasattr(obj, "verify") else FunctionVerifier(obj)
        return v

    return add(verifier) if verifier is not None else add


def get_verifier(name: str) -> Verifier:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        raise TaskError(f"unknown verifier '{name}'" + (f"; closest: {', '.join(close)}" if close
                                                      else f"; known: {', '.join(sorted(_REGISTRY))}"))
    return _REGISTRY[name]


def verifier_names() -> list[str]:
    return sorted(_REGISTRY)


def grade(task: Any, trajectory: Trajectory | str, ctx: VerifyContext) -> Verdict:
    """Grade one trajectory (or bare completion text). A crashing verifier is an
    infrastructure error, never a 0."""
    t0 = time.perf_counter()
    if isinstance(trajectory, str):
        trajectory = Trajectory.from_text(task.id, task.domain, trajectory)
    try:
        verdict = get_verifier(task.verifier.name).verify(task, trajectory, ctx)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - any grader crash is infra, by contract
        return Verdict.infra(f"{task.verifier.name} crashed: {type(e).__name__}: {e}", time.perf_counter() - t0)
    return verdict
