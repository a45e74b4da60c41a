"""Where a GRPO step's time goes, and what each of honing's CPU speed-ups buys, side by side.

SmolLM2-135M-Instruct, quickstart's arithmetic prompts, 4 prompts x 8 samples, at most 64 new
tokens, bf16 autocast where the CPU has it. Each comparison runs its two sides alternately
`--reps` times on the same inputs (these machines are noisy: read the ratios, not the seconds):

  sampler     decode with torch.multinomial vs honing's inverse-CDF sampler (both on the bf16 copy)
  weights     decode from the trainer's fp32 module under autocast vs a private bf16 copy
  layout      one update (forward + backward, all 32 sequences) with one padded row per sample
              vs the shared-prompt layout (each prompt once, completions packed behind it)

Prints a table and one line per comparison: `RATIO <name>=<baseline s / honing s>`.

    .venv/bin/python benchmarks/step_parts.py            # ~5 min on 2 cores
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from honing.config import load_config
from honing.engine import SamplingParams, TransformersEngine
from honing.engine import hf as hf_engine
from honing.engine.hf import bf16_supported
from honing.models import load_policy
from honing.rollout.single import prompt_ids
from honing.schedule.loop import build_tasks, seed_everything
from honing.schedule.rollout_side import eos_ids_of
from honing.train.logprobs import completion_logprobs, shared_prompt_logprobs


def multinomial_sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None):  # noqa: ANN201
    """The sampler honing had before: torch.multinomial over the full vocabulary."""
    logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
    tok = torch.multinomial(torch.softmax(logp, dim=-1), 1, generator=gen).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    cfg, _ = load_config("quickstart", [f"generation.max_new_tokens={args.max_new_tokens}"])
    setup = build_tasks(cfg)
    seed_everything(cfg.seed)
    model, tok = load_policy(cfg.model.name, seed=cfg.seed)
    bf16 = bf16_supported("cpu")
    print(f"threads {torch.get_num_threads()}  bf16 {bf16}  4 prompts x 8 samples  max_new_tokens {args.max_new_tokens}")
    tasks = setup.sampler.next(4)
    prompts = [prompt_ids(tok, t) for t in tasks]
    params = SamplingParams(args.max_new_tokens, 1.0, 1.0, 0, 8)
    eos = eos_ids_of(tok)
    shared = TransformersEngine(model, eos, tok.pad_token_id, bf16, 64)                      # autocast
    own = TransformersEngine(model, eos, tok.pad_token_id, bf16, 64,
                             torch.bfloat16 if bf16 else None)                              # bf16 copy
    rows: dict[str, list[tuple[float, float]]] = {"sampler": [], "weights": [], "layout": []}
    fast_sampler = hf_engine.sample_tokens
    samples = None
    for rep in range(args.reps):
        hf_engine.sample_tokens = multinomial_sample
        a = timed(lambda: own.generate(prompts, params, seed=rep))
        hf_engine.sample_tokens = fast_sampler
        b = timed(lambda: own.generate(prompts, params, seed=rep))
        rows["sampler"].append((a, b))
        a = timed(lambda: shared.generate(prompts, params, seed=rep))
        samples = own.generate(prompts, params, seed=rep)
        b = timed(lambda: own.generate(prompts, params, seed=rep))
        rows["weights"].append((a, b))
        print(f"rep {rep + 1}: generation done", flush=True)
    assert samples is not None
    ps = [p for p, g in zip(prompts, samples) for _ in g]
    cs = [s.token_ids for g in samples for s in g]
    train_model = copy.deepcopy(model).train()
    for rep in range(args.reps):
        for name, fn in (("padded", completion_logprobs), ("shared", shared_prompt_logprobs)):
            train_model.zero_grad()

            def step() -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    lp, mask = fn(train_model, ps, cs, tok.pad_token_id, 1.0, cfg.train.logprob_chunk_tokens)
                (lp.float() * mask).sum().backward()

            t = timed(step)
            if name == "padded":
                a = t
            else:
                rows["layout"].append((a, t))
        print(f"rep {rep + 1}: update done", flush=True)
    P = len(prompts[0])
    C = [len(c) for c in cs]
    print(f"\nprompt ~{P} tokens, completions mean {sum(C) / len(C):.0f} max {max(C)}; "
          f"update tokens padded {len(cs) * (max(len(p) for p in ps) + max(C))} vs shared {len(prompts) * P + sum(C)}")
    print(f"{'':10s}{'baseline s':>12s}{'honing s':>12s}{'ratio':>8s}   baseline")
    what = {"sampler": "torch.multinomial", "weights": "fp32 module + autocast", "layout": "padded row per sample"}
    for k, v in rows.items():
        a, b = sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)
        print(f"{k:10s}{a:12.2f}{b:12.2f}{a / b:8.2f}   {what[k]}")
    for k, v in rows.items():
        a, b = sum(x for x, _ in v), sum(y for _, y in v)
        print(f"RATIO {k}={a / b:.2f}")


if __name__ == "__main__":
    main()
