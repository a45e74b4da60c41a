"""Layered reward: the seeds' composition ("format 0.1, execution 0.6 x pass rate, judge 0.3 only
for open-ended tasks", minus penalties, clipped) as configuration, not code.

A layer reads one component of a verdict. By default that is the task's own verdict (every
built-in verifier reports `correct` and `format`); a layer may instead name another verifier
(e.g. `judge`) that grades the same trajectory. Layers and penalties can be limited to some
domains. The reward of a trajectory is

    clip( sum_i w_i * s_i / sum_i w_i  -  sum_j penalty_j ,  lo, hi )

over the layers that apply to its domain (without `normalize`, the division is dropped).
Each layer's score and each penalty is returned by name so the loop can log them per domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from honing.errors import ConfigError
from honing.verify.types import Verdict


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class LayerConfig(_Node):
    name: str
    """Name used in logs (reward/<domain>/<name>)."""
    weight: float = Field(gt=0)
    """Weight of this layer among the layers that apply to a task."""
    component: str = "correct"
    """Which verdict component this layer scores (e.g. 'correct', 'format', 'judge'), or 'passed': 1 if the
    verdict passed (every test, every field), else 0 — an all-or-nothing reward where 'correct' gives partial
    credit (the code verifier's share of hidden tests passed)."""
    verifier: str | None = None
    """Grade with this verifier instead of the task's own (e.g. 'judge' on top of unit tests)."""
    params: dict[str, Any] = {}
    """Parameters for `verifier` (merged over the task's verifier params)."""
    domains: list[str] | None = None
    """Apply only to tasks of these domains (None: all)."""


class PenaltyConfig(_Node):
    name: str
    """Name used in logs (reward/<domain>/penalty/<name>)."""
    kind: Literal["overlong", "turns", "truncated"]
    """overlong: DAPO soft length penalty; turns: per turn beyond `free`; truncated: flat when cut off."""
    weight: float = Field(1.0, ge=0)
    """Multiplies the penalty (the penalty before weighting is in [0, 1])."""
    max_tokens: int | None = Field(None, gt=0)
    """overlong: the length at which the penalty reaches 1 (default: generation.max_new_tokens)."""
    buffer_tokens: int = Field(16, ge=0)
    """overlong: the penalty rises linearly over the last `buffer_tokens` before `max_tokens`."""
    free: int = Field(1, ge=0)
    """turns: turns that cost nothing."""
    per_unit: float = Field(0.1, ge=0)
    """turns: penalty per turn beyond `free` (capped at 1)."""
    domains: list[str] | None = None
    """Apply only to tasks of these domains (None: all)."""


class RewardConfig(_Node):
    layers: list[LayerConfig] = []
    """Reward layers. Empty: the reward is the task verifier's own score."""
    penalties: list[PenaltyConfig] = []
    """Subtracted after the layers are combined."""
    normalize: bool = True
    """Divide by the sum of the weights of the layers that apply to the task."""
    clip: tuple[float, float] = (0.0, 1.0)
    """Final reward range."""

    @model_validator(mode="after")
    def _check(self) -> "RewardConfig":
        names = [x.name for x in self.layers] + [f"penalty/{p.name}" for p in self.penalties]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"reward layer names must be unique; repeated: {sorted(dup)}")
        if self.clip[0] > self.clip[1]:
            raise ValueError(f"reward.clip low {self.clip[0]} is above high {self.clip[1]}")
        return self


@dataclass(frozen=True)
class Reward:
    value: float
    layers: Mapping[str, float]  # layer name -> score in [0, 1]; penalty/<name> -> penalty subtracted


def applies(domains: Sequence[str] | None, domain: str) -> bool:
    return domains is None or domain in domains


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), as a positive penalty in [0, 1]:
    0 up to max - buffer, rising linearly to 1 at max, 1 beyond."""
    start = max_tokens - buffer_tokens
    if length <= start:
        return 0.0
    if length >= max_tokens or buffer_tokens == 0:
        return 1.0
    return (length - start) / buffer_tokens


def penalty_value(p: PenaltyConfig, n_tokens: int, n_turns: int, truncated: bool, default_max: int) -> float:
    if p.kind == "overlong":
        raw = overlong_penalty(n_tokens, p.max_tokens or default_max, p.buffer_tokens)
    elif p.kind == "turns":
        raw = min(1.0, p.per_unit * max(0, n_turns - p.free))
    else:
        raw = 1.0 if truncated else 0.0
    return p.weight * raw


PASSED = "passed"  # the pseudo-component every verdict has: its pass/fail, as 1.0 / 0.0


def layer_score(layer: LayerConfig, verdict: Verdict) -> float:
    if layer.component == PASSED and PASSED not in verdict.components:
        return 1.0 if verdict.passed else 0.0
    if layer.component not in verdict.components:
        raise ConfigError(f"reward layer '{layer.name}': the verdict has no component '{layer.component}' "
                          f"(it has: {', '.join(sorted(verdict.components)) or 'none'}, and '{PASSED}')")
    return float(verdict.components[layer.component])


def compose(cfg: RewardConfig, domain: str, verdicts: Mapping[str | None, Verdict], n_tokens: int = 0,
            n_turns: int = 1, truncated: bool = False, default_max_tokens: int = 1 << 30) -> Reward:
    """Combine the verdicts of one trajectory. `verdicts[None]` is the task's own verdict;
    `verdicts[layer.name]` the verdict of a layer with its own verifier. Pure; no grading here."""
    own = verdicts[None]
    if not cfg.layers and not cfg.penalties:
        return Reward(own.score, {})
    scores: dict[str, float] = {}
    total = wsum = 0.0
    layers = [x for x in cfg.layers if applies(x.domains, domain)]
    for layer in layers:
        s = layer_score(layer, verdicts[layer.name] if layer.verifier else own)
        scores[layer.name] = s
        total += layer.weight * s
        wsum += layer.weight
    value = own.score if not layers else (total / wsum if cfg.normalize else total)
    for p in cfg.penalties:
        if applies(p.domains, domain):
            pen = penalty_value(p, n_tokens, n_turns, truncated, default_max_tokens)
            scores[f"penalty/{p.name}"] = pen
            value -= pen
    lo, hi = cfg.clip
    return Reward(min(max(value, lo), hi), scores)


def extra_verifiers(cfg: RewardConfig, domain: str) -> list[LayerConfig]:
    """Layers that need their own verifier run for a task of `domain`."""
    return [x for x in cfg.layers if x.verifier and applies(x.domains, domain)]
