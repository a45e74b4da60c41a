"""The cad generator's solvability proof (issue 19): for N tasks across every family, level and
prompt style (both splits), the hidden reference program scores 1.0 through the real verifier (warm
`cad` cells), its measured bounding box equals the one the prompt states, and deliberately wrong
programs (off dimensions, a missing feature, a wrong hole count) score < 1 in the expected layer.
It also checks the build tool's stated-feature probes (features.py): the reference meets every
feature its prompt states (no false alarm), and each wrong program's report says it differs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cad_solvability.py --per-cell 4

Needs bwrap and `make setup-cad`. Last line: `SOLVABLE n/N WRONG_CAUGHT m/M FEATURES_CLEAN a/N FEATURES_FLAGGED b/M`.
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
from honing_env_cad.env import inspect_part  # noqa: E402
from honing_env_cad.families import FAMILIES, LEVELS, STYLES  # noqa: E402
from honing_env_cad.grader import boxes, grade_script  # noqa: E402
from honing_env_cad.mutate import MUTATIONS  # noqa: E402
from honing_env_cad.tasks import make_tasks  # noqa: E402


def _stated_ok(task: object, program: str) -> tuple[bool, str]:
    """(whether the build tool's report says the part meets what the prompt states, the report)."""
    b = boxes().build(program)
    if b.infra or b.brep is None:
        raise SystemExit(f"INFRA or no build on {getattr(task, 'id', '?')}: {b.infra or b.error}")
    m, text, ok = inspect_part(boxes(), b.brep, task)
    if m.infra:
        raise SystemExit(f"INFRA {getattr(task, 'id', '?')}: {m.infra}")
    return ok, text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-cell", type=int, default=4, help="tasks per (family, level, style), split alternating")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    t0 = time.perf_counter()
    solved = total = caught = wrong = clean = flagged = 0
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
            ok_f, text = _stated_ok(task, task.hidden["program"])
            clean += ok_f
            if not ok_f:
                failures.append(f"stated-feature false alarm on {task.metadata['structure_key']}: {text}")
            for name, (fn, layer) in MUTATIONS.items():
                bad = fn(task.hidden["program"])
                if bad is None:
                    continue
                w = grade_script(bad, task)
                wrong += 1
                ok_w, text_w = _stated_ok(task, bad)
                flagged += not ok_w
                if ok_w:
                    failures.append(f"{name} not flagged by the build report on {task.metadata['structure_key']}: "
                                    f"{text_w}")
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
    print(f"SOLVABLE {solved}/{total} WRONG_CAUGHT {caught}/{wrong} FEATURES_CLEAN {clean}/{total} "
          f"FEATURES_FLAGGED {flagged}/{wrong}")
    return 0 if solved == total and caught == wrong and clean == total and flagged == wrong else 1


if __name__ == "__main__":
    sys.exit(main())
