"""Per-step learning ablations of honing's RL step, paired over seeds (issue 18's TRL parity work).

Runs `benchmarks/vs_trl.py --skip-trl` once per (seed, variant), each in its own process so thread
settings and allocator state start clean, on the same tasks in the same order per seed. Every
variant is a list of honing config overrides; the first is the baseline. Prints, per variant, the
held-out reward (48 tasks, greedy) and second-half train reward per seed, and the difference from the
baseline with a 95% CI from a cluster bootstrap (seeds resampled, then the held-out tasks within
each seed), so the interval carries both the seed-to-seed and the task-to-task noise.

    .venv/bin/python benchmarks/parity_ablation.py --seeds 0 1 2 3 4 --steps 30 \\
        --variant engine=train.recompute_old_logprobs=false --variant recompute=train.recompute_old_logprobs=true --trl

`--trl` adds TRL's GRPOTrainer alone per seed (`vs_trl.py --skip-honing`: the same tasks, order and
hyperparameters) and prints each variant's held-out difference from TRL with the same CI, and its
samples/s ratio to TRL's.

A result's JSON per run lands in --out (default runs/parity-ablation/), and a rerun skips the runs
it already has, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TRL = "trl"  # the variant name that runs TRL's GRPOTrainer instead of honing (`--trl`)


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, rest = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=override[,override...] (NAME= for the defaults)")
    return name, [o for o in rest.split(",") if o]


def cluster_bootstrap(diffs: list[np.ndarray], n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the per-seed mean differences, and a 95% CI resampling seeds, then tasks within each."""
    rng = np.random.default_rng(seed)
    point = float(np.mean([d.mean() for d in diffs]))
    means = np.empty(n_boot)
    for b in range(n_boot):
        picks = rng.integers(0, len(diffs), size=len(diffs))
        means[b] = np.mean([diffs[i][rng.integers(0, diffs[i].size, size=diffs[i].size)].mean() for i in picks])
    return point, float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def run_one(out: Path, seed: int, name: str, overrides: list[str], args: argparse.Namespace) -> dict:
    """One vs_trl.py run alone: honing with `overrides`, or TRL (--skip-honing) for the variant named `trl`."""
    path = out / f"seed{seed}-{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    alone = "--skip-honing" if name == TRL else "--skip-trl"
    cmd = [sys.executable, str(HERE / "vs_trl.py"), alone, "--steps", str(args.steps), "--heldout", str(args.heldout),
           "--json", str(path), f"seed={seed}", *args.common, *overrides]
    print(f"[{time.strftime('%H:%M:%S')}] seed {seed} {name}: {' '.join(cmd[2:])}", flush=True)
    t0 = time.perf_counter()
    with open(out / f"seed{seed}-{name}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not path.exists():
        raise SystemExit(f"seed {seed} {name} failed (exit {rc}); see {out / f'seed{seed}-{name}.log'}")
    res = json.loads(path.read_text())
    print(f"    held-out {res['heldout_after']:.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variant", action="append", required=True, help="NAME=override,override (first: baseline)")
    ap.add_argument("--heldout", type=int, default=48, help="held-out tasks (vs_trl.py's default)")
    ap.add_argument("--common", nargs="*", default=[], help="overrides every run gets")
    ap.add_argument("--out", default="runs/parity-ablation")
    ap.add_argument("--trl", action="store_true",
                    help="also run TRL alone per seed (vs_trl.py --skip-honing, same tasks and hyperparameters) "
                         "and compare each variant with it")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    if any(n == TRL for n, _ in variants):
        raise SystemExit(f"--variant {TRL}=...: the name {TRL!r} is kept for --trl")
    if args.trl:
        variants.append((TRL, []))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    results = {(s, n): run_one(out, s, n, o, args) for s in args.seeds for n, o in variants}

    base = variants[0][0]
    print(f"\nheld-out reward after {args.steps} steps (base model "
          f"{np.mean([results[(s, base)]['heldout_before'] for s in args.seeds]):.3f}); train reward, 2nd half")
    print(f"{'variant':24s}" + "".join(f"{'seed ' + str(s):>14s}" for s in args.seeds) + f"{'mean':>9s}   vs {base} [95% CI]")
    cis = {}
    for name, _ in variants:
        cells, diffs = [], []
        for s in args.seeds:
            r = results[(s, name)]
            tr = r["train_rewards"]
            cells.append(f"{r['heldout_after']:.3f}/{np.mean(tr[len(tr) // 2:]):.3f}")
            diffs.append(paired_diffs(results[(s, base)], r))
        mean = np.mean([results[(s, name)]["heldout_after"] for s in args.seeds])
        cis[name] = cluster_bootstrap(diffs)
        cmp = "" if name == base else "   {:+.3f} [{:+.3f}, {:+.3f}]".format(*cis[name])
        print(f"{name:24s}" + "".join(f"{c:>14s}" for c in cells) + f"{mean:9.3f}{cmp}")
    for name, _ in variants[1:]:
        if name == TRL:
            continue
        d, lo, hi = cis[name]
        print(f"RATIO {name}_minus_{base}_heldout={d:+.3f} ci=[{lo:+.3f},{hi:+.3f}] seeds={len(args.seeds)}")
    if args.trl:
        print(f"\nagainst TRL (held-out difference, 95% CI; samples/s ratio, mean of per-seed ratios)")
        for name, _ in variants[:-1]:
            diffs = [paired_diffs(results[(s, TRL)], results[(s, name)]) for s in args.seeds]
            d, lo, hi = cluster_bootstrap(diffs)
            speed = np.mean([results[(s, name)]["samples_per_s"] / results[(s, TRL)]["samples_per_s"] for s in args.seeds])
            print(f"RATIO {name}_minus_trl_heldout={d:+.3f} ci=[{lo:+.3f},{hi:+.3f}] "
                  f"{name}_vs_trl_samples_per_s={speed:.2f} seeds={len(args.seeds)}")


def paired_diffs(a: dict, b: dict) -> np.ndarray:
    """Per held-out task, b's reward minus a's (both runs of one seed grade the same tasks)."""
    ta, tb = a["per_task_reward"]["after"], b["per_task_reward"]["after"]
    if ta.keys() != tb.keys():
        raise SystemExit("two runs of one seed graded different held-out tasks; rerun them with the same --heldout")
    return np.array([tb[t] - ta[t] for t in ta])

if __name__ == "__main__":
    main()
