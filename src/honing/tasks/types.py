"""The Task type and the TaskSource protocol (DESIGN.md: core types)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Protocol, runtime_checkable

Message = Mapping[str, str]  # {"role": ..., "content": ...}


@dataclass(frozen=True)
class VerifierSpec:
    """Which verifier grades a task, and with what parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One unit of verifiable work.

    `prompt` is what the model sees. `hidden` holds what only the grader may see (reference
    answers, hidden tests): it is never rendered into a prompt or copied into a sandbox where
    the model acts.
    """

    id: str
    domain: str
    prompt: tuple[Message, ...]
    verifier: VerifierSpec
    hidden: Mapping[str, Any] = field(default_factory=dict)
    difficulty: float | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] | None = None  # multi-turn work (files, tools, max_turns)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", MappingProxyType(dict(self.hidden)))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @property
    def question(self) -> str:
        """The text of the last user message (what dedup and contamination checks compare)."""
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else ""


SPLITS = ("train", "heldout")


@runtime_checkable
class TaskSource(Protocol):
    """A lazy stream of tasks. A pool of a million tasks must never be loaded whole."""

    domain: str

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        """Tasks of `split` ('train' or 'heldout') in a deterministic order given `seed`."""
        ...


def source_suffix(index: int) -> str:
    """What a repeated source's task ids carry: '@s<its index in the config or suite>'."""
    return f"@s{index}"


class TaggedSource:
    """A task source whose task ids carry a suffix. One source named twice in a config (finance at level 1
    and again at level 2) yields the same ids from both, and per-task records are keyed by id: held-out
    results, revisits, state. `wrapped` is the source itself (its attributes read through)."""

    def __init__(self, wrapped: Any, suffix: str) -> None:
        self.wrapped = wrapped
        self.suffix = suffix

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        for t in self.wrapped.tasks(split, seed):
            yield replace(t, id=t.id + self.suffix)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def tag_repeated(names: list[str], sources: list[Any]) -> list[Any]:
    """`sources` (built from `names`, in config order) with every source whose name an earlier one already
    had wrapped in a TaggedSource, so no two sources of one run share task ids. The first keeps its ids."""
    seen: set[str] = set()
    out = []
    for i, (name, src) in enumerate(zip(names, sources)):
        out.append(TaggedSource(src, source_suffix(i)) if name in seen else src)
        seen.add(name)
    return out


def task_to_json(task: Task) -> dict[str, Any]:
    """One task as plain JSON (the line format of `honing tasks show --json` and `honing verify --task`).
    Hidden material stays under its own key, so a reader can see what the model never sees."""
    return {
        "id": task.id, "domain": task.domain, "prompt": [dict(m) for m in task.prompt],
        "verifier": {"name": task.verifier.name, "params": dict(task.verifier.params)},
        "hidden": dict(task.hidden), "difficulty": task.difficulty, "tags": list(task.tags),
        "metadata": dict(task.metadata),
        "environment": dict(task.environment) if task.environment is not None else None,
    }


def task_from_json(obj: Any, where: str = "task") -> Task:
    """The inverse of `task_to_json`; errors name the missing or malformed key."""
    from honing.errors import TaskError

    if not isinstance(obj, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("id", "prompt", "verifier"):
        if key not in obj:
            raise TaskError(f"{where}: missing key '{key}'")
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise TaskError(f"{where}: 'prompt' must be a string or a list of {{role, content}} messages")
    ver = obj["verifier"]
    if isinstance(ver, str):
        ver = {"name": ver}
    if not isinstance(ver, dict) or "name" not in ver:
        raise TaskError(f"{where}: 'verifier' must be a name or {{name, params}}")
    return Task(
        id=str(obj["id"]), domain=str(obj.get("domain", "user")), prompt=tuple(prompt),
        verifier=VerifierSpec(str(ver["name"]), dict(ver.get("params") or {})),
        hidden=dict(obj.get("hidden") or {}), difficulty=obj.get("difficulty"),
        tags=tuple(obj.get("tags") or ()), metadata=dict(obj.get("metadata") or {}),
        environment=obj.get("environment"),
    )
