"""hf vs vllm engines side by side on SmolLM2-135M (issue 16). Run from .venv-vllm:

    .venv-vllm/bin/python benchmarks/engine_vs.py [--prompts 4 --n 8 --tokens 64 --episodes 4 --turns 3]

(a) A single-turn GRPO batch: --prompts gsm-style prompts x --n samples x --tokens new tokens
    (ignore_eos is not used: both engines stop at EOS; tokens/s counts the tokens generated).
    Each engine runs it once to warm up, then --reps times; the best rep counts.
(b) Multi-turn repair episodes (--episodes level-1 tasks, --turns turns, the model as policy):
    prompt tokens sent per turn (the whole history, every turn) and the tokens that had to be
    prefilled. The hf engine prefills every prompt token (no cache across calls); vLLM's prefix
    cache serves the part of the history it already holds (`num_cached_tokens`).

Prints `RATIO vllm_vs_hf_tokens_per_s=<x>` and `RATIO prefill_tokens_vllm_vs_hf=<y>` (vLLM's
prefilled tokens over hf's, all turns of (b)), plus the per-turn table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from honing.engine import SamplingParams


class Counting:
    """Wraps an engine; records per generate call the prompt tokens and (vLLM) the cached ones."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.version, self.calls = inner, 0, []

    def generate(self, prompts: Any, params: Any, seed: int | None = None) -> Any:
        st = getattr(self.inner, "stats", None)
        cached0 = st["cached_prompt_tokens"] if st else 0
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params, seed)
        cached = (st["cached_prompt_tokens"] - cached0) if st else 0
        self.calls.append({"prompt": sum(len(p) for p in prompts), "cached": cached,
                           "gen": sum(len(s.token_ids) for g in out for s in g), "s": time.perf_counter() - t0})
        return out

    def load_weights(self, state: Any, version: int) -> None:
        self.inner.load_weights(state, version)


def grpo_batch(engine: Any, tok: Any, a: argparse.Namespace) -> dict:
    qs = ["What is 17 + 25? Think step by step.", "A box has 3 red and 5 blue balls. How many balls?",
          "Compute 12 * 7 and explain.", "If x + 4 = 10, what is x?", "What is 100 - 37?",
          "Name three prime numbers above 10.", "Sum the numbers 1 to 10.", "What is half of 86?"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in (qs * 4)[: a.prompts]]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    sp = SamplingParams(max_new_tokens=a.tokens, temperature=1.0, n=a.n)
    engine.generate(prompts, sp, seed=0)  # warm-up
    best = None
    for r in range(a.reps):
        t0 = time.perf_counter()
        out = engine.generate(prompts, sp, seed=r + 1)
        dt = time.perf_counter() - t0
        toks = sum(len(s.token_ids) for g in out for s in g)
        if best is None or toks / dt > best["tok_s"]:
            best = {"tok_s": toks / dt, "tokens": toks, "s": dt}
    return best  # type: ignore[return-value]


def repair_episodes(engine: Any, tok: Any, a: argparse.Namespace) -> list[dict]:
    from honing.rollout.env import make_environment
    from honing.rollout.multiturn import ChatFormat, Episode, MultiTurnConfig, run_episodes
    from honing.sandbox import Sandbox
    from honing.tasks.repair import RepairSource

    it = RepairSource({"levels": [1]}).tasks("train", 0)
    tasks = [next(it) for _ in range(a.episodes)]
    sandbox = Sandbox("bwrap")
    cfg = MultiTurnConfig(max_turns=a.turns)
    fmt = ChatFormat(tok)
    counting = Counting(engine)
    eps = []
    try:
        for t in tasks:
            eps.append(Episode(t, sandbox.open(cfg.profile), make_environment(t), fmt, cfg))
        run_episodes(counting, tok, eps, SamplingParams(max_new_tokens=a.turn_tokens, temperature=1.0), cfg, seed=0,
                     max_workers=sandbox.max_concurrency)
    finally:
        for e in eps:
            e.session.close()
        if hasattr(sandbox, "close"):
            sandbox.close()
    return counting.calls


def build(kind: str, model_name: str) -> tuple[Any, Any]:
    from honing.rollout.show import model_engine

    return model_engine(model_name, 0, kind)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--engines", default="hf,vllm")
    a = ap.parse_args()
    print(f"engine_vs: {a.model}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
          file=sys.stderr)
    res: dict[str, dict] = {}
    for kind in a.engines.split(","):
        t0 = time.perf_counter()
        engine, tok = build(kind, a.model)
        start = time.perf_counter() - t0
        b = grpo_batch(engine, tok, a)
        calls = repair_episodes(engine, tok, a) if a.episodes else []
        res[kind] = {"start_s": start, **b, "turns": calls}
        print(f"{kind:5s} start {start:5.1f} s  GRPO batch {a.prompts}x{a.n}x{a.tokens}: {b['tokens']} tokens in "
              f"{b['s']:.2f} s = {b['tok_s']:.0f} tok/s")
        for i, c in enumerate(calls):
            pre = c["prompt"] - c["cached"]
            print(f"      turn {i + 1}: prompt tokens {c['prompt']:6d}  cached {c['cached']:6d}  prefilled {pre:6d}  "
                  f"generated {c['gen']:5d}  {c['s']:.2f} s")
        if hasattr(engine, "close"):
            engine.close()
    if "hf" in res and "vllm" in res:
        print(f"RATIO vllm_vs_hf_tokens_per_s={res['vllm']['tok_s'] / res['hf']['tok_s']:.2f}")
        hf_pre = sum(c["prompt"] for c in res["hf"]["turns"])  # hf re-prefills the whole history
        vl_pre = sum(c["prompt"] - c["cached"] for c in res["vllm"]["turns"])
        if hf_pre:
            print(f"RATIO prefill_tokens_vllm_vs_hf={vl_pre / hf_pre:.3f}")
            later = [c for c in res["vllm"]["turns"][1:]]
            if later:
                print(f"RATIO prefill_tokens_after_turn1_vllm_vs_hf="
                      f"{sum(c['prompt'] - c['cached'] for c in later) / max(sum(c['prompt'] for c in res['hf']['turns'][1:]), 1):.3f}")


if __name__ == "__main__":
    main()
