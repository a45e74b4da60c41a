"""Rollout sides for tests and benchmarks of honing.schedule.workers (importable in a spawned child).

`make_tiny_side`: the in-code tiny Llama + TransformersEngine; `make_echo_side`: no model, cheap
to start (no transformers import); `make_synthetic_side`: holds a state dict of given shapes and
copies pushed weights into it (push/load benchmarks)."""

from __future__ import annotations

import time
from typing import Any

import torch


def _control(payload: Any) -> None:
    if isinstance(payload, dict):
        if payload.get("sleep"):
            time.sleep(float(payload["sleep"]))
        if payload.get("raise"):
            raise RuntimeError(str(payload["raise"]))


class TinySide:
    def __init__(self, seed: int = 0) -> None:
        from honing.engine import TransformersEngine
        from honing.models import build_tiny_random

        self.model, self.tok = build_tiny_random(seed=seed)
        self.engine = TransformersEngine(self.model, [self.tok.eos_token_id], self.tok.pad_token_id)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(state, version)

    def run(self, payload: dict, seed: int) -> list[list[tuple[tuple[int, ...], tuple[float, ...]]]]:
        from honing.engine import SamplingParams

        _control(payload)
        if payload is None:  # no-op (benchmarks of the weight push)
            return []
        prompts = [self.tok.encode(p) for p in payload["prompts"]]
        params = SamplingParams(max_new_tokens=payload.get("max_new_tokens", 6), temperature=1.0,
                                n=payload.get("n", 2))
        out = self.engine.generate(prompts, params, seed=seed)
        return [[(s.token_ids, s.logprobs) for s in group] for group in out]


def make_tiny_side(arg: dict | None = None) -> TinySide:
    return TinySide(seed=(arg or {}).get("seed", 0))


class EchoSide:
    def __init__(self) -> None:
        self.checksum: float | None = None

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.checksum = float(sum(float(t.double().sum()) for t in state.values()))

    def run(self, payload: Any, seed: int) -> dict:
        _control(payload)
        return {"payload": payload, "seed": seed, "checksum": self.checksum}


def make_echo_side(arg: Any = None) -> EchoSide:
    return EchoSide()


class SyntheticSide:
    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: str = "float32") -> None:
        self.state = {k: torch.zeros(s, dtype=getattr(torch, dtype)) for k, s in shapes.items()}

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        for k, t in state.items():
            self.state[k].copy_(t)

    def run(self, payload: Any, seed: int) -> float:
        _control(payload)
        return float(next(iter(self.state.values())).view(-1)[:1000].double().sum())


def make_synthetic_side(arg: dict) -> SyntheticSide:
    return SyntheticSide(arg["shapes"], arg.get("dtype", "float32"))


def make_failing_side(arg: Any = None) -> Any:
    raise ValueError(f"this factory always fails (arg={arg!r})")
