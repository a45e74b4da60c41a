"""The `cad` task source: procedural, seedable, unlimited parts of five families at three levels.

Split: every (family, level) has a finite list of *structures* (families.py); they are ranked by a
hash and about 20% of each list (at least one, never all, none when the list has one entry) is
held out. A task's split is its structure's: no held-out structure ever appears in training, in
either prompt style, with any dimensions.

Params: families (list, default all), levels (default 1..3), styles ("exact", "intent"),
multi_turn (default True: build/render/submit tools; False: one reply with a ```python block),
tolerance_mm (stated in the prompt; default 0.1), max_turns (default 6), correction_demos (default 0:
the fraction of tasks whose reference episode, an SFT demonstration, first builds a deliberately
wrong program, shown but not trained on, then corrects it from the build report; env.py).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from functools import lru_cache
from typing import Any, Iterator, Sequence

from honing.errors import TaskError

from honing_env_cad.families import FAMILIES, LEVELS, STYLES

HELDOUT_FRACTION = 0.2
TOOL_NAMES = ("build", "render", "submit")
CONVENTION = ("Write a build123d script (Python; start with `from build123d import *`) that models the part below "
              "and assigns the finished part, one solid, to a variable named `result`. Units are millimetres; "
              "dimensions must be within +-{tol} mm.")


def structure_key(family: str, level: int, structure: tuple) -> str:
    return f"{family}/L{level}/" + ",".join(str(x) for x in structure)


@lru_cache(maxsize=None)
def split_structures(family: str, level: int) -> dict[str, tuple[tuple, ...]]:
    """{'train': (...), 'heldout': (...)} for one family and level (see the module docstring)."""
    structs = FAMILIES[family][0](level)
    ranked = sorted(structs, key=lambda s: hashlib.sha256(structure_key(family, level, s).encode()).hexdigest())
    n_held = 0 if len(ranked) < 2 else max(1, round(HELDOUT_FRACTION * len(ranked)))
    return {"heldout": tuple(ranked[:n_held]), "train": tuple(ranked[n_held:])}


def _check(families: Sequence[str], levels: Sequence[int], styles: Sequence[str], tolerance_mm: float) -> None:
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise TaskError(f"cad: unknown family {unknown[0] if unknown else '(none given)'!r} "
                        f"(families: {', '.join(FAMILIES)})")
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise TaskError(f"cad: unknown level {bad[0] if bad else '(none given)'!r} (levels: 1, 2, 3)")
    bad_s = [s for s in styles if s not in STYLES]
    if bad_s or not styles:
        raise TaskError(f"cad: unknown prompt style {bad_s[0] if bad_s else '(none given)'!r} (styles: exact, intent)")
    if not 0.001 <= float(tolerance_mm) <= 5:
        raise TaskError(f"cad: tolerance_mm must be in [0.001, 5], got {tolerance_mm}")


def make_tasks(split: str, seed: int, families: Sequence[str] = tuple(FAMILIES), levels: Sequence[int] = LEVELS,
               styles: Sequence[str] = STYLES, multi_turn: bool = True, tolerance_mm: float = 0.1,
               max_turns: int = 6, correction_demos: float = 0.0) -> Iterator[dict[str, Any]]:
    """Task dicts of `split`, forever, deterministic for `seed`. Bad params fail here, on the call."""
    families, levels, styles = [str(f) for f in families], [int(x) for x in levels], [str(s) for s in styles]
    _check(families, levels, styles, tolerance_mm)
    if not 0.0 <= float(correction_demos) <= 1.0:
        raise TaskError(f"cad: correction_demos must be a fraction in [0, 1], got {correction_demos}")
    if split not in ("train", "heldout"):
        raise TaskError(f"cad: unknown split {split!r}")
    cells = [(f, lv) for f in families for lv in levels if split_structures(f, lv)[split]]
    if not cells:
        raise TaskError(f"cad: no {split} structures for families {families} at levels {levels}")
    return _generate(split, seed, cells, styles, multi_turn, float(tolerance_mm), int(max_turns),
                     float(correction_demos))


def _generate(split: str, seed: int, cells: list[tuple[str, int]], styles: list[str], multi_turn: bool,
              tol: float, max_turns: int, correction_demos: float = 0.0) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"cad/{split}/{seed}")
    for i in itertools.count():
        family, level = rng.choice(cells)
        structure = rng.choice(split_structures(family, level)[split])
        style = rng.choice(styles)
        part = FAMILIES[family][1](random.Random(rng.getrandbits(64)), level, structure, style)
        task = task_of(part, f"cad/{split}/{seed}/{i}", multi_turn, tol, max_turns)
        # drawn from the id (not the stream's rng): the tasks are the same whatever the fraction
        u = int(hashlib.sha256(f"correction/{task['id']}".encode()).hexdigest()[:8], 16) / 16**8
        if multi_turn and u < correction_demos:
            task["metadata"]["demo"] = "correction"
        yield task


def task_of(part: Any, task_id: str, multi_turn: bool, tol: float, max_turns: int) -> dict[str, Any]:
    how = ("Use the build tool to run your script and read the geometry report, fix what differs, then submit."
           if multi_turn else "Reply with the whole script in one ```python code block.")
    # the convention is the system message: the user message (what dedup and contamination checks
    # compare) is the part alone, not a preamble every task shares
    prompt = [{"role": "system", "content": f"{CONVENTION.format(tol=f'{tol:g}')} {how}"},
              {"role": "user", "content": f"Part: {part.description}"}]
    bbox = {"bbox_min": [round(x, 6) for x in part.bbox_min], "bbox_max": [round(x, 6) for x in part.bbox_max]}
    task: dict[str, Any] = {
        "id": task_id,
        "domain": f"env:cad/{part.family}",  # per-family numbers in evaluations and training metrics
        "prompt": prompt,
        "hidden": {"program": part.program, "spec": {**bbox, "solids": 1, **part.params}},
        "verifier": {"name": "env:cad", "params": {"tolerance_mm": tol}},
        "difficulty": round(part.level / 3, 3),
        "tags": [part.family, f"level{part.level}", part.style],
        "metadata": {"family": part.family, "level": part.level, "style": part.style,
                     "structure": list(part.structure), "structure_key": structure_key(part.family, part.level,
                                                                                       part.structure),
                     # what the prompt itself states (the build tool compares against this, never the hidden spec)
                     "requirements": {**bbox, "tolerance_mm": tol, "features": part.features}},
    }
    if multi_turn:
        task["environment"] = {"kind": "env:cad", "tools": list(TOOL_NAMES), "max_turns": max_turns}
    return task
