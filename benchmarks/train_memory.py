"""Host memory of RL updates on long multi-turn episodes: what the trainer's memory settings buy.

Each configuration runs in its own process (peaks must not mix) on the same batches: `--steps`
updates of two episodes each, a shared 600-token prompt and completions of random length
(`--min-len`..`--max-len`, a fixed seed, the lengths of repair episodes), 1 in 2 tokens of every
200-token stretch a loss token as with tool observations. Per configuration: the largest per-update
peak (train/peak_rss_mb), the RSS after the last update, and the mean update time.

  none     : activations kept, 4096-token LM-head chunks, freed memory left with the allocator
  trim     : the same, with the trainer's malloc_trim after each update (the default since it exists)
  ckpt     : trim + train.gradient_checkpointing
  ckpt1024 : trim + checkpointing + train.logprob_chunk_tokens=1024 (configs/repair.yaml)

    ../shared/tools/alone env OMP_NUM_THREADS=2 .venv/bin/python benchmarks/train_memory.py [--steps 8]

Ends with `RATIO rss_after_trim_vs_none=<x> peak_ckpt1024_vs_trim=<y>` (lower is better for both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

CONFIGS = {
    "none": {"trim": False, "gradient_checkpointing": False, "logprob_chunk_tokens": 4096},
    "trim": {"trim": True, "gradient_checkpointing": False, "logprob_chunk_tokens": 4096},
    "ckpt": {"trim": True, "gradient_checkpointing": True, "logprob_chunk_tokens": 4096},
    "ckpt1024": {"trim": True, "gradient_checkpointing": True, "logprob_chunk_tokens": 1024},
}


def lengths(args: argparse.Namespace) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randrange(args.min_len, args.max_len) for _ in range(args.steps)]


def child(name: str, args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    from honing.config import LoraConfig, TrainConfig
    from honing.models import load_policy
    from honing.rollout.types import Trajectory
    from honing.train import memory, trainer as trainer_mod
    from honing.train.trainer import PolicyTrainer

    c = CONFIGS[name]
    if not c["trim"]:  # the allocator keeps what it was given back
        trainer_mod.memory.release_free_memory = lambda: False  # type: ignore[attr-defined]
    model, tok = load_policy(args.model)
    cfg = TrainConfig(learning_rate=1e-5, micro_batch_size=2, gradient_checkpointing=c["gradient_checkpointing"],
                      logprob_chunk_tokens=c["logprob_chunk_tokens"])
    tr = PolicyTrainer(model, tok.pad_token_id, cfg, LoraConfig(), True, 1.0)
    rng = random.Random(args.seed + 1)
    vocab = min(model.config.vocab_size, 40000)
    prompt = tuple(rng.randrange(3, vocab) for _ in range(600))
    peaks, times = [], []
    for L in lengths(args):
        trajs = [Trajectory(task_id="t", domain="d", prompt_ids=prompt,
                            completion_ids=tuple(rng.randrange(3, vocab) for _ in range(L)), logprobs=(-3.0,) * L,
                            completion_text="", finish_reason="stop", policy_version=0, group=0,
                            loss_mask=tuple(1 if (j // 200) % 2 == 0 else 0 for j in range(L)),
                            advantage=1.0 if i % 2 else -1.0) for i in range(2)]
        t = time.perf_counter()
        m = tr.step(trajs)
        times.append(time.perf_counter() - t)
        peaks.append(m["peak_rss_mb"])
    return {"peak_mb": max(peaks), "rss_after_mb": memory.rss_mb(), "update_s": sum(times) / len(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=300)
    ap.add_argument("--max-len", type=int, default=2500)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args)), flush=True)
        return
    print(f"{args.model}: {args.steps} updates of 2 episodes, completion lengths {lengths(args)} (+600 prompt)")
    res = {}
    for name in args.configs.split(","):
        cmd = [sys.executable, __file__, "--child", name] + [a for a in sys.argv[1:] if not a.startswith("--configs")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            sys.exit(f"{name}: the child failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
        res[name] = json.loads(line[len("RESULT "):])
        r = res[name]
        print(f"{name:9s} peak {r['peak_mb'] / 1024:5.2f} GB  RSS after {r['rss_after_mb'] / 1024:5.2f} GB  "
              f"update {r['update_s']:5.1f} s", flush=True)
    if "none" in res and "trim" in res and "ckpt1024" in res:
        print(f"\nRATIO rss_after_trim_vs_none={res['trim']['rss_after_mb'] / res['none']['rss_after_mb']:.2f} "
              f"peak_ckpt1024_vs_trim={res['ckpt1024']['peak_mb'] / res['trim']['peak_mb']:.2f}")


if __name__ == "__main__":
    main()
