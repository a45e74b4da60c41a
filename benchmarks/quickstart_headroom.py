"""How much room RL has on a recipe's held-out tasks: greedy pass@1, and pass@1 / pass@k of
k samples at the training temperature (unbiased estimators for k = n). Usage:

    .venv/bin/python benchmarks/quickstart_headroom.py [--config quickstart] [--k 8] [overrides...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from honing.config import load_config
from honing.engine import SamplingParams, TransformersEngine
from honing.eval import evaluate
from honing.models import load_policy
from honing.rollout import rollout
from honing.schedule.loop import build_tasks
from honing.verify import grade


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="quickstart")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg, _ = load_config(args.config, args.overrides)
    setup = build_tasks(cfg)
    model, tok = load_policy(cfg.model.name, seed=cfg.seed)
    engine = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, cfg.model.bf16_autocast,
                                cfg.generation.max_batch_size)
    g = cfg.generation
    t0 = time.time()
    greedy = evaluate(engine, tok, setup.heldout, SamplingParams(g.max_new_tokens, 0.0), setup.ctx)
    trajs = rollout(engine, tok, setup.heldout, SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k,
                                                               args.k), seed=1)
    ok = np.array([grade(setup.heldout[t.group], t, setup.ctx).passed for t in trajs]).reshape(-1, args.k)
    print(f"held-out tasks {len(setup.heldout)}  ({time.time() - t0:.0f} s)")
    print(f"greedy pass@1            {greedy['pass@1']:.3f}")
    print(f"T={g.temperature} pass@1           {ok.mean():.3f}")
    print(f"T={g.temperature} pass@{args.k}           {ok.any(axis=1).mean():.3f}")


if __name__ == "__main__":
    main()
