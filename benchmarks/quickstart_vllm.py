"""Does the quickstart recipe learn the same with the vLLM engine as with honing's hf engine?

    .venv/bin/python benchmarks/quickstart_vllm.py [--steps 40] [--out /tmp/qs-vllm] [-- overrides...]

Runs `honing train` on the quickstart recipe twice, one after the other (never at once: two
torch processes on 2 cores slow each other down): with `generation.backend=hf` from `.venv` and
with `generation.backend=vllm` from `.venv-vllm` (`make setup-vllm`). Prints held-out pass@1
before and after for both with 95% Wilson intervals, the speed of each, and ends with
`WITHIN_CI vllm_after_in_hf_ci=<yes|no>` and `RATIO vllm_vs_hf_samples_per_s=<x>`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run(backend: str, venv: str, out: Path, steps: int, extra: list[str]) -> dict:
    honing = ROOT / venv / "bin" / "honing"
    if not honing.exists():
        raise SystemExit(f"quickstart_vllm: {honing} is missing (make setup{'-vllm' if 'vllm' in venv else ''})")
    cmd = [str(honing), "train", "--out", str(out / backend), "--quiet", f"generation.backend={backend}",
           f"train.steps={steps}", *extra]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")},
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"quickstart_vllm: the {backend} run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads((out / backend / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("/tmp/qs-vllm"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    res = {b: run(b, v, args.out, args.steps, args.overrides) for b, v in (("hf", ".venv"), ("vllm", ".venv-vllm"))}
    print(f"\n{'engine':<8} {'before':>8} {'after':>8} {'after 95% CI':>16} {'samples/s':>10} {'wall s':>8}")
    for b, s in res.items():
        n = s["heldout_after"]["n_tasks"]
        lo, hi = wilson(s["heldout_after"]["pass@1"], n)
        print(f"{b:<8} {s['heldout_before']['pass@1']:>8.3f} {s['heldout_after']['pass@1']:>8.3f} "
              f"{f'[{lo:.3f}, {hi:.3f}]':>16} {s['samples_per_s']:>10.2f} {s['wall_s']:>8.0f}")
    lo, hi = wilson(res["hf"]["heldout_after"]["pass@1"], res["hf"]["heldout_after"]["n_tasks"])
    inside = lo <= res["vllm"]["heldout_after"]["pass@1"] <= hi
    print(f"\nWITHIN_CI vllm_after_in_hf_ci={'yes' if inside else 'no'}")
    print(f"RATIO vllm_vs_hf_samples_per_s={res['vllm']['samples_per_s'] / max(res['hf']['samples_per_s'], 1e-9):.2f}")


if __name__ == "__main__":
    sys.exit(main())
