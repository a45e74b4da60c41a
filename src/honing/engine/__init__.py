"""Generation backends: in-process transformers (token level), chat clients over any Engine or an
OpenAI-compatible HTTP endpoint. Imports are lazy so an HTTP-only judge does not load torch."""

from __future__ import annotations

from typing import Any

from honing.engine.types import Engine, Sample, SamplingParams

__all__ = ["Engine", "Sample", "SamplingParams", "TransformersEngine", "bf16_supported", "engine_weights_dtype", "make_engine"]


def __getattr__(name: str) -> Any:
    if name in ("TransformersEngine", "bf16_supported", "engine_weights_dtype"):
        from honing.engine import hf

        return getattr(hf, name)
    if name == "make_engine":
        from honing.engine.factory import make_engine

        return make_engine
    raise AttributeError(f"module 'honing.engine' has no attribute {name!r}")
