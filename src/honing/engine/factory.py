"""Build the generation engine `generation.backend` names, for training, held-out evaluation,
`honing eval` and `honing rollout`."""

from __future__ import annotations

from typing import Any, Sequence


def make_engine(cfg: Any, model: Any, tok: Any, eos_ids: Sequence[int] | None = None, *,
                backend: str | None = None, max_batch_size: int | None = None, need_weight_sync: bool = True) -> Any:
    """An Engine over `model` (the trainer's module or a worker's copy) for `cfg` (a RunConfig, or
    None for the defaults). `backend` overrides `cfg.generation.backend`; `need_weight_sync=False`
    (evaluation, `honing rollout`) accepts a server honing cannot push weights to."""
    from honing.config import RunConfig

    cfg = cfg if cfg is not None else RunConfig()
    g = cfg.generation
    backend = backend or g.backend
    if eos_ids is None:
        from honing.schedule.rollout_side import eos_ids_of

        eos_ids = eos_ids_of(tok)
    if backend == "hf":
        from honing.engine.hf import TransformersEngine, engine_weights_dtype

        return TransformersEngine(model, eos_ids, tok.pad_token_id, cfg.model.bf16_autocast,
                                  max_batch_size or g.max_batch_size,
                                  engine_weights_dtype(g.weights, cfg.model.bf16_autocast, model.device),
                                  max_batch_tokens=g.max_batch_tokens)
    if backend == "vllm":
        from honing.engine.vllm import VLLMEngine

        return VLLMEngine(model, tok, eos_ids, seed=cfg.seed, max_num_seqs=max(max_batch_size or g.max_batch_size, 8))
    if backend == "vllm-server":
        from honing.engine.vllm_server import make_server_engine

        return make_server_engine(cfg, model, tok, eos_ids, need_weight_sync=need_weight_sync, seed=cfg.seed)
    from honing.errors import HoningError

    raise HoningError(f"unknown generation.backend {backend!r} (hf, vllm, vllm-server)")


def describe_engine(engine: Any) -> str:
    """A short name for the engine and the weights it decodes with: 'hf', 'hf bfloat16 copy', 'vllm'..."""
    from honing.engine.hf import TransformersEngine

    if isinstance(engine, TransformersEngine):
        if engine.weights_dtype is not None:
            return f"hf {str(engine.weights_dtype).removeprefix('torch.')} copy"
        return "hf, bf16 autocast" if engine.bf16_autocast else f"hf {str(engine.model.dtype).removeprefix('torch.')}"
    names = {"VLLMEngine": "vllm", "VLLMServerEngine": "vllm-server"}
    return names.get(type(engine).__name__, type(engine).__name__)
