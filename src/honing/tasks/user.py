"""Task sources from user code: registered by name, named by reference (`pkg.mod:make_tasks`,
`./my_tasks.py:MySource`) or installed as a package (`honing.sources` entry point, or an
environment package `env:<name>`).

What a name may stand for:
- a TaskSource object (anything with `domain` and `tasks(split, seed)`);
- a TaskSource class or factory, called with the recipe's `params` as keyword arguments;
- a function `fn(split, seed)` (or `fn(split, seed, **params)`) yielding Tasks or task dicts
  (`{"id", "prompt", "answer" | "hidden", "verifier"}`, as in a JSONL task file).

Every task a user source yields is checked as it streams: a malformed one fails naming the
source, the task's position and the field.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

from honing.errors import TaskError
from honing.tasks.types import SPLITS, Task, VerifierSpec, task_from_json

SOURCES: dict[str, Any] = {}


def register_source(name: str, source: Any = None) -> Any:
    """Register a TaskSource (object, class, factory or `fn(split, seed)`) under `name`; a decorator too."""

    def add(obj: Any) -> Any:
        SOURCES[name] = obj
        return obj

    return add(source) if source is not None else add


def _is_source(obj: Any) -> bool:
    return hasattr(obj, "tasks") and hasattr(obj, "domain") and not isinstance(obj, type)


def _task_from_dict(d: Mapping[str, Any], name: str, i: int, default_verifier: str | None) -> Task:
    """A task dict as in a JSONL task file (`answer` is shorthand for hidden['answer']), with the
    source's defaults for id, domain and verifier; read by the same code as `honing verify --task`."""
    where = f"task source '{name}': task #{i}"
    if "prompt" not in d:
        raise TaskError(f"{where}: missing field 'prompt'")
    if d.get("verifier", default_verifier) is None:
        raise TaskError(f"{where}: missing field 'verifier' (or set the source's verifier in the recipe)")
    hidden = dict(d.get("hidden") or {})
    if "answer" in d:
        hidden.setdefault("answer", d["answer"])
    obj = {**d, "id": d.get("id", f"{name}/{i}"), "domain": d.get("domain", name),
           "verifier": d.get("verifier", default_verifier), "hidden": hidden}
    try:
        return task_from_json(obj, where)
    except (TypeError, ValueError) as e:
        raise TaskError(f"{where}: {e}") from None


def check_task(task: Any, name: str, i: int) -> None:
    """Fail naming the field when a user source's task is malformed."""
    where = f"task source '{name}': task #{i}" + (f" ({task.id!r})" if isinstance(getattr(task, "id", None), str) else "")
    if not isinstance(task, Task):
        raise TaskError(f"{where}: expected a honing Task or a dict, got {type(task).__name__}")
    if not isinstance(task.id, str) or not task.id:
        raise TaskError(f"{where}: field 'id' must be a non-empty string, got {task.id!r}")
    if not isinstance(task.domain, str) or not task.domain:
        raise TaskError(f"{where}: field 'domain' must be a non-empty string, got {task.domain!r}")
    if not isinstance(task.prompt, tuple) or not task.prompt:
        raise TaskError(f"{where}: field 'prompt' must be a non-empty sequence of {{role, content}} messages")
    for k, m in enumerate(task.prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str) \
                or m.get("role") not in ("system", "user", "assistant"):
            raise TaskError(f"{where}: field 'prompt[{k}]' must be {{role: system|user|assistant, content: str}}, "
                            f"got {m!r:.80}")
    if not isinstance(task.verifier, VerifierSpec) or not isinstance(task.verifier.name, str) or not task.verifier.name:
        raise TaskError(f"{where}: field 'verifier' must be a VerifierSpec with a name, got {task.verifier!r:.80}")
    if task.difficulty is not None and not isinstance(task.difficulty, (int, float)):
        raise TaskError(f"{where}: field 'difficulty' must be a number or None, got {task.difficulty!r:.40}")
    if task.environment is not None and not isinstance(task.environment, Mapping):
        raise TaskError(f"{where}: field 'environment' must be a mapping or None")


class FunctionSource:
    """A TaskSource over `fn(split, seed, **params)`."""

    def __init__(self, fn: Callable[..., Iterable[Any]], name: str, params: Mapping[str, Any]) -> None:
        self.fn, self.domain, self.params = fn, name, dict(params)

    def tasks(self, split: str, seed: int) -> Iterator[Any]:
        return iter(self.fn(split, seed, **self.params))


class UserSource:
    """A user's TaskSource, its tasks checked as they stream, the recipe's verifier and system
    prompt applied."""

    def __init__(self, inner: Any, name: str, verifier: str | None = None, system_prompt: str | None = None) -> None:
        self.inner, self.name = inner, name
        self.domain = str(getattr(inner, "domain", name))
        self.verifier, self.system_prompt = verifier, system_prompt
        from honing.plugins import is_reference

        mod = name.rpartition(":")[0] if is_reference(name) else ""
        self.base = Path(mod).parent if mod.endswith(".py") and Path(mod).is_absolute() else None

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        if split not in SPLITS:
            raise TaskError(f"task source '{self.name}': unknown split {split!r}")
        for i, t in enumerate(self.inner.tasks(split, seed)):
            if isinstance(t, Mapping):
                t = _task_from_dict(t, self.name, i, self.verifier)
            check_task(t, self.name, i)
            yield self._apply(t)

    def _apply(self, t: Task) -> Task:
        changes: dict[str, Any] = {}
        if self.verifier and t.verifier.name != self.verifier:
            changes["verifier"] = VerifierSpec(self.verifier, dict(t.verifier.params))
        elif self.base is not None:  # './x.py:fn' in a task from a file source: relative to that file
            from honing.plugins import absolute_ref

            name = absolute_ref(t.verifier.name, self.base)
            if name != t.verifier.name:
                changes["verifier"] = VerifierSpec(name, dict(t.verifier.params))
        if self.system_prompt and not any(m.get("role") == "system" for m in t.prompt):
            changes["prompt"] = ({"role": "system", "content": self.system_prompt}, *t.prompt)
        if not changes:
            return t
        from dataclasses import replace

        return replace(t, **changes)


def build_user_source(obj: Any, name: str, params: Mapping[str, Any] | None, verifier: str | None,
                      system_prompt: str | None) -> UserSource:
    """A UserSource from whatever a user registered or referenced (see the module docstring)."""
    params = dict(params or {})
    if _is_source(obj):
        if params:
            raise TaskError(f"task source '{name}' is an object and takes no params (got {sorted(params)})")
        inner = obj
    elif callable(obj):
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            sig = None
        positional = [p for p in (sig.parameters.values() if sig else ())
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        if not isinstance(obj, type) and [p.name for p in positional[:2]] == ["split", "seed"]:
            inner = FunctionSource(obj, name, params)
        else:
            try:
                inner = obj(**params)
            except TypeError as e:
                raise TaskError(f"task source '{name}': bad params {sorted(params)}: {e}") from None
            if not _is_source(inner):
                raise TaskError(f"task source '{name}': the factory returned a {type(inner).__name__}, "
                                "not a TaskSource (an object with `domain` and `tasks(split, seed)`)")
    else:
        raise TaskError(f"task source '{name}' is a {type(obj).__name__}: expected a TaskSource, a class or a function")
    return UserSource(inner, name, verifier, system_prompt)
