"""How many rows one decode batch of the transformers engine may hold: a KV-cache token budget.

A batch's KV cache holds every row's prompt and its new tokens at once. Rows x context is what
runs a machine out of memory, not rows alone: 64 multi-turn CAD episodes at ~4k tokens of
history is ~12 GB of fp32 KV for a 135M model (the OOM kill that `honing eval --samples 8` on the
cad suite met on a 24 GB machine). So a generate call is cut into contiguous chunks that respect
both the row cap (`max_batch_size`) and a token cap (`max_batch_tokens`).

The automatic token cap comes from the machine's *total* memory, never its free memory, so that
the chunking, and with it which random draws each row gets, is the same on every run on one
machine (sampling stays reproducible whatever else runs).
"""

from __future__ import annotations

from typing import Any, Sequence

KV_MEMORY_FRACTION = 0.25  # of the device's total memory, for the decode batch's KV cache


def kv_bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes of K and V that one token adds across all layers (grouped-query heads counted once)."""
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return 2 * layers * heads * head_dim * int(element_size)


def device_memory_bytes(device: Any) -> int:
    """Total memory of the device the engine decodes on (RAM for the CPU); 0 when unknown."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def auto_batch_tokens(model: Any, fraction: float = KV_MEMORY_FRACTION) -> int | None:
    """`fraction` of the device's memory in KV tokens of `model` (None when it cannot be told)."""
    try:  # K and V come out in the activations' dtype: that of the floating weights (int8 ones aside)
        param = next(p for p in model.parameters() if p.is_floating_point())
        per_token = kv_bytes_per_token(model.config, param.element_size())
    except (AttributeError, StopIteration, TypeError):
        return None
    total = device_memory_bytes(param.device)
    if not total or per_token <= 0:
        return None
    return max(1, int(total * fraction) // per_token)


def plan_chunks(prompt_lens: Sequence[int], n: int, max_new_tokens: int, max_rows: int,
                max_tokens: int | None) -> list[range]:
    """Contiguous ranges of prompts, in order: each holds at most `max_rows // n` prompts (at least
    one) and, beyond its first prompt, at most `max_tokens` KV tokens, a prompt costing
    (its length + max_new_tokens) x n. A single prompt over the budget still gets its own chunk."""
    per = max(1, max_rows // max(n, 1))
    out: list[range] = []
    start = 0
    while start < len(prompt_lens):
        end, used = start, 0
        while end < len(prompt_lens) and end - start < per:
            need = (int(prompt_lens[end]) + max_new_tokens) * max(n, 1)
            if end > start and max_tokens is not None and used + need > max_tokens:
                break
            used += need
            end += 1
        out.append(range(start, end))
        start = end
    return out
