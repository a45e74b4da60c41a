"""Parametric part families: for each, the discrete *structures* per level (what the train/held-out
split is made of) and a seeded builder that gives a part's dimensions, its build123d reference
program, its prompt (exact dimensions or described intent) and the bounding box the prompt implies.

Every prompt states the part's placement, so geometry is compared in absolute coordinates (no
normalisation): a candidate that models the right shape in the wrong place loses the bbox and
IoU layers. Dimensions are drawn from coarse grids (whole or half millimetres) so that both
prompt styles state every number a solution needs: "intent" phrases the same information as
design intent (edge margins, "centred between", a bolt-circle diameter) instead of coordinates.

Structure keys leave out continuous dimensions and the prompt style: a held-out structure is a
new arrangement of features (another hole pattern, another feature set), never just new sizes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Callable

from honing_env_cad.features import corner, face, hole, point, round_

LEVELS = (1, 2, 3)
STYLES = ("exact", "intent")
HEAD = "from build123d import *\n"
C3 = "align=(Align.CENTER, Align.CENTER, Align.MIN)"


@dataclass
class Part:
    family: str
    level: int
    structure: tuple
    style: str
    description: str  # the prompt's part description
    program: str  # the hidden reference program (leaves the part in `result`)
    bbox_min: tuple[float, float, float]
    bbox_max: tuple[float, float, float]
    params: dict[str, Any] = field(default_factory=dict)
    features: list[dict[str, Any]] = field(default_factory=list)  # what the prompt states (features.py)


def f(x: float) -> str:
    """A dimension as the prompt and the program write it (no float noise)."""
    return f"{round(x, 4):g}"


def _grid(rng: random.Random, lo: float, hi: float, step: float = 1.0) -> float:
    n = int(round((hi - lo) / step))
    return lo + step * rng.randint(0, n)


# --- plate with a hole pattern -----------------------------------------------------------------
def plate_structures(level: int) -> list[tuple]:
    if level == 1:
        return [("grid", nx, ny, False, False) for nx, ny in product((1, 2, 3), (1, 2))]
    pats = [("grid", nx, ny) for nx, ny in product((2, 3, 4), (2, 3))] + [("polar", n, 1) for n in range(3, 9)]
    if level == 2:
        return [(*p, False, False) for p in pats]
    return [(*p, fil, off) for p in pats for fil, off in ((True, False), (True, True), (False, True))]


def plate(rng: random.Random, level: int, s: tuple, style: str) -> Part:
    kind, a, b, fil, off = s
    T, d = _grid(rng, 4, 12), _grid(rng, 3, 8, 0.5)
    holes: list[tuple[float, float]] = []
    if kind == "grid":
        nx, ny = a, b
        px, py = _grid(rng, 12, 30, 2), _grid(rng, 12, 24, 2)
        mx, my = _grid(rng, 8, 14), _grid(rng, 8, 14)
        mx2 = mx + (_grid(rng, 4, 12, 2) if off else 0)
        L, W = px * (nx - 1) + mx + mx2, py * (ny - 1) + 2 * my
        x0, y0 = -L / 2 + mx, -W / 2 + my
        holes = [(x0 + i * px, y0 + j * py) for j in range(ny) for i in range(nx)]
        n = nx * ny
        margin = min(mx, my)
    else:
        n = a
        R = _grid(rng, 14, 30, 2)
        m = _grid(rng, 8, 14)
        L = W = 2 * (R + m)
        a0 = (180.0 / n if n % 2 == 0 else 90.0) if off else 0.0
        holes = [(R * math.cos(math.radians(a0 + 360.0 * i / n)), R * math.sin(math.radians(a0 + 360.0 * i / n)))
                 for i in range(n)]
        margin = m  # a corner fillet r <= m - d/2 - 1 stays clear of the bolt circle too
    r = min(_grid(rng, 2, 8), margin - d / 2 - 1) if fil else 0.0
    r = max(r, 1.0) if fil else 0.0
    lines = [HEAD, f"plate = Box({f(L)}, {f(W)}, {f(T)}, {C3})\n"]
    if fil:
        lines.append(f"plate = fillet(plate.edges().filter_by(Axis.Z), radius={f(r)})\n")
    if kind == "grid":
        lines.append(f"holes = [(x, y) for y in {[f(y0 + j * py) for j in range(ny)]} for x in "
                     f"{[f(x0 + i * px) for i in range(nx)]}]\n".replace("'", ""))
    else:
        lines.append(f"import math\nholes = [({f(R)} * math.cos(math.radians({f(a0)} + 360 * i / {n})), "
                     f"{f(R)} * math.sin(math.radians({f(a0)} + 360 * i / {n}))) for i in range({n})]\n")
    lines.append(f"result = plate - [Pos(x, y, 0) * Cylinder({f(d / 2)}, {f(T)}, {C3}) for x, y in holes]\n")
    place = "its bottom face on z = 0 and centred on the origin in X and Y"
    if style == "exact":
        desc = f"A rectangular plate {f(L)} mm in X, {f(W)} mm in Y and {f(T)} mm thick (Z), {place}."
        if kind == "grid":
            desc += (f" It has {n} through hole{'s' if n > 1 else ''} of diameter {f(d)} mm at x in "
                     f"{{{', '.join(f(x0 + i * px) for i in range(nx))}}} and y in "
                     f"{{{', '.join(f(y0 + j * py) for j in range(ny))}}} (every combination).")
        else:
            desc += (f" It has {n} through holes of diameter {f(d)} mm equally spaced on a circle of radius "
                     f"{f(R)} mm centred on the origin, the first at {f(a0)} degrees from +X (counter-clockwise).")
    else:
        desc = f"A {f(L)} x {f(W)} mm mounting plate, {f(T)} mm thick, lying flat with {place}."
        if kind == "grid":
            side = (f"{f(mx)} mm from the left (-X) edge and {f(mx2)} mm from the right edge" if off
                    else f"{f(mx)} mm in from the left and right edges")
            desc += (f" Drill {n} through hole{'s' if n > 1 else ''} of diameter {f(d)} mm in {nx} column(s) and "
                     f"{ny} row(s), evenly spaced: the outer hole centres sit {side}"
                     f"{'' if ny == 1 else f', and {f(my)} mm in from the front and back edges'}"
                     f"{' (the single row on the centre line)' if ny == 1 else ''}.")
        else:
            rot = f"rotated {f(a0)} degrees counter-clockwise from the +X axis" if off else "on the +X axis"
            desc += (f" Drill {n} equally spaced through holes of diameter {f(d)} mm on a {f(2 * R)} mm diameter "
                     f"bolt circle concentric with the plate, the first hole {rot}.")
    if fil:
        desc += f" Round the four vertical corner edges with radius {f(r)} mm."
    feats = [hole(f"hole {i + 1} of {n} (diameter {f(d)} mm)", (x, y, T / 2), d) for i, (x, y) in enumerate(holes)]
    if fil:
        feats += [corner("rounded vertical corner", (sx * L / 2, sy * W / 2, T / 2), (-sx, -sy, 0), r)
                  for sx, sy in ((1, 1), (-1, 1), (-1, -1), (1, -1))]
    return Part("plate", level, s, style, desc, "".join(lines), (-L / 2, -W / 2, 0.0), (L / 2, W / 2, T),
                {"holes": n}, feats)


# --- L-bracket -------------------------------------------------------------------------------------
def bracket_structures(level: int) -> list[tuple]:
    if level == 1:
        return [(False, nb, 0, 0) for nb in (0, 1, 2)]
    if level == 2:
        return [(True, nb, nu, 0) for nb, nu in product((0, 1, 2), (0, 1, 2))]
    return [(fil, nb, nu, g) for fil, nb, nu, g in product((False, True), (1, 2), (0, 1, 2), (1, 2))]


def bracket(rng: random.Random, level: int, s: tuple, style: str) -> Part:
    fil, nb, nu, ng = s
    t, Wd = _grid(rng, 4, 8), _grid(rng, 24, 50, 2)
    A, H = _grid(rng, 36, 70, 2), _grid(rng, 30, 60, 2)
    d = _grid(rng, 4, 7, 0.5)
    r = _grid(rng, 2, 5) if fil else 0.0
    g, G = _grid(rng, 3, 5), _grid(rng, 10, 16, 2)
    toe_b = t + (G if ng else r)  # where the base's free length starts
    toe_u = t + (G if ng else r)
    xb, zu = (toe_b + A) / 2, (toe_u + H) / 2
    yb = Wd / 4 if ng != 1 else Wd / 4  # two holes at +-Wd/4; a single hole sits at y=0 unless a centre gusset
    ys = {0: [], 1: [0.0] if ng != 1 else [Wd / 4], 2: [-yb, yb]}
    gys = {0: [], 1: [0.0], 2: [-(Wd / 2 - g / 2), Wd / 2 - g / 2]}[ng]
    lines = [HEAD, f"part = Box({f(A)}, {f(Wd)}, {f(t)}, align=(Align.MIN, Align.CENTER, Align.MIN))\n",
             f"part += Box({f(t)}, {f(Wd)}, {f(H)}, align=(Align.MIN, Align.CENTER, Align.MIN))\n"]
    if fil:
        lines.append(f"inner = part.edges().filter_by(Axis.Y).sort_by_distance(({f(t)}, 0, {f(t)}))[0]\n"
                     f"part = fillet(inner, radius={f(r)})\n")
    for y in gys:
        lines.append(f"part += Pos(0, {f(y)}, 0) * extrude(Plane.XZ * Polygon(({f(t)}, {f(t)}), ({f(t + G)}, {f(t)}), "
                     f"({f(t)}, {f(t + G)}), align=None), amount={f(g / 2)}, both=True)\n")
    for y in ys[nb]:
        lines.append(f"part -= Pos({f(xb)}, {f(y)}, 0) * Cylinder({f(d / 2)}, {f(t)}, {C3})\n")
    for y in ys[nu]:
        lines.append(f"part -= Pos(0, {f(y)}, {f(zu)}) * Rot(0, 90, 0) * Cylinder({f(d / 2)}, {f(t)}, {C3})\n")
    lines.append("result = part\n")
    if style == "exact":
        desc = (f"An L-bracket: a base leg from x = 0 to {f(A)}, y = {f(-Wd / 2)} to {f(Wd / 2)}, z = 0 to {f(t)}, and "
                f"an upright leg from x = 0 to {f(t)}, the same y range, z = 0 to {f(H)} (one solid).")
        if fil:
            desc += f" Fillet the inside corner edge (the line x = {f(t)}, z = {f(t)}) with radius {f(r)} mm."
        if gys:
            desc += (f" Add {ng} triangular gusset{'s' if ng > 1 else ''} {f(g)} mm thick in Y, centred at y = "
                     f"{' and '.join(f(y) for y in gys)}, each with corners (x, z) = ({f(t)}, {f(t)}), ({f(t + G)}, {f(t)}), "
                     f"({f(t)}, {f(t + G)}).")
        if ys[nb]:
            desc += (f" Drill vertical through holes of diameter {f(d)} mm in the base at x = {f(xb)}, y = "
                     f"{' and '.join(f(y) for y in ys[nb])}.")
        if ys[nu]:
            desc += (f" Drill horizontal through holes (along X) of diameter {f(d)} mm in the upright at z = {f(zu)}, "
                     f"y = {' and '.join(f(y) for y in ys[nu])}.")
    else:
        desc = (f"An L-shaped angle bracket of {f(t)} mm plate, {f(Wd)} mm wide (centred on y = 0): a {f(A)} mm base "
                f"lying on z = 0 running along +X from x = 0, and a {f(H)} mm tall upright standing at the x = 0 end "
                f"(its outer face on x = 0).")
        if fil:
            desc += f" The inside bend is rounded with a {f(r)} mm radius."
        if gys:
            where = "in the middle of the width" if ng == 1 else "flush with both side faces"
            desc += (f" Stiffen it with {ng} right-triangle gusset{'s' if ng > 1 else ''} {f(g)} mm thick {where}, "
                     f"whose legs run {f(G)} mm along the base and {f(G)} mm up the upright from the inside faces.")
        start = "the gusset toes" if ng else ("the end of the inside fillet" if fil else "the upright's inside face")
        if ys[nb]:
            where = "on the centre line" if ys[nb] == [0.0] else (
                f"{f(Wd / 4)} mm off the centre line toward +Y" if len(ys[nb]) == 1 else
                f"a quarter of the width from each side")
            desc += (f" The base has {nb} vertical {f(d)} mm through hole{'s' if nb > 1 else ''} {where}, centred "
                     f"along X between {start} and the base's end.")
        if ys[nu]:
            where = "on the centre line" if ys[nu] == [0.0] else (
                f"{f(Wd / 4)} mm off the centre line toward +Y" if len(ys[nu]) == 1 else
                "a quarter of the width from each side")
            desc += (f" The upright has {nu} horizontal {f(d)} mm through hole{'s' if nu > 1 else ''} {where}, centred "
                     f"in height between {start} and the upright's top.")
    # 1 mm from the leg's free end and its -Y side: clear of the holes (centred between the toe and
    # the end, at y = 0 or +-Wd/4) and of the gussets and the fillet (at the inside corner)
    feats = [face("base leg's top face", (A - 1, -Wd / 2 + 1, t), (0, 0, 1)),
             face("upright leg's inside face", (t, -Wd / 2 + 1, H - 1), (1, 0, 0))]
    feats += [hole(f"base hole {i + 1} of {nb} (diameter {f(d)} mm)", (xb, y, t / 2), d) for i, y in enumerate(ys[nb])]
    feats += [hole(f"upright hole {i + 1} of {nu} (diameter {f(d)} mm)", (t / 2, y, zu), d, "x")
              for i, y in enumerate(ys[nu])]
    if fil:  # the fillet adds material in the inside corner, away from any gusset
        yf = Wd / 4 if ng == 1 else 0.0
        feats.append(point("inside-corner fillet", (t + 0.15 * r, yf, t + 0.15 * r)))
    feats += [point(f"gusset {i + 1} of {ng}", (t + G / 3, y, t + G / 3)) for i, y in enumerate(gys)]
    return Part("bracket", level, s, style, desc, "".join(lines), (0.0, -Wd / 2, 0.0), (A, Wd / 2, H),
                {"holes": len(ys[nb]) + len(ys[nu])}, feats)


# --- flange with a bolt circle ---------------------------------------------------------------------
def flange_structures(level: int) -> list[tuple]:
    if level == 1:
        return [(n, False, False, False) for n in range(3, 7)]
    if level == 2:
        return [(n, True, False, False) for n in range(4, 9)]
    return [(n, True, ch, rot) for n in range(4, 9) for ch, rot in ((True, False), (True, True), (False, True))]


def flange(rng: random.Random, level: int, s: tuple, style: str) -> Part:
    n, hub, ch, rot = s
    b = _grid(rng, 8, 20, 2)
    Dh = b + _grid(rng, 8, 16, 2) if hub else b
    d = _grid(rng, 4, 9, 1)
    P = Dh + d + _grid(rng, 8, 20, 2)
    D = P + d + _grid(rng, 10, 20, 2)
    T, Hh = _grid(rng, 5, 12), (_grid(rng, 5, 15) if hub else 0.0)
    c = _grid(rng, 1, 2.5, 0.5) if ch else 0.0
    a0 = 180.0 / n if rot else 0.0
    lines = [HEAD, f"flange = Cylinder({f(D / 2)}, {f(T)}, {C3})\n"]
    if ch:
        lines.append(f"flange = chamfer(flange.edges().filter_by(GeomType.CIRCLE).sort_by(Axis.Z)[-1], length={f(c)})\n")
    if hub:
        lines.append(f"flange += Pos(0, 0, {f(T)}) * Cylinder({f(Dh / 2)}, {f(Hh)}, {C3})\n")
    lines.append(f"flange -= Cylinder({f(b / 2)}, {f(T + Hh)}, {C3})\n")
    lines.append(f"import math\nbolts = [Pos({f(P / 2)} * math.cos(math.radians({f(a0)} + 360 * i / {n})), "
                 f"{f(P / 2)} * math.sin(math.radians({f(a0)} + 360 * i / {n})), 0) * Cylinder({f(d / 2)}, {f(T)}, {C3}) "
                 f"for i in range({n})]\nresult = flange - bolts\n")
    first = f"the first at {f(a0)} degrees from +X (counter-clockwise)"
    if style == "exact":
        desc = (f"A round flange: a disc of diameter {f(D)} mm and thickness {f(T)} mm, axis along Z, centred on the "
                f"origin with its bottom face on z = 0.")
        if ch:
            desc += f" Chamfer the disc's top outer edge by {f(c)} mm."
        if hub:
            desc += f" On top, a concentric hub of diameter {f(Dh)} mm rising {f(Hh)} mm (z = {f(T)} to {f(T + Hh)})."
        desc += (f" A central bore of diameter {f(b)} mm goes through everything, and {n} bolt holes of diameter "
                 f"{f(d)} mm go through the disc, equally spaced on a {f(P)} mm pitch-circle diameter, {first}.")
    else:
        desc = (f"A {f(D)} mm pipe flange, {f(T)} mm thick, lying on the XY plane centred on the origin (bottom face "
                f"on z = 0)")
        desc += f" with a {f(Dh)} mm boss standing {f(Hh)} mm proud of its top face." if hub else "."
        if ch:
            desc += f" Break the outer top edge of the flange with a {f(c)} mm chamfer."
        desc += (f" It is bored through at {f(b)} mm for the pipe and bolts on with {n} x {f(d)} mm holes on a "
                 f"{f(P)} mm bolt circle, " + ("one hole on the +X axis." if not rot else
                                               f"the holes rotated half a pitch ({f(a0)} degrees) off the +X axis."))
    am = math.radians(a0 + 180.0 / n)  # between two bolt holes, halfway from the pitch circle to the rim
    rm = (P / 2 + D / 2) / 2
    feats = [face("disc's top face", (rm * math.cos(am), rm * math.sin(am), T), (0, 0, 1)),
             hole(f"central bore (diameter {f(b)} mm)", (0, 0, (T + Hh) / 2), b)]
    feats += [hole(f"bolt hole {i + 1} of {n} (diameter {f(d)} mm)",
                   (P / 2 * math.cos(math.radians(a0 + 360.0 * i / n)), P / 2 * math.sin(math.radians(a0 + 360.0 * i / n)),
                    T / 2), d) for i in range(n)]
    if hub:
        rh = (b / 2 + Dh / 2) / 2
        feats += [round_(f"hub (diameter {f(Dh)} mm)", (0, 0, T + Hh / 2), Dh),
                  face("hub's top face", (rh * math.cos(am), rh * math.sin(am), T + Hh), (0, 0, 1))]
    if ch:
        feats.append(corner("top outer edge chamfer", (D / 2 * math.cos(am), D / 2 * math.sin(am), T),
                            (-math.cos(am), -math.sin(am), -1), c))
    return Part("flange", level, s, style, desc, "".join(lines), (-D / 2, -D / 2, 0.0), (D / 2, D / 2, T + Hh),
                {"holes": n}, feats)


# --- stepped shaft ---------------------------------------------------------------------------------
def shaft_structures(level: int) -> list[tuple]:
    if level == 1:
        return [(2, False, "none"), (3, False, "none")]
    if level == 2:
        return [(n, True, "none") for n in (2, 3, 4)]
    return [(n, ch, feat) for n in (3, 4) for ch in (True, False) for feat in ("bore", "cross")]


def shaft(rng: random.Random, level: int, s: tuple, style: str) -> Part:
    n, ch, feat = s
    ds: list[float] = []
    d = _grid(rng, 18 + 6 * (n - 1), 36 + 6 * (n - 1), 2)
    for _ in range(n):
        ds.append(d)
        d -= _grid(rng, 4, 6, 2)  # the top section stays >= 12 mm
    ls = [_grid(rng, 16 if feat == "cross" else 10, 30, 2) for _ in range(n)]
    Ltot = sum(ls)
    c = _grid(rng, 0.5, 2, 0.5) if ch else 0.0
    lines = [HEAD, f"shaft = Cylinder({f(ds[0] / 2)}, {f(ls[0])}, {C3})\n"]
    z = ls[0]
    for di, li in zip(ds[1:], ls[1:]):
        lines.append(f"shaft += Pos(0, 0, {f(z)}) * Cylinder({f(di / 2)}, {f(li)}, {C3})\n")
        z += li
    if ch:
        lines.append("ends = shaft.edges().filter_by(GeomType.CIRCLE).sort_by(Axis.Z)\n"
                     f"shaft = chamfer([ends[0], ends[-1]], length={f(c)})\n")
    db = hb = dc = zc = 0.0
    if feat == "bore":
        db, hb = _grid(rng, 2, max(2, ds[-1] / 2 - 2), 1), _grid(rng, 6, min(20, Ltot - 4), 2)
        lines.append(f"shaft -= Pos(0, 0, {f(Ltot)}) * Cylinder({f(db / 2)}, {f(hb)}, "
                     "align=(Align.CENTER, Align.CENTER, Align.MAX))\n")
    elif feat == "cross":
        dc = _grid(rng, 3, max(3, min(ds[0] / 3, ls[0] / 2 - 2)), 1)
        zc = ls[0] / 2
        lines.append(f"shaft -= Pos(0, 0, {f(zc)}) * Rot(0, 90, 0) * Cylinder({f(dc / 2)}, {f(ds[0] + 2)})\n")
    lines.append("result = shaft\n")
    segs = ", ".join(f"diameter {f(a)} mm x {f(b)} mm long" for a, b in zip(ds, ls))
    if style == "exact":
        desc = (f"A stepped round shaft along +Z, axis on the Z axis, starting at z = 0: {n} coaxial cylindrical "
                f"sections from the bottom up: {segs} (total length {f(Ltot)} mm).")
        if ch:
            desc += f" Chamfer the outer edges of both end faces by {f(c)} mm."
        if feat == "bore":
            desc += f" Drill an axial blind hole of diameter {f(db)} mm, {f(hb)} mm deep, into the top end face."
        elif feat == "cross":
            desc += f" Drill a cross hole of diameter {f(dc)} mm straight through along X at z = {f(zc)}."
    else:
        desc = (f"A turned shaft standing on the XY plane at the origin, axis vertical (+Z), stepping down in "
                f"diameter from the bottom: {segs}.")
        if ch:
            desc += f" Both ends get a {f(c)} mm edge chamfer."
        if feat == "bore":
            desc += f" The top end has a {f(db)} mm centre hole {f(hb)} mm deep."
        elif feat == "cross":
            desc += f" A {f(dc)} mm pin hole crosses the bottom section along X at half its length."
    R = ds[0] / 2
    feats, z0 = [], 0.0
    for i, (di, li) in enumerate(zip(ds, ls)):  # a quarter up each section: clear of chamfers and the cross hole
        feats.append(round_(f"section {i + 1} of {n} (diameter {f(di)} mm)", (0, 0, z0 + li / 4), di))
        if i + 1 < n:
            feats.append(face(f"step from section {i + 1} to {i + 2}", ((di + ds[i + 1]) / 4, 0, z0 + li), (0, 0, 1)))
        z0 += li
    if ch:
        feats += [corner("bottom end chamfer", (R, 0, 0), (-1, 0, 1), c),
                  corner("top end chamfer", (ds[-1] / 2, 0, Ltot), (-1, 0, -1), c)]
    if feat == "bore":
        feats += [hole(f"axial hole (diameter {f(db)} mm)", (0, 0, Ltot - hb / 2), db),
                  face("axial hole's bottom", (0, 0, Ltot - hb), (0, 0, 1))]
    elif feat == "cross":
        feats.append(hole(f"cross hole (diameter {f(dc)} mm)", (0, 0, zc), dc, "x"))
    return Part("shaft", level, s, style, desc, "".join(lines), (-R, -R, 0.0), (R, R, Ltot), {"steps": n}, feats)


# --- open-top enclosure ------------------------------------------------------------------------------
def enclosure_structures(level: int) -> list[tuple]:
    if level == 1:
        return [(False, 0, False), (False, 2, False)]
    if level == 2:
        return [(False, 4, False), (False, 4, True), (False, 2, True)]
    return [(True, nb, holes) for nb, holes in ((0, False), (4, False), (4, True), (2, True))]


def enclosure(rng: random.Random, level: int, s: tuple, style: str) -> Part:
    fil, nb, holes = s
    L, W, H = _grid(rng, 50, 100, 2), _grid(rng, 40, 80, 2), _grid(rng, 20, 45)
    t, tf = _grid(rng, 2, 4), _grid(rng, 2, 4)
    r = _grid(rng, t + 2, t + 6) if fil else 0.0
    Db = _grid(rng, 7, 10)
    dh = _grid(rng, 2.5, Db - 4, 0.5)
    hb = H - tf - _grid(rng, 2, 6)
    off = t + Db / 2 - 1  # boss centres: each boss merges 1 mm into both walls of its corner (no tangency)
    hd = hb - 2  # boss holes stop 2 mm above the floor
    pts = [(-L / 2 + off, -W / 2 + off), (L / 2 - off, W / 2 - off), (L / 2 - off, -W / 2 + off),
           (-L / 2 + off, W / 2 - off)][:nb]
    lines = [HEAD, f"box = Box({f(L)}, {f(W)}, {f(H)}, {C3})\n"]
    pocket = f"Pos(0, 0, {f(tf)}) * Box({f(L - 2 * t)}, {f(W - 2 * t)}, {f(H - tf)}, {C3})"
    if fil:
        lines.append(f"box = fillet(box.edges().filter_by(Axis.Z), radius={f(r)})\n"
                     f"pocket = {pocket}\npocket = fillet(pocket.edges().filter_by(Axis.Z), radius={f(r - t)})\n"
                     "box -= pocket\n")
    else:
        lines.append(f"box -= {pocket}\n")
    for x, y in pts:
        lines.append(f"box += Pos({f(x)}, {f(y)}, {f(tf)}) * Cylinder({f(Db / 2)}, {f(hb)}, {C3})\n")
    if holes:
        for x, y in pts:
            lines.append(f"box -= Pos({f(x)}, {f(y)}, {f(tf + hb)}) * Cylinder({f(dh / 2)}, {f(hd)}, "
                         "align=(Align.CENTER, Align.CENTER, Align.MAX))\n")
    lines.append("result = box\n")
    if style == "exact":
        desc = (f"An open-top box: outer size {f(L)} (X) x {f(W)} (Y) x {f(H)} (Z) mm, centred on the origin in X "
                f"and Y, bottom on z = 0; walls {f(t)} mm thick, floor {f(tf)} mm thick, open at the top.")
        if fil:
            desc += (f" The four outer vertical edges are rounded with radius {f(r)} mm and the inner pocket's vertical "
                     f"edges with radius {f(r - t)} mm.")
        if pts:
            desc += (f" {nb} cylindrical bosses of diameter {f(Db)} mm stand on the floor (z = {f(tf)} to {f(tf + hb)}) "
                     f"at (x, y) = {', '.join(f'({f(x)}, {f(y)})' for x, y in pts)}.")
            if holes:
                desc += f" Each boss has a coaxial {f(dh)} mm hole {f(hd)} mm deep from its top."
    else:
        desc = (f"A {f(L)} x {f(W)} x {f(H)} mm open-top enclosure sitting on the XY plane, centred on the origin, with "
                f"{f(t)} mm walls and a {f(tf)} mm floor.")
        if fil:
            desc += f" Outer vertical corners rounded at {f(r)} mm, keeping the wall thickness uniform around them."
        if pts:
            which = "in all four corners" if nb == 4 else "in the -X/-Y and +X/+Y corners"
            desc += (f" {nb} screw bosses of {f(Db)} mm diameter {which}, centred {f(off)} mm in from both outer "
                     f"faces of their corner, "
                     f"rising from the floor to {f(H - tf - hb)} mm below the rim")
            desc += f", each with a {f(dh)} mm hole down its axis stopping 2 mm above the floor." if holes else "."
    zm = (tf + H) / 2
    feats = [face("floor's top face", (0, 0, tf), (0, 0, 1)),
             face("+X wall's inside face", (L / 2 - t, 0, zm), (-1, 0, 0)),
             face("-X wall's inside face", (-L / 2 + t, 0, zm), (1, 0, 0)),
             face("+Y wall's inside face", (0, W / 2 - t, zm), (0, -1, 0)),
             face("-Y wall's inside face", (0, -W / 2 + t, zm), (0, 1, 0))]
    for i, (x, y) in enumerate(pts):
        u = (-x / math.hypot(x, y), -y / math.hypot(x, y), 0.0)  # toward the middle of the box: empty
        rt = (Db / 2 + dh / 2) / 2 if holes else Db / 4
        feats += [round_(f"boss {i + 1} of {nb} (diameter {f(Db)} mm)", (x, y, tf + hb / 2), Db, out=u),
                  face(f"boss {i + 1}'s top face", (x + rt * u[0], y + rt * u[1], tf + hb), (0, 0, 1))]
        if holes:
            feats += [hole(f"boss {i + 1}'s hole (diameter {f(dh)} mm)", (x, y, tf + hb - hd / 2), dh),
                      face(f"boss {i + 1}'s hole bottom", (x, y, tf + hb - hd), (0, 0, 1))]
    if fil:
        feats += [corner("rounded outer corner", (sx * L / 2, sy * W / 2, zm), (-sx, -sy, 0), r)
                  for sx, sy in ((1, 1), (-1, 1), (-1, -1), (1, -1))]
    return Part("enclosure", level, s, style, desc, "".join(lines), (-L / 2, -W / 2, 0.0), (L / 2, W / 2, H),
                {"bosses": nb}, feats)


FAMILIES: dict[str, tuple[Callable[[int], list[tuple]], Callable[..., Part]]] = {
    "plate": (plate_structures, plate),
    "bracket": (bracket_structures, bracket),
    "flange": (flange_structures, flange),
    "shaft": (shaft_structures, shaft),
    "enclosure": (enclosure_structures, enclosure),
}
