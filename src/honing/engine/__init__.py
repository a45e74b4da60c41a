"""Generation backends. In-process transformers now; vLLM and OpenAI-compatible later."""

from honing.engine.hf import TransformersEngine, bf16_supported
from honing.engine.types import Engine, Sample, SamplingParams

__all__ = ["Engine", "Sample", "SamplingParams", "TransformersEngine", "bf16_supported"]
