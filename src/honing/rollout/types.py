"""The Trajectory type: what one attempt at a task produced, token-in/token-out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # verify imports this module; keep the runtime import one-way
    from honing.verify.types import Verdict

Status = Literal["ok", "truncated", "infra_error"]


@dataclass
class Turn:
    """One assistant turn of a multi-turn episode and the observation inserted after it.
    `action_ids` are the engine's tokens (loss mask 1 unless masked as stale after a context
    truncation); `observation_ids` are the template tokens inserted after them (mask 0)."""

    index: int
    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    action_text: str
    observation_ids: tuple[int, ...]
    observation_text: str
    finish_reason: str = "stop"
    tool: str | None = None
    ok: bool = True
    parse_error: bool = False
    snapshot_id: str | None = None  # the session's workspace after this turn's action
    timings: dict[str, float] = field(default_factory=dict)  # gen_s (batch), env_s, snapshot_s
    observation_truncated: bool = False


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
    reward_layers: dict[str, float] = field(default_factory=dict)  # layered reward, by layer name
    advantage: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # multi-turn (honing.rollout.multiturn); empty for single-turn samples. For a multi-turn
    # trajectory, completion_ids == concat(turn.action_ids + turn.observation_ids).
    turns: tuple[Turn, ...] = ()
    messages: tuple[dict[str, str], ...] = ()  # the readable conversation (observations as inserted)
    stop_reason: str = ""  # submit, max_turns, max_tokens, wall_time, parse_errors, context, infra_error
    truncated_context: bool = False
    truncations: tuple[dict[str, int], ...] = ()  # {"at_turn", "observation_of_turn", "tokens_removed"}
    stats: dict[str, int] = field(default_factory=dict)  # failed_tool_calls, test_runs, correction_rounds...
    files: dict[str, str] = field(default_factory=dict)  # the final workspace's text files, for graders

    @property
    def snapshot_ids(self) -> tuple[str | None, ...]:
        return tuple(t.snapshot_id for t in self.turns)

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
