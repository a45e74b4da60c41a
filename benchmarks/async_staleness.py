"""Asynchronous rollouts: samples/s at staleness 0, 1 and 2, side by side, and where the time goes.

Each configuration is a real `honing train` run (same recipe, same steps). Staleness 0 runs in
one process (the synchronous loop) and also with a worker process (to separate the cost of the
process from the gain of overlap); staleness 1 and 2 generate in a worker process while the
trainer updates. Per step we report generation (in the worker), update, the trainer's wait for
rollouts and the worker's idle time.

    .venv/bin/python benchmarks/async_staleness.py                    # SmolLM2-135M, 6 steps each
    .venv/bin/python benchmarks/async_staleness.py --model tiny-random --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch


def run(model: str, steps: int, staleness: int, workers: str, out: Path, args: argparse.Namespace) -> dict:
    from honing.config import load_config
    from honing.schedule.loop import train

    cfg, _ = load_config("smoke", [
        f"model.name={model}", f"model.bf16_autocast={str(model != 'tiny-random').lower()}",
        f"train.steps={steps}", "sft.steps=0", "eval.heldout_tasks=0", f"tasks.prompts_per_step={args.prompts}",
        f"tasks.samples_per_prompt={args.samples}", f"generation.max_new_tokens={args.tokens}",
        "tasks.sources=[{name: 'gym:basic_arithmetic', params: {min_digits: 1, max_digits: 2}}]",
        "tasks.exclude_heldout_questions=false", "train.learning_rate=1e-5", "train.micro_batch_size=8",
        f"schedule.staleness={staleness}", f"schedule.workers={workers}", "checkpoint.every_steps=0",
        f"schedule.worker_threads={args.worker_threads}",
    ])
    summary = train(cfg, out, show_progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/reward" in r][1:]  # the first step pays start-up
    mean = lambda k: statistics.fmean(r.get(k, 0.0) for r in rows)  # noqa: E731
    samples = args.prompts * args.samples * len(rows)
    return {"samples_per_s": samples / sum(r["time/step_s"] for r in rows),
            "step_s": mean("time/step_s"), "gen_s": mean("time/gen_s"), "update_s": mean("time/update_s"),
            "wait_s": mean("time/wait_s"), "worker_idle_s": mean("worker/idle_s"),
            "staleness": mean("staleness/mean"), "reward": mean("train/reward"), "wall_s": summary["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--worker-threads", type=int, default=0, help="0: half the threads")
    ap.add_argument("--only", default="", help="e.g. '0:inprocess,1:process'")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    configs = [(0, "inprocess"), (0, "process"), (1, "process"), (2, "process")]
    if args.only:
        configs = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.only.split(",")]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s, w in configs:
            res[(s, w)] = run(args.model, args.steps, s, w, Path(tmp) / f"s{s}-{w}", args)
    print(f"\nmodel {args.model}, {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens, "
          f"{args.steps} steps each (first step excluded), {torch.get_num_threads()} threads\n")
    head = f"{'staleness':>9} {'workers':>9} {'samples/s':>9} {'step s':>7} {'gen s':>6} {'update s':>8} " \
           f"{'wait s':>7} {'w. idle s':>9} {'mean stale':>10}"
    print(head)
    print("-" * len(head))
    for (s, w), r in res.items():
        print(f"{s:>9} {w:>9} {r['samples_per_s']:>9.2f} {r['step_s']:>7.2f} {r['gen_s']:>6.2f} {r['update_s']:>8.2f} "
              f"{r['wait_s']:>7.2f} {r['worker_idle_s']:>9.2f} {r['staleness']:>10.2f}")
    base = res.get((0, "inprocess"), {}).get("samples_per_s")
    if base:
        print("\nRATIO " + " ".join(f"staleness{s}_{w}_vs_sync={r['samples_per_s'] / base:.2f}"
                                   for (s, w), r in res.items() if (s, w) != (0, "inprocess")))


if __name__ == "__main__":
    main()
