"""The Trajectory type: what one attempt at a task produced, token-in/token-out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # verify imports this module; keep the runtime import one-way
    from honing.verify.types import Verdict

Status = Literal["ok", "truncated", "infra_error"]


@dataclass
class Trajectory:
    """One sample. `prompt_ids`/`completion_ids` are exactly the engine's tokens (never
    re-tokenised text); `logprobs` are the engine's sampling log-probs of `completion_ids`.
    `loss_mask` is 1 on model-generated tokens (multi-turn work will add 0s for observations)."""

    task_id: str
    domain: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    completion_text: str
    finish_reason: str
    policy_version: int
    group: int = 0  # index of the GRPO group (same prompt) within the step
    loss_mask: tuple[int, ...] = ()
    verdict: Verdict | None = None
    reward: float = 0.0
    advantage: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.loss_mask:
            self.loss_mask = (1,) * len(self.completion_ids)

    @classmethod
    def from_text(cls, task_id: str, domain: str, text: str) -> "Trajectory":
        """A text-only trajectory (no tokens), for grading a completion that did not come from an engine."""
        return cls(task_id=task_id, domain=domain, prompt_ids=(), completion_ids=(), logprobs=(),
                   completion_text=text, finish_reason="stop", policy_version=-1)

    @property
    def status(self) -> Status:
        if self.verdict is not None and self.verdict.infra_error:
            return "infra_error"
        return "truncated" if self.finish_reason == "length" else "ok"
