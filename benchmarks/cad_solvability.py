"""The cad generator's solvability proof (issue 19): for N tasks across every family, level and
prompt style (both splits), the hidden reference program scores 1.0 through the real verifier (warm
`cad` cells), its measured bounding box equals the one the prompt states, and deliberately wrong
programs (off dimensions, a missing feature, a wrong hole count) score < 1 in the expected layer.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cad_solvability.py --per-cell 4

Needs bwrap and `make setup-cad`. Last line: `SOLVABLE n/N WRONG_CAUGHT m/M`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "cad"))

from honing.tasks.user import _task_from_dict  # noqa: E402
from honing_env_cad.families import FAMILIES, LEVELS, STYLES  # noqa: E402
from honing_env_cad.grader import boxes, grade_script  # noqa: E402
from honing_env_cad.mutate import MUTATIONS  # noqa: E402
from honing_env_cad.tasks import make_tasks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-cell", type=int, default=4, help="tasks per (family, level, style), split alternating")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    t0 = time.perf_counter()
    solved = total = caught = wrong = 0
    by_cell: Counter = Counter()
    failures: list[str] = []
    for fam, level, style in itertools.product(FAMILIES, LEVELS, STYLES):
        for k in range(args.per_cell):
            split = ("train", "heldout")[k % 2]
            try:
                gen = make_tasks(split, args.seed + k, families=[fam], levels=[level], styles=[style])
            except Exception:  # noqa: BLE001 - e.g. no held-out structure for this cell
                gen = make_tasks("train", args.seed + k, families=[fam], levels=[level], styles=[style])
            task = _task_from_dict(next(gen), "cad", 0, "env:cad")
            v = grade_script(task.hidden["program"], task)
            total += 1
            if v.infra_error:
                print(f"INFRA {task.id}: {v.details}")
                return 2
            ok = v.passed and v.score == 1.0
            solved += ok
            by_cell[(fam, level)] += ok
            if not ok:
                failures.append(f"{fam} L{level} {style} {task.metadata['structure_key']}: {v.score:.3f} {v.details}")
            for name, (fn, layer) in MUTATIONS.items():
                bad = fn(task.hidden["program"])
                if bad is None:
                    continue
                w = grade_script(bad, task)
                wrong += 1
                hit = w.score < 1.0 and w.components.get(layer, 1.0) < 1.0
                caught += hit
                if not hit:
                    failures.append(f"{name} not caught in {layer} on {task.metadata['structure_key']}: "
                                    f"{w.score:.3f} {dict(w.components)}")
            print(f"{fam:9s} L{level} {style:6s} {split:7s} ref {v.score:.3f} ({v.cost_s:.2f}s)", flush=True)
    boxes().close()
    for f in failures:
        print("FAIL", f)
    print(f"per family/level: {dict(by_cell)}")
    print(f"{time.perf_counter() - t0:.0f}s")
    print(f"SOLVABLE {solved}/{total} WRONG_CAUGHT {caught}/{wrong}")
    return 0 if solved == total and caught == wrong else 1


if __name__ == "__main__":
    sys.exit(main())
