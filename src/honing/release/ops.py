"""promote (optionally gated by `honing eval compare`), rollback, show, diff."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from honing.errors import HoningError
from honing.release.registry import Registry, Release


class PromoteRefused(HoningError):
    """The gate found a significant regression; `comparison` holds the compare() result."""

    def __init__(self, message: str, comparison: dict) -> None:
        super().__init__(message)
        self.comparison = comparison


def release_eval(rel: Release, which: str = "eval.json") -> dict | None:
    p = Path(rel.path) / which
    return json.loads(p.read_text()) if p.is_file() else None


def _gate_eval(rel: Release) -> dict | None:
    """What a gate compares for a release: the fast variant's own evaluation when it is one."""
    return release_eval(rel, "eval-fast.json") or release_eval(rel)


def gate(candidate: Release, current: Release, level: float = 0.95) -> dict:
    """compare(current, candidate); raises PromoteRefused on a significant regression."""
    from honing.eval.compare import compare

    a, b = _gate_eval(current), _gate_eval(candidate)
    missing = [r.name for r, e in ((current, a), (candidate, b)) if e is None]
    if missing:
        raise HoningError(f"cannot gate promote {candidate.name}: no evaluation in release {missing[0]} "
                          "(create it with --suite or --eval, or promote with --no-gate)")
    ma, mb = a.get("meta", {}), b.get("meta", {})  # type: ignore[union-attr]
    if (ma.get("suite"), ma.get("suite_version")) != (mb.get("suite"), mb.get("suite_version")):
        raise HoningError(f"cannot gate promote {candidate.name}: it was evaluated on {mb.get('suite')}, "
                          f"{current.name} on {ma.get('suite')} (use the same suite, or --no-gate)")
    cmp = compare(a, b, level)  # type: ignore[arg-type]
    if not cmp["shared_tasks"]:
        raise HoningError(f"cannot gate promote {candidate.name}: no shared tasks with {current.name}")
    if cmp["regressions"]:
        regs = ", ".join(f"{d} ({m})" for d, m in cmp["regressions"])
        raise PromoteRefused(f"promote {candidate.name} refused: significant regression against {current.name} "
                             f"in {regs}; current stays {current.name}", cmp)
    return cmp


def promote(name: str, registry: Path | str | None = None, require_gate: bool = True,
            level: float = 0.95) -> dict[str, Any]:
    """Make `name` current. With the gate (default), its evaluation must show no significant
    regression against the current release's (same suite). Verifies the checksum first."""
    reg = Registry(registry)
    cand = reg.verify(name)
    cur = reg.current()
    cmp = None
    if cur is not None and cur.name == name:
        raise HoningError(f"release {name} is already current")
    if cur is not None and require_gate:
        cmp = gate(cand, cur, level)
    prev = reg.set_current(name, "promote")
    return {"current": name, "previous": prev, "comparison": cmp}


def rollback(registry: Path | str | None = None, to: str | None = None) -> dict[str, Any]:
    """Point `current` back (one UPDATE): at `to`, or at the release current before this one."""
    reg = Registry(registry)
    target = to or reg.rollback_target()
    reg.verify(target)  # never roll back onto a release whose files were damaged
    prev = reg.set_current(target, "rollback")
    return {"current": target, "previous": prev}


def show(name: str, registry: Path | str | None = None) -> dict[str, Any]:
    reg = Registry(registry)
    rel = reg.get(name)
    try:
        reg.verify(name)
        check = "ok"
    except HoningError as e:
        check = str(e)
    cur = reg.current()
    ev = release_eval(rel)
    return {"name": rel.name, "variant": rel.variant, "path": rel.path, "created": rel.created, "run": rel.run,
            "step": rel.step, "parent": rel.parent, "data_snapshot": rel.data_snapshot, "digest": rel.digest,
            "current": cur is not None and cur.name == rel.name, "checksum": check,
            "eval": {"suite": ev["meta"].get("suite"), "overall": {k: ev.get("overall", {}).get(k)
                                                                   for k in ("pass@1", "ci")}} if ev else None,
            "fast": rel.meta.get("fast")}


def diff(a: str, b: str, registry: Path | str | None = None) -> dict[str, Any]:
    """Lineage fields that differ, files whose checksums differ, the recipe diff, and the eval
    comparison (B - A) when both have evaluations on the same suite."""
    reg = Registry(registry)
    ra, rb = reg.get(a), reg.get(b)
    fields = {f: (getattr(ra, f), getattr(rb, f)) for f in ("variant", "run", "step", "parent", "data_snapshot")
              if getattr(ra, f) != getattr(rb, f)}
    fa, fb = (json.loads((Path(r.path) / "manifest.json").read_text())["files"] for r in (ra, rb))
    files = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    ya, yb = ((Path(r.path) / "recipe.yaml") for r in (ra, rb))
    recipe = list(difflib.unified_diff(ya.read_text().splitlines() if ya.is_file() else [],
                                       yb.read_text().splitlines() if yb.is_file() else [],
                                       f"{a}/recipe.yaml", f"{b}/recipe.yaml", lineterm=""))
    cmp = None
    ea, eb = release_eval(ra), release_eval(rb)
    if ea and eb and ea["meta"].get("suite") == eb["meta"].get("suite"):
        from honing.eval.compare import compare

        cmp = compare(ea, eb)
    return {"a": a, "b": b, "fields": fields, "files": files, "recipe_diff": recipe, "comparison": cmp}
