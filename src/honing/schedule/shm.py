"""A state dict in shared memory: one flat buffer per dtype, tied tensors stored once, so pushing
weights to a rollout worker process copies them once and sends only file descriptors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from honing.errors import HoningError


@dataclass
class _Packed:
    """A state dict as one flat shared-memory tensor per dtype + where each entry lies in it."""

    buf_id: int
    flats: dict[str, torch.Tensor]  # dtype name -> flat 1-D shared tensor
    entries: list[tuple[str, str, int, tuple[int, ...]]]  # (name, dtype name, offset, shape)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _layout(state: dict[str, torch.Tensor]) -> tuple[dict[str, int], list[tuple[str, str, int, tuple[int, ...]]],
                                                     list[torch.Tensor | None]]:
    """Sizes per dtype, the entries, and the source tensor to copy for each entry (None = alias
    of an earlier entry, e.g. tied embeddings)."""
    sizes: dict[str, int] = {}
    entries: list[tuple[str, str, int, tuple[int, ...]]] = []
    sources: list[torch.Tensor | None] = []
    seen: dict[tuple, int] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise HoningError(f"weights[{name!r}] is a {type(t).__name__}, not a tensor")
        dn = _dtype_name(t.dtype)
        key = (t.device, t.data_ptr(), dn, tuple(t.shape), tuple(t.stride())) if t.numel() else None
        if key is not None and key in seen:
            _, _, off, shape = entries[seen[key]]
            entries.append((name, dn, off, shape))
            sources.append(None)
            continue
        off = sizes.get(dn, 0)
        sizes[dn] = off + t.numel()
        if key is not None:
            seen[key] = len(entries)
        entries.append((name, dn, off, tuple(t.shape)))
        sources.append(t.detach())
    return sizes, entries, sources


def _new_shared(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D tensor in shared memory (without allocating private memory first)."""
    nbytes = max(numel, 1) * torch.empty((), dtype=dtype).element_size()
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))
    except (AttributeError, RuntimeError):  # pragma: no cover - older/newer torch without the private API
        return torch.empty(numel, dtype=dtype).share_memory_()


def pack_state(state: dict[str, torch.Tensor], buf_id: int = 0,
               flats: dict[str, torch.Tensor] | None = None) -> _Packed:
    """Copy `state` (CPU or GPU tensors) into flat shared-memory buffers; reuse `flats` when its
    sizes match. Tensors that are the same view (tied weights) are stored once."""
    sizes, entries, sources = _layout(state)
    if flats is None or {k: v.numel() for k, v in flats.items()} != sizes:
        flats = {dn: _new_shared(n, getattr(torch, dn)) for dn, n in sizes.items()}
    for (_, dn, off, shape), src in zip(entries, sources):
        if src is not None and src.numel():
            flats[dn][off:off + src.numel()].view(shape).copy_(src)
    return _Packed(buf_id, flats, entries)


def unpack_state(packed: _Packed) -> dict[str, torch.Tensor]:
    """Views into the shared buffers, in the original order."""
    out: dict[str, torch.Tensor] = {}
    for name, dn, off, shape in packed.entries:
        n = 1
        for s in shape:
            n *= s
        out[name] = packed.flats[dn][off:off + n].view(shape)
    return out
