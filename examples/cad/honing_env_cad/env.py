"""The cad domain's multi-turn environment (generate -> inspect -> correct), its verifier and its
reference episodes.

Tools (one call per reply, honing's <tool_call> format):
- build(code): writes the script to `part.py` in the episode's workspace and runs it in a `cad`
  box; the observation is the error (the script's traceback tail) or a geometry report (bbox,
  size, volume, area, face/edge counts, validity) plus the differences from what the prompt itself
  states (overall bounding box and placement; each stated hole, boss, section, face, fillet and
  chamfer, probed at points around it: features.py), never from the hidden reference;
- render(): a hidden-line SVG of the last built part from a fixed isometric view, written to
  `render.svg` in the workspace, described in text;
- submit(): honing's built-in; ends the episode; the verifier grades the workspace's `part.py`
  (the last build).

What runs where: model code only ever runs in a `cad` box (the grader's runner forks it there);
the tools run on the host and touch the episode's workspace only through its session.
"""

from __future__ import annotations

import hashlib
from typing import Any

from honing.rollout.env import ToolEnvironment
from honing.rollout.tools import Tool, ToolContext, ToolResult, get_tools
from honing.verify.code import extract_program
from honing.verify.types import Verdict, VerifyContext

from honing_env_cad.features import probes
from honing_env_cad.features import report as feature_report
from honing_env_cad.grader import SCRIPT, Measurement, boxes, grade_script
from honing_env_cad.mutate import MUTATIONS

INSTRUCTIONS = (
    "Tools: build(code) runs your build123d script (it must assign the part to `result`) and reports the "
    "part's geometry and how it differs from the stated size and features; render() draws the last built part to "
    "render.svg; submit() ends the task and grades the last built script. One call per reply, e.g.\n"
    '<tool_call>{"name": "build", "arguments": {"code": "from build123d import *\\nresult = Box(10, 10, 10)"}}'
    "</tool_call>")


def geometry_report(m: Measurement, requirements: dict[str, Any] | None,
                    checks: list[tuple[int, list[float], bool, str]] | None = None) -> tuple[str, bool]:
    """The build tool's observation for a built part, and whether it meets the stated requirements
    (`checks`: the stated features' probes, answered in `m.inside`)."""
    c = m.cand
    lo, hi = c.get("bbox_min", [0, 0, 0]), c.get("bbox_max", [0, 0, 0])
    size = [b - a for a, b in zip(lo, hi)]
    lines = [f"built: {c.get('solids')} solid, {'valid' if c.get('valid') else 'NOT VALID'}",
             "bbox: (" + ", ".join(f"{x:.3f}" for x in lo) + ") .. (" + ", ".join(f"{x:.3f}" for x in hi) + ")",
             "size: " + " x ".join(f"{x:.3f}" for x in size) + " mm",
             f"volume: {c.get('volume', 0):.2f} mm3, area: {c.get('area', 0):.2f} mm2",
             f"faces: {c.get('faces')}, edges: {c.get('edges')}, cylindrical faces: {c.get('cylinders')}"]
    ok = bool(c.get("valid")) and c.get("solids") == 1
    if requirements:
        tol = float(requirements.get("tolerance_mm", 0.1))
        diffs = []
        for name, got, want in (("min", lo, requirements["bbox_min"]), ("max", hi, requirements["bbox_max"])):
            for axis, g, w in zip("xyz", got, want):
                if abs(g - w) > tol:
                    diffs.append(f"{axis} {name} is {g:.3f}, the stated part gives {w:g} ({g - w:+.3f} mm)")
        if diffs:
            ok = False
            lines.append("differences from the stated size and placement:\n  " + "\n  ".join(diffs))
        else:
            lines.append("overall size and placement match the stated requirements")
        feats = requirements.get("features") or []
        if feats and checks:
            checked = len({i for i, _, _, _ in checks})
            if m.inside is None:
                lines.append(f"stated features: not checked ({'; '.join(m.notes) or 'no probe answers'})")
            else:
                bad, n_bad = feature_report(feats, checks, m.inside)
                if n_bad:
                    ok = False
                    lines.append(f"stated features that differ ({n_bad} of {checked} checked):\n  " + "\n  ".join(bad))
                else:
                    lines.append(f"stated features: all {checked} checked are as stated")
    return "\n".join(lines), ok


def inspect_part(runner: Any, brep: bytes, task: Any) -> tuple[Measurement, str, bool]:
    """Measure a built part (BREP) against what `task`'s prompt states: (the measurement, the
    geometry report, whether it meets the stated requirements). Text is "" on an infra or part error."""
    req = (task.metadata or {}).get("requirements") if task is not None else None
    checks = probes(req.get("features") or [], float(req.get("tolerance_mm", 0.1))) if req else []
    m = runner.measure(brep, probes=[p for _, p, _, _ in checks] or None)
    if m.infra or m.cand_error:
        return m, "", False
    text, ok = geometry_report(m, req, checks)
    return m, text, ok


def build(ctx: ToolContext, code: str) -> ToolResult:
    if len(code) > 50_000:
        return ToolResult("error: build: the script is longer than 50000 characters", ok=False)
    ctx.session.write(SCRIPT, code)
    runner = boxes()
    b = runner.build(code)
    if b.infra:
        return ToolResult(f"error: build: the cad sandbox failed: {b.infra}", ok=False, infra_error=b.infra)
    out = b.output.strip()
    tail = f"\n--- output ---\n{out[-1500:]}" if out else ""
    if not b.built or b.brep is None:
        return ToolResult(f"build failed ({b.stage}): {b.error}{tail}", ok=False, kind="test")
    m, text, ok = inspect_part(runner, b.brep, ctx.task)
    if m.infra:
        return ToolResult(f"error: build: the cad sandbox failed: {m.infra}", ok=False, infra_error=m.infra)
    if m.cand_error:
        return ToolResult(f"build failed: {m.cand_error}{tail}", ok=False, kind="test")
    return ToolResult(text + tail, ok=ok, kind="test")


def render(ctx: ToolContext) -> ToolResult:
    try:
        code = ctx.session.read(SCRIPT).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - no part.py yet
        return ToolResult("error: render: nothing built yet (call build first)", ok=False)
    runner = boxes()
    b = runner.build(code)
    if b.infra:
        return ToolResult(f"error: render: the cad sandbox failed: {b.infra}", ok=False, infra_error=b.infra)
    if not b.built or b.brep is None:
        return ToolResult(f"error: render: the last script does not build ({b.stage}): {b.error}", ok=False)
    m = runner.measure(b.brep, render=True)
    if m.infra:
        return ToolResult(f"error: render: the cad sandbox failed: {m.infra}", ok=False, infra_error=m.infra)
    if not m.svg:
        return ToolResult(f"error: render: {'; '.join(m.notes) or 'no picture'}", ok=False)
    ctx.session.write("render.svg", m.svg)
    r = m.render or {}
    return ToolResult(f"wrote render.svg ({len(m.svg)} bytes): hidden-line isometric view from (150, -200, 120), "
                      f"Z up; {r.get('visible_edges')} visible and {r.get('hidden_edges')} hidden edges (dotted)")


def _schema(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


BUILD = Tool("build", "Run a build123d script (assign the part to `result`); get its geometry report or its error.",
             _schema({"code": {"type": "string"}}), build)
RENDER = Tool("render", "Draw the last built part (hidden-line SVG, isometric) to render.svg.", _schema({}), render)
TOOLS = (BUILD, RENDER)  # the package's own tools; `submit` is honing's built-in (it ends the episode)


def make_environment(task: Any) -> ToolEnvironment:
    return ToolEnvironment([*TOOLS, *get_tools(["submit"])], max_output_chars=2500, instructions=INSTRUCTIONS)


class CadVerifier:
    """Grades the last built `part.py` of a multi-turn episode, or the last ```python block of a
    single-turn reply (grader.py has the layers)."""

    needs_sandbox = True

    def verify(self, task: Any, trajectory: Any, ctx: VerifyContext) -> Verdict:
        if task.environment:
            script = (trajectory.files or {}).get(SCRIPT)
            if script is None:
                return Verdict(0.0, False, {"build": 0.0}, "the episode never built a script (no part.py)")
        else:
            script, _ = extract_program(trajectory.completion_text)
        return grade_script(str(script), task)


def reference_episode(task: Any) -> Any:
    """The reference program: built once, then submitted (multi-turn), or as one python block.

    A task marked `metadata.demo == "correction"` (the source's `correction_demos`) gets a correction
    episode instead: a deliberately wrong program (mutate.py: a wrong size, a missing feature, a hole
    too few) is built first, shown but not trained on ("train": False: SFT's loss mask is 0 on it),
    and the trained turns are what follows its build report: the reference program, built, submitted."""
    program = task.hidden["program"]
    if not task.environment:
        return "```python\n" + program + "```"
    episode = [{"name": "build", "arguments": {"code": program}}, {"name": "submit", "arguments": {}}]
    if (task.metadata or {}).get("demo") == "correction":
        wrong = [w for w in (fn(program) for fn, _ in MUTATIONS.values()) if w and w != program]
        if wrong:
            pick = int(hashlib.sha256(str(task.id).encode()).hexdigest()[:8], 16) % len(wrong)
            episode.insert(0, {"name": "build", "arguments": {"code": wrong[pick]}, "train": False})
    return episode
