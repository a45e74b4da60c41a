"""What `honing serve` serves: a model spec, a run directory (`RUN` or `RUN@step-N`), or a release
(`release:NAME`, `release:current` which follows the registry's pointer). Loading gives an engine
(honing's transformers decode loop, or vLLM when asked and installed), its tokenizer and names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from honing.errors import HoningError

RELEASE_PREFIX = "release:"


@dataclass
class Served:
    name: str  # what responses report as `model`: the release name, or the spec
    engine: Any
    tokenizer: Any
    eos_ids: list[int]
    path: str  # the weights' directory ('' for an in-memory model)
    release: str | None = None
    variant: str = "standard"
    info: dict[str, Any] = field(default_factory=dict)


def is_release_spec(spec: str) -> bool:
    return spec.startswith(RELEASE_PREFIX)


def eos_ids_for(tok: Any) -> list[int]:
    ids = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0 and i != tok.unk_token_id)


def _engine(model: Any, tok: Any, eos: list[int], backend: str, max_batch_size: int) -> Any:
    if backend == "hf":
        from honing.engine.hf import TransformersEngine

        return TransformersEngine(model, eos, tok.pad_token_id, max_batch_size=max_batch_size)
    if backend == "vllm":
        from honing.config import RunConfig
        from honing.engine.factory import make_engine
        from honing.engine.vllm import import_vllm

        import_vllm()  # one clear error when vllm is not installed
        cfg = RunConfig.model_validate({"generation": {"backend": "vllm"}})
        return make_engine(cfg, model, tok, eos, max_batch_size=max_batch_size, need_weight_sync=False)
    raise HoningError(f"serve --engine {backend!r}: hf or vllm")


def resolve_release(spec: str, registry: Path | str | None) -> tuple[Path, str, str]:
    """`release:NAME` -> (verified release directory, release name, variant)."""
    from honing.release.registry import Registry

    name = spec[len(RELEASE_PREFIX):].strip()
    if not name:
        raise HoningError(f"serve {spec!r}: expected release:NAME or release:current")
    reg = Registry(registry)
    row = reg.current() if name == "current" else reg.get(name)
    if row is None:
        raise HoningError(f"registry {reg.root} has no current release: promote one with `honing release promote NAME`")
    reg.verify(row.name)  # a release that fails its checksum is never served
    return Path(row.path), row.name, row.variant


def pick_device(device: str) -> str:
    """'auto': a GPU when torch sees one, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_served(spec: str, *, registry: Path | str | None = None, backend: str = "hf",
                max_batch_size: int = 32, seed: int = 0, device: str = "auto") -> Served:
    """Load what `spec` names (see the module docstring). The hf engine decodes on `device`
    (int8 fast variants are CPU kernels and stay on the CPU; an ngram-spec variant decodes a
    lone request speculatively)."""
    from honing.models import load_policy

    release, variant, info = None, "standard", {}
    if is_release_spec(spec):
        path, release, variant = resolve_release(spec, registry)
        target, name = str(path), release
    else:
        from honing.eval.runner import resolve_model

        ref = resolve_model(spec)
        if ref.kind != "local":
            raise HoningError(f"serve {spec!r}: an endpoint cannot be served; give a model, run or release")
        target, name = ref.spec, spec
    model, tok = load_policy(target, seed=seed)
    standard = model
    if release is not None:
        from honing.release.fast import apply_variant, read_variant

        info = read_variant(Path(target))
        if info:
            model = apply_variant(model, info)
            variant = info.get("variant", variant)
    dev = pick_device(device)
    method = info.get("method", "standard")
    from honing.release.fast import stays_on_cpu

    if backend == "hf" and dev != "cpu" and not stays_on_cpu(method):
        model = model.to(dev)
    eos = eos_ids_for(tok)
    engine = _engine(model, tok, eos, backend, max_batch_size)
    if info:  # the variant's decoding part (speculative decoding for a lone stream)
        from honing.release.fast import configure_engine

        configure_engine(engine, method, standard=standard)
    return Served(name=name, engine=engine, tokenizer=tok, eos_ids=eos, path=target if Path(target).is_dir() else "",
                  release=release, variant=variant, info=info)


def current_release_name(registry: Path | str | None) -> str | None:
    """The registry's current pointer now (None when nothing is promoted): what a server that
    follows `release:current` polls."""
    from honing.release.registry import Registry

    row = Registry(registry).current()
    return row.name if row is not None else None
