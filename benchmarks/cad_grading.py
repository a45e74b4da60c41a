"""cad grading throughput (issue 19): scripts graded per second with warm `cad` cells (a zygote per
cell with build123d preloaded, one fork per job) vs cold boxes (a fresh bwrap box per job, paying
build123d's ~5 s import twice per script: the build box and the measuring box).

Each grading is the real verifier path: the candidate's box (BUILD) and the measuring box
(MEASURE: BREP read back, reference from the shared cache, IoU by OCCT booleans). The same scripts
(reference programs of tasks across all families and levels) go through both modes with `--workers`
concurrent graders and the same pool size; the reference cache is filled beforehand, outside the
timing, for both. Warm pool start-up is timed separately (paid once per process).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cad_grading.py --warm-scripts 40 --cold-scripts 6

Last line: `RATIO warm_vs_cold=<x>` (scripts/s warm over scripts/s cold).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "cad"))

from honing.tasks.user import _task_from_dict  # noqa: E402
from honing_env_cad.grader import CadBoxes, grade_script  # noqa: E402
from honing_env_cad.tasks import make_tasks  # noqa: E402


def run(boxes: CadBoxes, tasks: list, workers: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        verdicts = list(ex.map(lambda t: grade_script(t.hidden["program"], t, runner=boxes), tasks))
    wall = time.perf_counter() - t0
    bad = [v.details for v in verdicts if not v.passed]
    if bad:
        raise SystemExit(f"a reference did not pass: {bad[0]}")
    return len(tasks) / wall, [v.cost_s for v in verdicts]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm-scripts", type=int, default=40)
    ap.add_argument("--cold-scripts", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2, help="concurrent graders = cells = cold boxes at once")
    args = ap.parse_args()
    tasks = [_task_from_dict(t, "cad", 0, "env:cad")
             for t in itertools.islice(make_tasks("train", 11), max(args.warm_scripts, args.cold_scripts))]
    t0 = time.perf_counter()
    warm = CadBoxes(mode="warm", cells=args.workers)
    run(warm, tasks[:1], 1)  # starts the pool
    startup = time.perf_counter() - t0
    for t in tasks:  # fill the reference cache (shared by both modes, outside the timing)
        grade_script(t.hidden["program"], t, runner=warm)
    cold = CadBoxes(mode="cold", cells=args.workers)
    cold._refs = warm._refs
    w1, wl1 = run(warm, tasks[:args.warm_scripts], args.workers)
    c, cl = run(cold, tasks[:args.cold_scripts], args.workers)
    w2, wl2 = run(warm, tasks[:args.warm_scripts], args.workers)
    warm.close()
    cold.close()
    w = (w1 + w2) / 2
    print(f"warm pool start-up ({args.workers} cells, build123d preloaded): {startup:.1f}s")
    print(f"warm: {w:.2f} scripts/s (rounds {w1:.2f}, {w2:.2f}), per-script latency p50 "
          f"{statistics.median(wl1 + wl2):.2f}s over {2 * args.warm_scripts} gradings")
    print(f"cold: {c:.3f} scripts/s, per-script latency p50 {statistics.median(cl):.2f}s over {args.cold_scripts} gradings")
    print(f"RATIO warm_vs_cold={w / c:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
