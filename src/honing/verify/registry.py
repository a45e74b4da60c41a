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
    """Wraps a reward function (the TRL/verifiers style): `fn(prompt, completion, **fields) -> float`.

    A function with a `completion` parameter gets every field it names, by name: `prompt`,
    `completion`, `answer` (hidden['answer']), `task_id`, `domain`, `task`, `trajectory` and any
    other hidden field of the task (user verifiers are trusted grader code); with `**kwargs` it
    gets them all. Otherwise it is called as `fn(prompt, completion, **fields)`. It must return a number in
    [0, 1] (a bool counts); anything else is an infrastructure error naming the verifier, never a
    silently clipped reward."""

    def __init__(self, fn: Callable[..., Any], name: str = "") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        params = list(inspect.signature(fn).parameters.values())
        self.takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
        self.named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self.by_name = "completion" in self.named  # else the old positional (prompt, completion) contract

    def _fields(self, task: Any, trajectory: Trajectory) -> dict[str, Any]:
        fields = {k: v for k, v in task.hidden.items() if isinstance(k, str)}
        fields.update(answer=task.hidden.get("answer"), task_id=task.id, domain=task.domain, task=task,
                      trajectory=trajectory, prompt=task.question, completion=trajectory.completion_text)
        return fields

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        fields = self._fields(task, trajectory)
        if self.by_name:
            kwargs = fields if self.takes_kwargs else {k: v for k, v in fields.items() if k in self.named}
            raw = self.fn(**kwargs)
        else:
            rest = {k: v for k, v in fields.items() if k not in ("prompt", "completion")}
            raw = self.fn(task.question, trajectory.completion_text,
                          **(rest if self.takes_kwargs else {k: v for k, v in rest.items() if k in self.named}))
        problem = check_score(raw)
        if problem:
            return Verdict.infra(f"verifier '{self.name}' {problem}", time.perf_counter() - t0)
        score = float(raw)
        return Verdict(score=score, passed=score >= 1.0, components={"correct": score},
                       details=f"{self.name} -> {score:g}", cost_s=time.perf_counter() - t0)


def check_score(raw: Any) -> str:
    """'' when `raw` is a reward in [0, 1]; otherwise what is wrong with it."""
    if isinstance(raw, bool):
        return ""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return f"returned {type(raw).__name__} {str(raw)[:60]!r}: a reward must be a number in [0, 1]"
    if not (0.0 <= value <= 1.0):  # also NaN
        return f"returned {value!r}: a reward must be in [0, 1]"
    return ""


def as_verifier(obj: Any, name: str) -> Verifier:
    """A Verifier from what a user hands over: an object with `.verify`, a class of one, or a function."""
    inst = obj() if isinstance(obj, type) else obj
    if hasattr(inst, "verify"):
        return inst
    if callable(inst):
        return FunctionVerifier(inst, name)
    raise TaskError(f"verifier '{name}' is a {type(obj).__name__}: expected a function, a Verifier or a Verifier class")


def register_verifier(name: str, verifier: Verifier | Callable[..., float] | None = None) -> Any:
    """Register an object with `.verify` or a plain reward function; usable as a decorator."""

    def add(v: Any) -> Any:
        _REGISTRY[name] = as_verifier(v, name)  # a decorated class is instantiated once
        return v

    return add(verifier) if verifier is not None else add


def get_verifier(name: str) -> Verifier:
    """A registered verifier, or user code by reference (`pkg.mod:fn`, `./file.py:fn`) or by an
    installed package's `honing.verifiers` entry point; resolved once, then registered."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    from honing import plugins

    if name.startswith("env:"):
        from honing.envpkg import load_environment

        load_environment(name[len("env:"):])  # registers the package's verifier under this name
        return _REGISTRY[name]
    if plugins.is_reference(name):
        try:
            _REGISTRY[name] = as_verifier(plugins.resolve(name, plugins.base()), name)
        except plugins.ModuleMissing as e:
            raise TaskError(f"unknown verifier '{name}'; as a reference: {e}") from None
        return _REGISTRY[name]
    found = plugins.load_entry_point("verifier", name)
    if found is not None:
        _REGISTRY[name] = as_verifier(found, name)
        return _REGISTRY[name]
    close = difflib.get_close_matches(name, list(_REGISTRY) + plugins.entry_point_names("verifier"), n=3, cutoff=0.5)
    raise TaskError(f"unknown verifier '{name}'" + (f"; closest: {', '.join(close)}" if close
                                                  else f"; known: {', '.join(sorted(_REGISTRY))}")
                    + " (or name one as 'package.module:function' or './file.py:function')")


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
