"""Verdict and the Verifier protocol (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class Verdict:
    """A grade. `infra_error` means the grader could not grade: retry or drop, never score 0."""

    score: float
    passed: bool
    components: Mapping[str, float] = field(default_factory=dict)
    details: str = ""
    infra_error: bool = False
    cost_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.infra_error and not 0.0 <= self.score <= 1.0:
            raise ValueError(f"Verdict.score must be in [0, 1], got {self.score}")

    @classmethod
    def infra(cls, details: str, cost_s: float = 0.0) -> "Verdict":
        return cls(score=0.0, passed=False, details=details, infra_error=True, cost_s=cost_s)


@dataclass(frozen=True)
class VerifyContext:
    """What a verifier may use besides the task and completion (sandbox access comes later)."""

    extractor: str = "auto"
    format_weight: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Verifier(Protocol):
    """Grades one trajectory of a task. Single-turn verifiers read `trajectory.completion_text`;
    multi-turn ones can read the turns. Hidden material is in `task.hidden`."""

    def verify(self, task: Any, trajectory: Any, ctx: VerifyContext) -> Verdict: ...
