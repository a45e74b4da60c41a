"""The fast variant of a release: options measured side by side, the fastest one kept whose held-out
pass@1 stays inside the standard variant's 95% CI.

Options measured now:

- `int8-dynamic`: post-training dynamic quantization of every nn.Linear (torch.ao, fbgemm on x86
  CPUs): int8 weights, activations quantized per call. Decoding a 135M model on a CPU reads its
  weights once per token, so a quarter of the bytes is where the speed comes from.
- `bf16`: a bf16 copy of the weights, only where bf16 matmuls are native (a GPU, or a CPU with
  AMX/AVX512-BF16); emulated bf16 is slower than fp32, so it is not tried elsewhere.

Not covered: speculative decoding. A truncated-layer draft (SmolLM2's first 6 of 30 layers, no
training) through transformers' assisted generation measured 0.5 tokens/s against 1.5-2.4 for plain
greedy generate in the same script (a loaded 2-core machine): an untrained early-exit draft is
rejected too often to pay for itself, so it is not an option here. GPU int8 kernels neither.
The variant is a recipe over the same HF weights (variant.json): `honing serve` applies it at
load time, which takes about a second; the weights on disk stay the standard, loadable ones.
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


def options() -> list[str]:
    from honing.engine.hf import bf16_supported

    if torch.cuda.is_available():  # serve decodes on the GPU there: bf16 is the option, fbgemm int8 is CPU-only
        return ["bf16"]
    out = ["int8-dynamic"]
    if bf16_supported("cpu"):
        out.append("bf16")
    return out


def apply_method(model: Any, method: str) -> Any:
    """A copy of `model` run the `method` way ('standard' returns the model itself)."""
    if method == "standard":
        return model
    if method == "int8-dynamic":
        with warnings.catch_warnings():  # torch.ao's eager quantization is deprecated in favour of torchao
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear},
                                                          dtype=torch.qint8)
    if method == "bf16":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        return copy.deepcopy(model).to(dev, torch.bfloat16).eval()
    raise HoningError(f"unknown fast-variant method {method!r} (int8-dynamic, bf16)")


def read_variant(release_dir: Path) -> dict[str, Any]:
    p = Path(release_dir) / VARIANT_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


def apply_variant(model: Any, info: dict[str, Any]) -> Any:
    return apply_method(model, info.get("method", "standard"))


def engine_for(model: Any, tok: Any) -> Any:
    from honing.engine.hf import TransformersEngine
    from honing.serve.model import eos_ids_for

    if torch.cuda.is_available() and model.device.type == "cpu" and not _quantized(model):
        model = model.to("cuda")  # measured where serve would run it
    return TransformersEngine(model, eos_ids_for(tok), tok.pad_token_id)


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
    for m in options():
        engines[m] = engine_for(apply_method(model, m), tok)
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
