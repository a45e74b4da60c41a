"""The Task type and the TaskSource protocol (DESIGN.md: core types)."""

from __future__ import annotations

from dataclasses import dataclass, field
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
