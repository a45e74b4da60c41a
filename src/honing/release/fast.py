"""The fast variant of a release: options measured side by side, the fastest one kept whose held-out
pass@1 stays inside the standard variant's 95% CI.

Options measured now (a method is a weights part, a decoding part, or both joined by '+'):

- `int8-decode`: post-training dynamic int8 quantization (torch.ao, fbgemm on x86 CPUs) of every
  nn.Linear for the *decode steps*, while the prompt (prefill) runs the standard fp32 weights and
  hands its KV cache over. Decoding a 135M model on a CPU reads its weights once per token, so a
  quarter of the bytes is where the speed comes from; the prompt is read once, exactly.
- `int8-dynamic`: the same int8 weights for prefill too (accepted by name, no longer measured). It is
  what broke extraction: dynamic quantization scales activations per tensor, so over a whole prompt
  the token with the largest activations sets the scale for all of them. In the trained finance
  model's MLP down-projections that token is 5-11x the median one (489 vs 45 at the last layer, the
  first token), so the rest of the prompt, the document the reply copies numbers from, kept 2 to 3.5
  fewer of its 8 bits in the KV cache. A decode step quantizes one token, with its own scale. On finance
  after SFT (64 held-out tasks, greedy) pass@1 went 0.469 -> 0.016 with int8-dynamic and 0.469 ->
  0.438 [0.312, 0.562] with int8-decode, at 1.47x.
- `bf16`: a bf16 copy of the weights, only where bf16 matmuls are native (a GPU, or a CPU with
  AMX/AVX512-BF16); emulated bf16 is slower than fp32, so it is not tried elsewhere.
- `ngram-spec`: speculative decoding with an n-gram draft (engine/speculative.py): the tokens that
  followed the latest earlier occurrence of the last n-gram are scored in one forward and the prefix
  the model agrees with is kept. Lossless (greedy output unchanged; sampled output has the same
  distribution); it pays where replies copy their prompt or repeat themselves (extraction, code,
  patches) and little on free prose. It runs stream by stream: a server uses it for a lone request
  and decodes concurrent requests batched as usual.
- `int8-decode+ngram-spec` (and `bf16+ngram-spec`): both.

Not covered: a draft *model*. A truncated-layer draft (SmolLM2's first 6 of 30 layers, no training)
through transformers' assisted generation measured 0.5 tokens/s against 1.5-2.4 for plain greedy
generate in the same script (a loaded 2-core machine): an untrained early-exit draft is rejected too
often to pay for itself, and SmolLM2-135M has no smaller sibling. GPU int8 kernels neither.
Weight-only int8 (activations kept exact) neither: torch's CPU kernel `_weight_int8pack_mm` took
606 us against 88 us for the fp32 matmul of one 576x1536 row on an AVX2 CPU. The gate below, not
the speed, decides what a release ships.
The variant is a recipe over the same HF weights (variant.json): `honing serve` applies it at
load time, which takes about a second; the weights on disk stay the standard, loadable ones
(int8-decode keeps both copies in memory: the fp32 one for prompts, the int8 one for decoding).
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from honing.errors import HoningError

VARIANT_FILE = "variant.json"


WEIGHT_METHODS = ("int8-decode", "int8-dynamic", "bf16")
INT8_METHODS = ("int8-decode", "int8-dynamic")  # fbgemm CPU kernels: these stay on the CPU
DECODE_METHODS = ("ngram-spec",)


def options() -> list[str]:
    from honing.engine.hf import bf16_supported

    if torch.cuda.is_available():  # serve decodes on the GPU there: bf16 is the option, fbgemm int8 is CPU-only
        weights = ["bf16"]
    else:
        weights = ["int8-decode"] + (["bf16"] if bf16_supported("cpu") else [])
    return weights + ["ngram-spec"] + [f"{w}+ngram-spec" for w in weights]


def split_method(method: str) -> tuple[str | None, str | None]:
    """'int8-dynamic+ngram-spec' -> ('int8-dynamic', 'ngram-spec'); 'standard' -> (None, None)."""
    if method == "standard":
        return None, None
    weights = decode = None
    for part in method.split("+"):
        if part in WEIGHT_METHODS and weights is None:
            weights = part
        elif part in DECODE_METHODS and decode is None:
            decode = part
        else:
            raise HoningError(f"unknown fast-variant method {method!r}: one of {', '.join(WEIGHT_METHODS)}, "
                              f"{', '.join(DECODE_METHODS)}, or a weights and a decoding method joined by '+'")
    return weights, decode


def stays_on_cpu(method: str) -> bool:
    """Whether `method`'s weights are CPU kernels (fbgemm int8): serve keeps them off a GPU."""
    return split_method(method)[0] in INT8_METHODS


def apply_method(model: Any, method: str) -> Any:
    """A copy of `model` with `method`'s weights part applied (the model itself when it has none)."""
    weights, _ = split_method(method)
    if weights is None:
        return model
    if weights in INT8_METHODS:  # int8-decode: the same int8 copy; its engine prefills with `model`
        with warnings.catch_warnings():  # torch.ao's eager quantization is deprecated in favour of torchao
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear},
                                                          dtype=torch.qint8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return copy.deepcopy(model).to(dev, torch.bfloat16).eval()


def speculation_for(method: str) -> Any:
    """The engine's speculative-decoding setting for `method` (None without a decoding part)."""
    from honing.engine.speculative import NgramDraft

    _, decode = split_method(method)
    return NgramDraft() if decode == "ngram-spec" else None


def configure_engine(engine: Any, method: str, every_stream: bool = False, standard: Any = None) -> Any:
    """Set `method`'s decoding part on a transformers engine, and for int8-decode its prefill model
    (`standard`: the release's standard weights, the model before apply_method). `every_stream`:
    decode every row speculatively, one by one (how a fast variant's pass@1 is measured: on the
    path it serves); otherwise only a lone stream is (a server's concurrent requests stay batched)."""
    from honing.engine.hf import TransformersEngine

    spec = speculation_for(method)
    weights, _ = split_method(method)
    if weights == "int8-decode":
        if not isinstance(engine, TransformersEngine):
            raise HoningError(f"fast-variant method {method!r} needs honing's transformers engine (serve --engine hf)")
        if standard is None:
            raise HoningError(f"fast-variant method {method!r} needs the standard weights to run prompts with")
        engine.prefill_model = standard.eval()
    elif isinstance(engine, TransformersEngine):
        engine.prefill_model = None  # the decode weights run the prompt too
    if isinstance(engine, TransformersEngine):
        engine.speculative = spec
        engine.speculative_max_rows = 1 << 30 if every_stream else 1
    elif spec is not None:
        raise HoningError(f"fast-variant method {method!r} needs honing's transformers engine (serve --engine hf)")
    return engine


def read_variant(release_dir: Path) -> dict[str, Any]:
    p = Path(release_dir) / VARIANT_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


def apply_variant(model: Any, info: dict[str, Any]) -> Any:
    return apply_method(model, info.get("method", "standard"))


def engine_for(model: Any, tok: Any, method: str = "standard", every_stream: bool = True,
               standard: Any = None) -> Any:
    """An engine decoding `model` (already through apply_method) the `method` way; `standard` is the
    model before apply_method (int8-decode runs prompts with it)."""
    from honing.engine.hf import TransformersEngine
    from honing.serve.model import eos_ids_for

    if torch.cuda.is_available() and model.device.type == "cpu" and not _quantized(model):
        model = model.to("cuda")  # measured where serve would run it
    return configure_engine(TransformersEngine(model, eos_ids_for(tok), tok.pad_token_id), method, every_stream,
                            standard)


def _quantized(model: Any) -> bool:
    return any("quantized" in type(m).__module__ for m in model.modules())


def chat_prompts(tok: Any, tasks: Sequence[Any]) -> list[list[int]]:
    out = []
    for t in tasks:
        ids = tok.apply_chat_template([dict(m) for m in t.prompt], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids))
    return out


def tokens_per_s(engines: dict[str, Any], prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 rounds: int = 2) -> dict[str, float]:
    """Output tokens/s of each engine decoding `prompts` one at a time (one stream, greedy), the
    engines interleaved round by round so machine noise hits all alike; the best round counts."""
    from honing.engine.types import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    best = {k: 0.0 for k in engines}
    for name, eng in engines.items():  # warm-up (first-call allocations, quantized kernels)
        eng.generate([prompts[0]], SamplingParams(max_new_tokens=4, temperature=0.0))
    for _ in range(rounds):
        for name, eng in engines.items():
            toks, t0 = 0, time.perf_counter()
            for p in prompts:
                [[s]] = eng.generate([p], params, seed=0)
                toks += len(s.token_ids)
            best[name] = max(best[name], toks / max(time.perf_counter() - t0, 1e-9))
    return best


def _p1(result: dict) -> tuple[float | None, list[float] | None]:
    o = result.get("overall") or {}
    return o.get("pass@1"), (o.get("ci") or {}).get("pass@1")


def choose_fast(model_dir: Path, suite_name: str, limit: int | None, standard: dict | None,
                speed_prompts: int = 4, rounds: int = 2) -> dict[str, Any]:
    """Measure the options on `model_dir` (speed on a few suite prompts; pass@1 on the suite), keep
    the fastest inside the standard CI, and write variant.json (+ eval-fast.json) there."""
    from honing.eval.runner import evaluate_suite
    from honing.eval.suite import load_suite, suite_tasks
    from honing.models import load_policy

    suite = load_suite(suite_name)
    model, tok = load_policy(str(model_dir))
    engines = {"standard": engine_for(model, tok)}
    weights: dict[str, Any] = {}
    for m in options():
        w, _ = split_method(m)
        if w is not None and w not in weights:
            weights[w] = apply_method(model, w)
        engines[m] = engine_for(weights[w] if w else model, tok, m, standard=model)
    tasks = suite_tasks(suite, limit).tasks
    if not tasks:
        raise HoningError(f"suite {suite_name} has no tasks to measure the fast variant on")
    prompts = chat_prompts(tok, tasks[:speed_prompts])
    budget = min(suite.sampling.max_new_tokens, 64)
    speed = tokens_per_s(engines, prompts, budget, rounds)
    results: dict[str, dict] = {}
    for m, eng in engines.items():
        if m == "standard" and standard is not None:
            results[m] = standard
        else:
            results[m] = evaluate_suite(str(model_dir), suite, limit=limit, engine=eng, tokenizer=tok)
    p1_std, ci_std = _p1(results["standard"])
    cands = []
    for m in engines:
        p1, ci = _p1(results[m])
        inside = m == "standard" or (p1 is not None and ci_std is not None and ci_std[0] <= p1 <= ci_std[1])
        cands.append({"method": m, "tokens_per_s": round(speed[m], 3), "pass@1": p1, "ci": ci, "within_ci": inside})
    ok = [c for c in cands if c["method"] != "standard" and c["within_ci"] and c["tokens_per_s"] > speed["standard"]]
    pick = max(ok, key=lambda c: c["tokens_per_s"]) if ok else cands[0]
    reason = ("fastest option with pass@1 inside the standard CI" if ok
              else "no option was both faster and inside the standard CI: the fast variant runs as standard")
    info = {"variant": "fast", "method": pick["method"], "reason": reason, "candidates": cands,
            "speedup": round(pick["tokens_per_s"] / max(speed["standard"], 1e-9), 3),
            "standard_pass@1": p1_std, "standard_ci": ci_std,
            "measured_on": f"{len(prompts)} suite prompts, greedy, {budget} new tokens, one stream, "
                           f"best of {rounds} interleaved rounds, {torch.get_num_threads()} threads"}
    (model_dir / VARIANT_FILE).write_text(json.dumps(info, indent=1))
    (model_dir / "eval-fast.json").write_text(json.dumps(results[pick["method"]], indent=1, default=str))
    return info
