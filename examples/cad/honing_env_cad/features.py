"""The features a prompt states (holes, bosses, sections, faces, fillets), as probe points the
build tool checks a built part against: the "inspect" half of generate -> inspect -> correct.

Every feature is what the prompt itself says (a hole's diameter and position, a wall's thickness),
never the hidden reference or its measurements: families.py writes them from the same numbers it
writes the prompt from, into the task's `metadata.requirements`. A feature becomes points that must
be material (`solid`) or empty, each `delta` mm off the stated surface, where delta exceeds the
stated tolerance (a part within tolerance passes every probe). The measuring box answers
`is_inside` for each point; `report` turns the answers into one line per feature that differs,
naming the feature and how it differs, never the coordinates (an intent prompt leaves deriving
them to the model).

Kinds (all coordinates in mm, absolute, as the prompt places the part):
- hole: an empty cylinder, `c` a point on its axis (mid-depth), `axis` x|y|z, `d` its diameter.
- round: a material cylinder (boss, hub, shaft section); `out` (optional): the one direction in
  which its outside is empty (a boss merged into walls), else all four.
- face: a stated plane face through `p` with outward normal `n` (material behind, empty in front).
- corner: an edge at `p` that is rounded or chamfered (`solid` False: the material at `p` moved
  `delta` along `toward` is gone) of size `size`; checked only where the size is well above delta.
- point: a point that must be material (inside a gusset).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

Vec = Sequence[float]
_PERP = {"x": ((0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)),
         "y": ((1, 0, 0), (-1, 0, 0), (0, 0, 1), (0, 0, -1)),
         "z": ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0))}


def _r(v: Vec) -> list[float]:
    return [round(float(x), 6) for x in v]


def hole(label: str, c: Vec, d: float, axis: str = "z") -> dict[str, Any]:
    return {"kind": "hole", "label": label, "c": _r(c), "d": float(d), "axis": axis}


def round_(label: str, c: Vec, d: float, axis: str = "z", out: Vec | None = None) -> dict[str, Any]:
    f = {"kind": "round", "label": label, "c": _r(c), "d": float(d), "axis": axis}
    if out is not None:
        n = math.hypot(*out) or 1.0
        f["out"] = _r([x / n for x in out])
    return f


def face(label: str, p: Vec, n: Vec) -> dict[str, Any]:
    return {"kind": "face", "label": label, "p": _r(p), "n": _r(n)}


def corner(label: str, p: Vec, toward: Vec, size: float) -> dict[str, Any]:
    n = math.hypot(*toward) or 1.0
    return {"kind": "corner", "label": label, "p": _r(p), "toward": _r([x / n for x in toward]), "size": float(size)}


def point(label: str, p: Vec) -> dict[str, Any]:
    return {"kind": "point", "label": label, "p": _r(p)}


def delta_for(tolerance_mm: float) -> float:
    """How far off a stated surface a probe sits: past the tolerance, so a part within it passes."""
    return max(0.2, 2.0 * float(tolerance_mm))


def _at(p: Vec, u: Vec, s: float) -> list[float]:
    return [round(a + s * b, 6) for a, b in zip(p, u)]


def probes(features: Sequence[dict[str, Any]], tolerance_mm: float) -> list[tuple[int, list[float], bool, str]]:
    """(feature index, point, must be material, what it means when it is not) for every check."""
    dl = delta_for(tolerance_mm)
    out: list[tuple[int, list[float], bool, str]] = []
    for i, f in enumerate(features):
        k = f["kind"]
        if k == "hole":
            r = f["d"] / 2
            out.append((i, list(f["c"]), False, "no hole at its stated position"))
            if r > 2 * dl:
                out += [(i, _at(f["c"], u, r - dl), False, "narrower than stated, or off its stated axis")
                        for u in _PERP[f["axis"]]]
            out += [(i, _at(f["c"], u, r + dl), True, "wider than stated, or off its stated axis")
                    for u in _PERP[f["axis"]]]
        elif k == "round":
            r = f["d"] / 2
            out += [(i, _at(f["c"], u, r - dl), True, "missing, narrower than stated, or off its stated axis")
                    for u in _PERP[f["axis"]]]
            outs = [f["out"]] if "out" in f else _PERP[f["axis"]]
            out += [(i, _at(f["c"], u, r + dl), False, "wider than stated, or off its stated axis") for u in outs]
        elif k == "face":
            out.append((i, _at(f["p"], f["n"], -dl), True, "not where stated (no material just inside it)"))
            out.append((i, _at(f["p"], f["n"], dl), False, "not where stated (material just beyond it)"))
        elif k == "corner":
            if f["size"] > 4 * dl:
                out.append((i, _at(f["p"], f["toward"], dl), False, "missing (the edge is still sharp)"))
        elif k == "point":
            out.append((i, list(f["p"]), True, "missing"))
        else:
            raise ValueError(f"cad: unknown stated feature kind {k!r}")
    return out


def report(features: Sequence[dict[str, Any]], checks: Sequence[tuple[int, list[float], bool, str]],
           inside: Sequence[bool], max_lines: int = 8) -> tuple[list[str], int]:
    """(one line per stated feature that differs, the first way it differs; how many differ)."""
    if len(inside) != len(checks):
        raise ValueError(f"cad: {len(inside)} probe answers for {len(checks)} probes")
    first: dict[int, str] = {}
    for (i, _, want, why), got in zip(checks, inside):
        if bool(got) != want and i not in first:
            first[i] = why
    lines = [f"{features[i]['label']}: {why}" for i, why in sorted(first.items())]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... and {len(lines) - max_lines} more"]
    return lines, len(first)
