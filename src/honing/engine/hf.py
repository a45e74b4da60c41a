"""The transformers generation backend (CPU or GPU).

Our own decode loop rather than `model.generate`: it returns the exact sampling log-probs of
each token without keeping full-vocabulary scores for every step, and it runs the prompt of a
GRPO group once (prefill) and then copies its KV cache to the group's n samples.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from honing.engine.budget import auto_batch_tokens, plan_chunks
from honing.engine.kvcache import GrowingCache
from honing.engine.prefix import PrefixCache, batch_past, row_kv
from honing.engine.types import Sample, SamplingParams

if TYPE_CHECKING:
    from honing.engine.speculative import NgramDraft


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """bf16 matmuls that are fast, not emulated: CUDA with bf16, or a CPU with AMX/AVX512-BF16."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def engine_weights_dtype(choice: str, bf16_autocast: bool, device: torch.device | str = "cpu") -> torch.dtype | None:
    """`generation.weights`: 'shared' generates with the trainer's module (None); 'bf16' with a
    private bf16 copy; 'auto' picks the copy when bf16 autocast is on and the device has bf16."""
    if choice == "bf16" or (choice == "auto" and bf16_autocast and bf16_supported(device)):
        return torch.bfloat16
    return None


def autocast_ctx(enabled: bool, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    dev = torch.device(device)
    if enabled:
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (tokens, their log-probs under softmax(logits / T)).

    Sampling is by inverse CDF: one uniform number per row against the cumulative
    probabilities. `torch.multinomial` draws an exponential variate for every vocabulary entry
    (49k per row, single-threaded on CPU): it was a quarter of SmolLM2's decode time.
    """
    logits = logits.float()
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    tok = inverse_cdf_sample(torch.softmax(truncate(logp, params), dim=-1), gen)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def truncate(logp: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`logp` [N, V] with the tokens outside top-k / top-p set to -inf (not renormalised)."""
    filt = logp
    if params.top_k > 0:
        kth = torch.topk(filt, min(params.top_k, filt.shape[-1]), dim=-1).values[:, -1:]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    if params.top_p < 1.0:
        srt, idx = torch.sort(filt, descending=True, dim=-1)
        p_srt = torch.softmax(srt, dim=-1)
        drop = p_srt.cumsum(-1) - p_srt > params.top_p  # keep the token that crosses top_p
        filt = filt.scatter(-1, idx, srt.masked_fill(drop, float("-inf")))
    return filt


def inverse_cdf_sample(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One index per row of `probs` [B, V] (rows need not sum to exactly 1): the first index whose
    cumulative probability exceeds u * total, u ~ U[0, 1). Zero-probability entries are never
    chosen: their interval is empty (the row's argmax guards the rounding edge u * total = total)."""
    cum = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64, device=probs.device)
    tok = torch.searchsorted(cum, u * cum[:, -1:], right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    bad = probs.gather(-1, tok[:, None]).squeeze(-1) <= 0
    return torch.where(bad, probs.argmax(-1), tok) if bool(bad.any()) else tok


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def _cache_kwarg(model: PreTrainedModel) -> str:
    """transformers renamed `past_key_values` to `cache` (deprecated in 5.x); use what this version takes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


class TransformersEngine:
    """Generates from an in-process model.

    By default it generates with the module it is given, which the trainer updates in place, so
    `load_weights(None, v)` only bumps the policy version. With `weights_dtype` (bf16 on a CPU
    with bf16 matmuls, or a GPU) it keeps its own copy of the policy in that dtype, as an
    inference server would: decoding then reads half the bytes per token and skips autocast's
    per-call weight casts (1.4x faster decoding for SmolLM2 on 2 cores), and
    `load_weights(None, v)` copies the trainer's weights into it (tens of ms for 135M
    parameters). The engine's sampling log-probs then come from bf16 weights; the trainer
    logs the mismatch every step (`logprob_mismatch`), and TIS / sequence masking correct it.
    """

    def __init__(self, model: PreTrainedModel, eos_ids: Sequence[int], pad_id: int,
                 bf16_autocast: bool = False, max_batch_size: int = 64,
                 weights_dtype: torch.dtype | None = None, speculative: "NgramDraft | None" = None,
                 max_batch_tokens: int | None = None) -> None:
        self.eos_ids = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self.pad_id = pad_id
        self.bf16_autocast = bf16_autocast
        self.weights_dtype = weights_dtype
        self.max_batch_size = max_batch_size
        # most KV tokens (prompt + new, summed over rows) one decode batch holds (engine/budget.py);
        # None: a quarter of the device's memory, set by set_model from the model's shape
        self.max_batch_tokens = max_batch_tokens
        self._auto_tokens = max_batch_tokens is None
        self.version = 0
        self.compact = True  # drop finished rows from the decode batch once a quarter of it is done
        # called with each decode step's tokens [rows of the chunk] (pad for finished rows): how
        # `honing serve` streams tokens as they are made; None in training
        self.on_step: Callable[[torch.Tensor], None] | None = None
        # speculative decoding with an n-gram draft (engine/speculative.py), stream by stream, for
        # chunks of at most `speculative_max_rows` rows (prompts x n): one stream is what a server
        # sees at low load; larger batches decode batched as usual (they amortise the per-step cost)
        self.speculative = speculative
        self.speculative_max_rows = 1
        self.spec_stats = {"forwards": 0, "drafted": 0, "accepted": 0}
        # a second copy of the same weights that runs the prompt (prefill) while `model` runs the
        # decode steps, sharing one KV cache: how a fast variant keeps the prompt exact (fp32) and
        # decodes with int8 weights (release/fast.py `int8-decode`); None: `model` does both
        self.prefill_model: PreTrainedModel | None = None
        # prompts' KV for reuse by prompts that extend them (engine/prefix.py), inside `prefix_caching()`
        self.prefix_cache: PrefixCache | None = None
        self.prefix_stats: dict[str, int] = {}  # PrefixCache.stats summed over closed scopes
        self.set_model(model)

    def set_model(self, model: PreTrainedModel) -> None:
        """Generate with `model`'s weights (a private copy when `weights_dtype` differs from its dtype)."""
        self.source = model
        self._weights_changed()
        if self.weights_dtype is not None and model.dtype != self.weights_dtype:
            copy_ = copy.deepcopy(model).to(self.weights_dtype).eval()
            self.model = copy_.requires_grad_(False)
        else:
            self.model = model
        if self._auto_tokens:
            self.max_batch_tokens = auto_batch_tokens(self.model)
        own_dtype = self.model is not model
        self.autocast = self.bf16_autocast and not own_dtype and bf16_supported(model.device)
        self._cache_kw = _cache_kwarg(self.model)

    def load_weights(self, state: object, version: int) -> None:
        """New policy weights: a state dict, or None for "the module given to set_model changed"."""
        self._weights_changed()
        if state is not None and state is not self.model and state is not self.source:
            self.model.load_state_dict(state)  # type: ignore[arg-type]
        elif self.model is not self.source:
            self.sync()
        self.version = version

    def _weights_changed(self) -> None:
        if getattr(self, "prefix_cache", None) is not None:
            self.prefix_cache.clear()

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the source module's parameters and buffers into the private copy (dtype cast)."""
        for dst, src in zip(self.model.parameters(), self.source.parameters(), strict=True):
            dst.copy_(src)
        for dst, src in zip(self.model.buffers(), self.source.buffers(), strict=True):
            dst.copy_(src)

    def _prefiller(self) -> PreTrainedModel:
        return self.model if self.prefill_model is None else self.prefill_model

    def _chunks(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[range]:
        return plan_chunks([len(p) for p in prompts], params.n, params.max_new_tokens, self.max_batch_size,
                           self.max_batch_tokens)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None) -> list[list[Sample]]:
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        was_training = self.model.training
        self.model.eval()
        out: list[list[Sample]] = []
        try:
            for idx in self._chunks(prompts, params):
                out.extend(self._generate_chunk([prompts[i] for i in idx], params, gen))
        finally:
            self.model.train(was_training)
        return out

    def _generate_chunk(self, prompts: list[Sequence[int]], params: SamplingParams,
                        gen: torch.Generator | None) -> list[list[Sample]]:
        if self.speculative is not None and len(prompts) * params.n <= self.speculative_max_rows \
                and all(len(p) > 0 for p in prompts):
            return [[self._generate_speculative(p, params, gen) for _ in range(params.n)] for p in prompts]
        dev = self.model.device
        cache = GrowingCache(params.max_new_tokens)
        if self.prefix_cache is not None:
            logits, mask, pos = self._prefill_cached(prompts, cache, self.prefix_cache)
        else:
            ids, mask = left_pad(prompts, self.pad_id)
            ids, mask = ids.to(dev), mask.to(dev)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with autocast_ctx(self.autocast, dev):
                logits = self._prefiller()(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                                           logits_to_keep=1, **{self._cache_kw: cache}).logits[:, -1]
        n = params.n
        if n > 1:  # the group shares one prefill; copy its cache to the n samples
            cache.batch_repeat_interleave(n)
            logits, mask = logits.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
            pos = pos.repeat_interleave(n, 0)
        rows = logits.shape[0]
        next_pos = pos[:, -1:] + 1
        eos = self.eos_ids.to(dev)
        done = torch.zeros(rows, dtype=torch.bool, device=dev)
        live = torch.arange(rows, device=dev)  # the rows still decoded (finished ones are dropped)
        toks, lps = [], []
        for step in range(params.max_new_tokens):
            tok_l, lp_l = sample_tokens(logits, params, gen if dev.type == "cpu" else None)
            tok = torch.full((rows,), self.pad_id, dtype=tok_l.dtype, device=dev)
            lp = torch.zeros(rows, dtype=lp_l.dtype, device=dev)
            tok[live], lp[live] = tok_l, lp_l
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            toks.append(tok)
            lps.append(lp)
            if self.on_step is not None:
                self.on_step(tok)
            newly = torch.isin(tok, eos) & ~done
            done = done | newly
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            keep = ~done[live]
            if self.compact and int(keep.sum()) <= 0.75 * len(live):  # stop computing finished rows
                idx = keep.nonzero().squeeze(1)
                cache.batch_select_indices(idx)
                live, mask, next_pos = live[idx], mask[idx], next_pos[idx]
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=dev)], dim=1)
            with autocast_ctx(self.autocast, dev):
                logits = self.model(input_ids=tok[live][:, None], attention_mask=mask, position_ids=next_pos,
                                    use_cache=True, **{self._cache_kw: cache}).logits[:, -1]
            next_pos = next_pos + 1
        tok_m = torch.stack(toks, 1).cpu()
        lp_m = torch.stack(lps, 1).float().cpu()
        samples: list[list[Sample]] = []
        eos_set = set(self.eos_ids.tolist())
        for r in range(rows):
            ids_r, lps_r, reason = [], [], "length"
            for t in range(tok_m.shape[1]):
                ids_r.append(int(tok_m[r, t]))
                lps_r.append(float(lp_m[r, t]))
                if ids_r[-1] in eos_set:
                    reason = "stop"
                    break
            if r % n == 0:
                samples.append([])
            samples[-1].append(Sample(tuple(ids_r), tuple(lps_r), reason))  # type: ignore[arg-type]
        return samples

    def _prefill_cached(self, prompts: list[Sequence[int]], cache: DynamicCache,
                        pc: PrefixCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefill with the prefix cache: identical prompts run once, each runs only the tokens
        past its longest cached prefix, and every prompt's KV is stored for the next turn.
        Returns the last position's logits, the attention mask and the position ids, per prompt."""
        dev = self.model.device
        uniq: dict[tuple[int, ...], int] = {}
        for p in prompts:
            uniq.setdefault(tuple(p), len(uniq))
        keys = list(uniq)
        hits = [pc.longest(k) for k in keys]
        lengths = [h[0] for h in hits]
        ids, mask = left_pad([k[n:] for k, n in zip(keys, lengths, strict=True)], self.pad_id)
        ids, mask = ids.to(dev), mask.to(dev)
        if any(lengths):
            like = next(kv for _, kv in hits if kv is not None)
            past, past_mask = batch_past([kv for _, kv in hits], lengths, like)
            for layer, (k, v) in enumerate(past):
                cache.update(k, v, layer)
            mask = torch.cat([past_mask.to(dev), mask], dim=1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with autocast_ctx(self.autocast, dev):
            logits = self._prefiller()(input_ids=ids, attention_mask=mask, position_ids=pos[:, -ids.shape[1]:],
                                       use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}).logits[:, -1]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for r, k in enumerate(keys):
            pc.put(k, row_kv(layers, r, mask[r].bool()))
        if len(keys) < len(prompts):
            idx = torch.tensor([uniq[tuple(p)] for p in prompts], device=dev)
            cache.batch_select_indices(idx)
            logits, mask, pos = logits[idx], mask[idx], pos[idx]
        return logits, mask, pos

    @contextlib.contextmanager
    def prefix_caching(self, max_tokens: int = 65536) -> Iterator[PrefixCache]:
        """Within the block, prompts that extend one already prefilled reuse its KV (a multi-turn
        rollout: the weights must not change inside it; a weight load clears it anyway)."""
        self.prefix_cache = PrefixCache(max_tokens)
        try:
            yield self.prefix_cache
        finally:
            for k, v in self.prefix_cache.stats.items():
                self.prefix_stats[k] = self.prefix_stats.get(k, 0) + v
            self.prefix_cache = None

    def _generate_speculative(self, prompt: Sequence[int], params: SamplingParams,
                              gen: torch.Generator | None) -> Sample:
        from honing.engine.speculative import speculative_decode

        dev = self.model.device
        cache = DynamicCache()

        def forward(ids: torch.Tensor, cache: DynamicCache, past: int) -> torch.Tensor:
            m = ids.shape[1]
            pos = torch.arange(past, past + m, device=dev)[None]
            mask = torch.ones((1, past + m), dtype=torch.long, device=dev)
            with autocast_ctx(self.autocast, dev):
                return self.model(input_ids=ids.to(dev), attention_mask=mask, position_ids=pos, use_cache=True,
                                  **{self._cache_kw: cache}).logits[0]

        def sample(logits: torch.Tensor) -> tuple[int, float]:
            tok, lp = sample_tokens(logits, params, gen if dev.type == "cpu" else None)
            return int(tok[0]), float(lp[0])

        def on_token(t: int) -> None:
            if self.on_step is not None:
                self.on_step(torch.tensor([t]))

        ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
        with autocast_ctx(self.autocast, dev):
            first = self._prefiller()(input_ids=ids, use_cache=True, logits_to_keep=1,
                                      **{self._cache_kw: cache}).logits[:, -1]
        assert self.speculative is not None
        out, stats = speculative_decode(forward, prompt, first, cache, params, self.speculative,
                                        set(self.eos_ids.tolist()), gen if dev.type == "cpu" else None, sample, on_token)
        for k, v in stats.items():
            self.spec_stats[k] += v
        return out
