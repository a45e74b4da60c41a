"""Engine interface: token ids in, token ids + sampling log-probs out (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 48
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1  # samples per prompt (a GRPO group); they share the prompt's prefill


@dataclass(frozen=True)
class Sample:
    """One generated continuation. `logprobs[i]` is log p(token_ids[i]) under the sampling
    distribution softmax(logits / temperature) (before top-p/top-k truncation; temperature 1 when greedy).
    The vLLM engine records vLLM's `processed_logprobs` instead: after top-p/top-k truncation, the
    distribution actually sampled from (identical without truncation); with it the trainer recomputes
    old log-probs and TIS is on, so the importance weights also correct the truncation."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]


class Engine(Protocol):
    version: int

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None) -> list[list[Sample]]:
        """For each prompt, `params.n` samples."""
        ...

    def load_weights(self, state: object, version: int) -> None: ...
