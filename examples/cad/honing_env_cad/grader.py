"""The `cad` verifier (host side): run the candidate's script in a `cad` box, measure its part in a
second box against the reference, and score in layers.

Layers (components of the Verdict, each in [0, 1]):
- build (the gate): the script ran and left exactly one solid in `result`. A script that does
  not build scores 0 whatever else: no partial credit for code that does not build.
- valid (a gate too): OCCT's BRepCheck says the solid is valid. An invalid solid scores 0: its
  measured volume cannot be trusted, and "any valid solid" must not earn a reward by itself.
- bbox: the exact bounding box's six coordinates within the stated tolerance (fraction of them).
- volume: within `volume_rel_tol` of the reference's.
- iou: vol(a & b) / vol(a | b) by OCCT booleans, in absolute coordinates (no normalisation); the
  layer ramps linearly from IoU 0.5 (0) to `iou_min` (1).
- features: face, edge and cylindrical-face counts equal to the reference's (fraction of them).
score = build * valid * (0.2 bbox + 0.25 volume + 0.3 iou + 0.25 features); passed = every
layer full. A sandbox or toolchain failure is an infrastructure error (Verdict.infra), never 0.

Boxes: a pool of warm `cad` cells (build123d preloaded in each zygote) by default, or a fresh box
per job (`HONING_CAD_MODE=cold`); HONING_CAD_CELLS sets the pool size (default 2).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from honing.sandbox import Limits, SandboxError
from honing.verify.types import Verdict

from honing_env_cad.boxcode import MEASURE_SRC, build_src

WEIGHTS = {"bbox": 0.2, "volume": 0.25, "iou": 0.3, "features": 0.25}
SCRIPT = "part.py"
BUILD_TIMEOUT_S = 20.0
MAX_BREP = 8 << 20
DEFAULTS = {"tolerance_mm": 0.1, "volume_rel_tol": 0.005, "iou_min": 0.995}


def _limits(timeout_s: float) -> Limits:
    # memory: build123d's import alone is ~400 MB of address space; the cgroup (when present)
    # counts the cell's zygote separately (its base is measured at start)
    return Limits(timeout_s=timeout_s, cpu_s=timeout_s + 5, memory_mb=1536, pids=64, output_bytes=48 << 20,
                  file_size_mb=64)


@dataclass
class BuildOutcome:
    built: bool = False
    error: str = ""
    stage: str = ""
    output: str = ""
    brep: bytes | None = None  # zlib-compressed BREP text
    infra: str | None = None
    wall_s: float = 0.0


@dataclass
class Measurement:
    cand: dict[str, Any] = field(default_factory=dict)
    ref: dict[str, Any] | None = None
    iou: float | None = None
    notes: list[str] = field(default_factory=list)
    svg: str | None = None
    render: dict[str, Any] | None = None
    inside: list[bool] | None = None  # per probe point (measure(probes=...)): inside the candidate
    infra: str | None = None
    cand_error: str | None = None


class CadBoxes:
    """Runs BUILD and MEASURE jobs in `cad` boxes: warm cells (default) or cold boxes."""

    def __init__(self, mode: str | None = None, cells: int | None = None) -> None:
        self.mode = mode or os.environ.get("HONING_CAD_MODE", "warm")
        if self.mode not in ("warm", "cold"):
            raise SandboxError(f"HONING_CAD_MODE must be warm or cold, got {self.mode!r}")
        self.cells = cells or int(os.environ.get("HONING_CAD_CELLS", "2"))
        self._pool: Any = None
        self._sandbox: Any = None
        self._lock = threading.Lock()
        self._refs: OrderedDict[str, bytes] = OrderedDict()  # reference program sha -> its BREP (zlib)

    def _run(self, code: str, files: dict[str, bytes | str], timeout_s: float) -> Any:
        from honing.sandbox.profiles import get_profile

        get_profile("cad")  # a missing toolchain: SandboxError (-> infra), with the fix in the message
        with self._lock:
            if self.mode == "warm" and self._pool is None:
                from honing.sandbox.warm import WarmPool

                self._pool = WarmPool(size=self.cells, profile="cad", preload=["build123d"], limits=_limits(60),
                                      start_timeout_s=180)
            if self.mode == "cold" and self._sandbox is None:
                from honing.sandbox import Sandbox

                self._sandbox = Sandbox("bwrap", max_concurrency=self.cells)
        if self.mode == "warm":
            return self._pool.run_python(code, files=files, limits=_limits(timeout_s))
        return self._sandbox.exec(["python3", "-s", "-c", code], files=files, profile="cad",
                                  limits=_limits(timeout_s + 15))  # + the import a cold box pays

    @staticmethod
    def _reply(res: Any, nonce: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the runner's report, infra problem). The one line starting with the nonce, or nothing."""
        if res.infra_error:
            return None, f"sandbox: {res.infra_error}"
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
        if len(lines) != 1:
            return None, None
        try:
            rep = json.loads(lines[0][len(nonce) + 1:])
        except ValueError:
            return None, None
        if not isinstance(rep, dict):
            return None, None
        if rep.get("infra"):
            return None, str(rep["infra"])
        return rep, None

    def build(self, script: str, timeout_s: float = BUILD_TIMEOUT_S) -> BuildOutcome:
        t0 = time.perf_counter()
        nonce = secrets.token_hex(16)
        spec = {"script": SCRIPT, "timeout_s": timeout_s, "max_brep_bytes": MAX_BREP, "max_output_bytes": 16384}
        files = {SCRIPT: script, ".grader/spec.json": json.dumps(spec), ".grader/nonce": nonce}
        try:
            res = self._run(build_src(), files, timeout_s + 10)
        except SandboxError as e:
            return BuildOutcome(infra=str(e), wall_s=time.perf_counter() - t0)
        rep, infra = self._reply(res, nonce)
        out = BuildOutcome(infra=infra, wall_s=time.perf_counter() - t0)
        if infra:
            return out
        if rep is None:  # the runner never reported: killed from inside the box, or the box's limits hit
            why = "timed out" if res.timed_out else "ran out of memory" if res.oom else f"exit {res.exit_code}"
            out.error, out.stage = f"the grader's runner was stopped ({why}) before it could report", "crash"
            return out
        out.output = str(rep.get("output", ""))
        out.built, out.stage, out.error = bool(rep.get("built")), str(rep.get("stage", "")), str(rep.get("error", ""))
        if out.built:
            try:
                out.brep = base64.b64decode(str(rep["brep"]))
            except (KeyError, ValueError):
                out.built, out.error = False, "malformed BREP from the runner"
        return out

    def measure(self, brep: bytes, ref_program: str | None = None, render: bool = False,
                timeout_s: float = 30.0, probes: list[list[float]] | None = None) -> Measurement:
        nonce = secrets.token_hex(16)
        files: dict[str, bytes | str] = {".grader/cand.brepz": brep, ".grader/nonce": nonce}
        key = hashlib.sha256(ref_program.encode()).hexdigest() if ref_program else ""
        ref_mode = None
        if ref_program:
            with self._lock:
                cached = self._refs.get(key)
            if cached is not None:
                files[".grader/ref.brepz"], ref_mode = cached, "brep"
            else:
                files[".grader/ref.py"], ref_mode = ref_program, "program"
        files[".grader/spec.json"] = json.dumps({"ref": ref_mode, "render": render, "probes": probes or []})
        try:
            res = self._run(MEASURE_SRC, files, timeout_s)
        except SandboxError as e:
            return Measurement(infra=str(e))
        rep, infra = self._reply(res, nonce)
        if rep is None and not infra and (res.timed_out or res.oom):
            # only grader code runs here, on the candidate's BREP: a part too complex to measure
            # in time is the candidate's, and must not become an (unscored) infrastructure error
            return Measurement(cand_error=f"measuring the part ran past the measuring box's "
                                          f"{'time' if res.timed_out else 'memory'} limit (too complex)")
        if infra or rep is None:
            return Measurement(infra=infra or f"the measuring box gave no report (exit {res.exit_code}, "
                                              f"timed_out={res.timed_out}): {res.stderr[-300:]}")
        if rep.get("cand_error"):
            return Measurement(cand_error=str(rep["cand_error"]))
        if ref_mode == "program" and rep.get("ref_brep"):
            with self._lock:
                self._refs[key] = base64.b64decode(rep["ref_brep"])
                while len(self._refs) > 512:
                    self._refs.popitem(last=False)
        inside = rep.get("inside")
        if probes and (not isinstance(inside, list) or len(inside) != len(probes)):
            inside = None
        m = Measurement(cand=rep.get("cand") or {}, ref=rep.get("ref"), iou=rep.get("iou"), svg=rep.get("svg"),
                        render=rep.get("render"), inside=[bool(x) for x in inside] if inside else None)
        for k in ("iou_error", "render_error", "probe_error"):
            if rep.get(k):
                m.notes.append(f"{k}: {rep[k]}")
        return m

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None


_BOXES: CadBoxes | None = None
_BOXES_LOCK = threading.Lock()


def boxes() -> CadBoxes:
    global _BOXES
    with _BOXES_LOCK:
        if _BOXES is None:
            _BOXES = CadBoxes()
        return _BOXES


# --- scoring ---------------------------------------------------------------------------------------
def layer_scores(m: Measurement, spec: dict[str, Any], params: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """Per-layer scores of a measured candidate against the reference's measurement (pure)."""
    p = {**DEFAULTS, **{k: v for k, v in params.items() if k in DEFAULTS}}
    c, r = m.cand, m.ref or {}
    notes: list[str] = []
    comp = {"build": 1.0, "valid": float(bool(c.get("valid")))}
    if not comp["valid"]:
        notes.append("the solid is not valid (BRepCheck)")
    want_min, want_max = spec.get("bbox_min") or r.get("bbox_min"), spec.get("bbox_max") or r.get("bbox_max")
    got = list(c.get("bbox_min", [])) + list(c.get("bbox_max", []))
    want = list(want_min) + list(want_max)
    within = [abs(g - w) <= p["tolerance_mm"] for g, w in zip(got, want)] if len(got) == 6 else [False] * 6
    comp["bbox"] = sum(within) / 6
    if comp["bbox"] < 1:
        notes.append("bbox " + _vec(c.get("bbox_min")) + ".." + _vec(c.get("bbox_max")) + " vs " + _vec(want_min)
                     + ".." + _vec(want_max))
    vol_ok = comp["valid"] and r.get("volume", 0) > 0 and \
        abs(c.get("volume", 0.0) - r["volume"]) <= p["volume_rel_tol"] * r["volume"]
    comp["volume"] = float(bool(vol_ok))
    if not vol_ok and r.get("volume"):
        notes.append(f"volume {c.get('volume', 0):.1f} vs {r['volume']:.1f} mm3")
    iou = m.iou if (m.iou is not None and comp["valid"]) else 0.0
    comp["iou_value"] = float(iou)
    comp["iou"] = 1.0 if iou >= p["iou_min"] else max(0.0, (iou - 0.5) / (p["iou_min"] - 0.5))
    if comp["iou"] < 1:
        notes.append(f"IoU {iou:.4f}")
    same = [c.get(k) == r.get(k) for k in ("faces", "edges", "cylinders")]
    comp["features"] = sum(same) / 3
    if comp["features"] < 1:
        notes.append("faces/edges/cylindrical faces " + "/".join(str(c.get(k)) for k in ("faces", "edges", "cylinders"))
                     + " vs " + "/".join(str(r.get(k)) for k in ("faces", "edges", "cylinders")))
    return comp, notes


def _vec(v: Any) -> str:
    return "(" + ", ".join(f"{x:.2f}" for x in v) + ")" if v else "?"


def total(comp: dict[str, float]) -> float:
    return comp.get("build", 0.0) * comp.get("valid", 0.0) * sum(w * comp.get(k, 0.0) for k, w in WEIGHTS.items())


def grade_script(script: str, task: Any, runner: CadBoxes | None = None) -> Verdict:
    """Grade one script against `task`'s hidden reference (see the module docstring)."""
    t0 = time.perf_counter()
    runner = runner or boxes()
    hidden = dict(task.hidden)
    zero = {"build": 0.0, "valid": 0.0, **{k: 0.0 for k in WEIGHTS}}
    if not script.strip():
        return Verdict(0.0, False, zero, "no script to grade", cost_s=time.perf_counter() - t0)
    b = runner.build(script, float((task.verifier.params or {}).get("build_timeout_s", BUILD_TIMEOUT_S)))
    if b.infra:
        return Verdict.infra(f"cad: {b.infra}", time.perf_counter() - t0)
    if not b.built or b.brep is None:
        return Verdict(0.0, False, zero, f"does not build ({b.stage}): {b.error}"[:1000], cost_s=time.perf_counter() - t0)
    m = runner.measure(b.brep, hidden["program"])
    if m.infra:
        return Verdict.infra(f"cad: {m.infra}", time.perf_counter() - t0)
    if m.cand_error or m.cand.get("solids") != 1:
        return Verdict(0.0, False, zero, f"does not build: {m.cand_error or 'not exactly one solid'}",
                       cost_s=time.perf_counter() - t0)
    comp, notes = layer_scores(m, dict(hidden.get("spec") or {}), dict(task.verifier.params or {}))
    score = min(1.0, max(0.0, total(comp)))  # float noise must not leave [0, 1]
    passed = all(comp[k] >= 1.0 for k in ("build", "valid", *WEIGHTS))
    return Verdict(score, passed, comp, "; ".join(notes + m.notes) or "matches the reference",
                   cost_s=time.perf_counter() - t0)


def decompress(brep: bytes) -> bytes:
    return zlib.decompress(brep)
