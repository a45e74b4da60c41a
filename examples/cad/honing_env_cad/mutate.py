"""Deliberately wrong versions of a reference program (the solvability proof's negative half): each
must score < 1 in the layer named next to it."""

from __future__ import annotations

import re

_FIRST_DIM = re.compile(r"(Box|Cylinder)\((\d+(?:\.\d+)?)")


def off_dims(program: str) -> str | None:
    """The first Box/Cylinder's first dimension 2 mm larger (a wrong size: bbox layer)."""
    m = _FIRST_DIM.search(program)
    if m is None:
        return None
    return program[:m.start(2)] + f"{float(m.group(2)) + 2:g}" + program[m.end(2):]


def missing_feature(program: str) -> str | None:
    """The last cut (holes, bore, pocket) left out (features layer)."""
    lines = program.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if re.match(r"\w+ -= ", ln):
            return "".join(lines[:i] + lines[i + 1:])
        m = re.match(r"result = (\w+) - ", ln)
        if m:
            return "".join(lines[:i] + [f"result = {m.group(1)}\n"] + lines[i + 1:])
    return None


def wrong_hole_count(program: str) -> str | None:
    """One hole of a pattern fewer (features layer)."""
    if "for x, y in holes]" in program:
        return program.replace("result = plate - ", "holes = holes[:-1]\nresult = plate - ", 1)
    m = re.search(r"for i in range\((\d+)\)\]\nresult = flange", program)
    if m and int(m.group(1)) > 1:
        return program[:m.start(1)] + str(int(m.group(1)) - 1) + program[m.end(1):]
    return None


MUTATIONS = {"off_dims": (off_dims, "bbox"), "missing_feature": (missing_feature, "features"),
             "wrong_hole_count": (wrong_hole_count, "features")}
