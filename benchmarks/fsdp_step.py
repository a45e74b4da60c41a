"""One PolicyTrainer.step on one process vs on N FSDP2 ranks (gloo, this machine), side by side.

    ../shared/tools/alone .venv/bin/python benchmarks/fsdp_step.py [--nproc 2] [--hidden 256] [--layers 4]

A random Llama (the tiny tokenizer's vocabulary, `--hidden` / `--layers`) and a synthetic batch
(`--groups` x `--group-size` completions of `--completion` tokens after `--prompt` prompt tokens).
Reports the median step time of one process with N threads, one process with 1 thread, and N
ranks with 1 thread each, plus the full-state gather (the weight push) of the N-rank run, and the
ratios. Run it alone: on 2 cores a second job beside it makes the figures meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def build(args: argparse.Namespace):  # noqa: ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    from honing.models import build_tiny_random

    _, tok = build_tiny_random(seed=0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=3 * args.hidden,
                      max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), tok


def batch(args: argparse.Namespace, vocab: int) -> list:
    from honing.rollout.types import Trajectory

    g = torch.Generator().manual_seed(1)
    out = []
    for grp in range(args.groups):
        prompt = tuple(torch.randint(5, vocab, (args.prompt,), generator=g).tolist())
        for i in range(args.group_size):
            ids = tuple(torch.randint(5, vocab, (args.completion,), generator=g).tolist())
            out.append(Trajectory(task_id=f"t{grp}", domain="bench", prompt_ids=prompt, completion_ids=ids,
                                  logprobs=(-1.0,) * len(ids), completion_text="", finish_reason="length",
                                  policy_version=0, group=grp, advantage=(i % 3) - 1.0 + 0.1, reward=0.0))
    return out


def trainer(model, tok, distributed: bool):  # noqa: ANN001, ANN201
    from honing.config import LoraConfig, TrainConfig
    from honing.train.trainer import PolicyTrainer

    cfg = TrainConfig(micro_batch_size=8, learning_rate=1e-4)
    return PolicyTrainer(model, tok.pad_token_id, cfg, LoraConfig(), bf16_autocast=False, temperature=1.0,
                         distributed=distributed)


def timed_steps(t, trajs: list, steps: int, gather=None) -> tuple[list[float], list[float]]:  # noqa: ANN001
    step_s, gather_s = [], []
    for _ in range(steps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        t.step(trajs)
        step_s.append(time.perf_counter() - t0)
        if gather is not None:
            t0 = time.perf_counter()
            gather()
            gather_s.append(time.perf_counter() - t0)
    return step_s[1:], gather_s[1:]


def rank_main(args: argparse.Namespace) -> None:
    from honing.train import distributed as dp

    torch.set_num_threads(1)
    dp.init_from_env(600)
    model, tok = build(args)
    t = trainer(model, tok, distributed=True)
    step_s, gather_s = timed_steps(t, batch(args, len(tok)), args.steps, lambda: dp.full_state_dict(t.dist.root))
    if dp.rank() == 0:
        Path(args.out).write_text(json.dumps({"step_s": step_s, "gather_s": gather_s}))
    dp.teardown()


def single(args: argparse.Namespace, threads: int) -> list[float]:
    torch.set_num_threads(threads)
    model, tok = build(args)
    return timed_steps(trainer(model, tok, distributed=False), batch(args, len(tok)), args.steps)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return rank_main(args)
    med = statistics.median
    one_n = single(args, args.nproc)
    one_1 = single(args, 1)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ranks.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               __file__, "--rank", "--out", str(out), *sys.argv[1:]]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = json.loads(out.read_text())
    n_params = sum(p.numel() for p in build(args)[0].parameters())
    print(f"model {n_params / 1e6:.1f}M params; batch {args.groups * args.group_size} x "
          f"({args.prompt} + {args.completion}) tokens; median of {args.steps} steps")
    print(f"1 process, {args.nproc} threads   {med(one_n):.3f} s/step")
    print(f"1 process, 1 thread     {med(one_1):.3f} s/step")
    print(f"{args.nproc} ranks x 1 thread      {med(ranks['step_s']):.3f} s/step  "
          f"(+ full-state gather {med(ranks['gather_s']) * 1000:.0f} ms)")
    print(f"ratio {args.nproc} ranks / 1 process {args.nproc} threads: {med(ranks['step_s']) / med(one_n):.2f}; "
          f"{args.nproc} ranks / 1 thread: {med(ranks['step_s']) / med(one_1):.2f}")


if __name__ == "__main__":
    main()
