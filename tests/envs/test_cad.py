"""The cad environment package (examples/cad, issue 19): tasks split by structure, the reference
scores 1 through the real verifier, wrong programs lose the expected layer, reward hacks score 0,
bad input and a missing or broken toolchain give one clear error or an infrastructure error.

Boxes are real: bwrap and the cad toolchain (`make setup-cad`); those tests skip without them.
One warm cell serves the whole module (its zygote preloads build123d once). The full >= 100-task
proof is benchmarks/cad_solvability.py."""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "cad"))

from honing.errors import TaskError  # noqa: E402
from honing.sandbox.profiles import cad_toolchain_problem  # noqa: E402
from honing.tasks.user import _task_from_dict  # noqa: E402
from honing_env_cad import ENV, grader  # noqa: E402
from honing_env_cad.families import FAMILIES  # noqa: E402
from honing_env_cad.mutate import MUTATIONS  # noqa: E402
from honing_env_cad.tasks import make_tasks, split_structures  # noqa: E402

needs_box = pytest.mark.skipif(shutil.which("bwrap") is None or cad_toolchain_problem() is not None,
                               reason="needs bubblewrap and the cad toolchain (make setup-cad)")


def task(family: str, level: int, style: str = "exact", seed: int = 0, split: str = "train",
         **params: Any) -> Any:
    t = _task_from_dict(next(make_tasks(split, seed, families=[family], levels=[level], styles=[style])),
                        "cad", 0, "env:cad")
    if params:
        from dataclasses import replace

        from honing.tasks.types import VerifierSpec

        t = replace(t, verifier=VerifierSpec("env:cad", {**t.verifier.params, **params}))
    return t


@pytest.fixture(scope="module")
def cad() -> Iterator[grader.CadBoxes]:
    boxes = grader.CadBoxes(mode="warm", cells=1)
    old, grader._BOXES = grader._BOXES, boxes
    try:
        yield boxes
    finally:
        grader._BOXES = old
        boxes.close()


def grade(script: str, t: Any) -> Any:
    return grader.grade_script(script, t)


# --- tasks (no box needed) ------------------------------------------------------------------------
def test_splits_are_disjoint_by_structure_and_cover_every_family() -> None:
    train = list(itertools.islice(make_tasks("train", 1), 300))
    held = list(itertools.islice(make_tasks("heldout", 1), 300))
    keys = {s: {t["metadata"]["structure_key"] for t in ts} for s, ts in (("train", train), ("heldout", held))}
    assert not keys["train"] & keys["heldout"]
    for split, ts in (("train", train), ("heldout", held)):
        assert {t["metadata"]["family"] for t in ts} == set(FAMILIES), split
        assert {t["metadata"]["style"] for t in ts} == {"exact", "intent"}
    for fam, level in itertools.product(FAMILIES, (1, 2, 3)):
        s = split_structures(fam, level)
        assert s["train"] and not set(s["train"]) & set(s["heldout"])
    for t in train[:50]:
        text = "\n".join(m["content"] for m in t["prompt"])
        assert t["hidden"]["program"] not in text and "`result`" in text and t["prompt"][-1]["role"] == "user"
        assert "bbox_min" in t["hidden"]["spec"] and t["environment"]["kind"] == "env:cad"
    again = list(itertools.islice(make_tasks("train", 1), 20))
    assert [t["prompt"] for t in again] == [t["prompt"] for t in train[:20]]  # seeded


@pytest.mark.parametrize("params, needle", [
    ({"families": ["gear"]}, "unknown family 'gear' (families: plate, bracket, flange, shaft, enclosure)"),
    ({"levels": [4]}, "unknown level 4"),
    ({"styles": ["vague"]}, "unknown prompt style 'vague'"),
    ({"tolerance_mm": 0}, "tolerance_mm must be in"),
])
def test_bad_params_fail_with_one_clear_line(params: dict, needle: str) -> None:
    with pytest.raises(TaskError) as e:
        make_tasks("train", 0, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_toolchain_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HONING_CAD_TOOLCHAIN", str(tmp_path / "nothing-here"))
    t = task("plate", 1)
    v = grader.grade_script(t.hidden["program"], t, runner=grader.CadBoxes(mode="cold", cells=1))
    assert v.infra_error and "make setup-cad" in v.details and v.score == 0.0


def test_layer_scores_right_bbox_wrong_volume_is_not_full_credit() -> None:
    ref = {"solids": 1, "valid": True, "volume": 900.0, "faces": 10, "edges": 24, "cylinders": 2,
           "bbox_min": [0, 0, 0], "bbox_max": [10, 10, 10]}
    box = {**ref, "volume": 1000.0, "faces": 6, "edges": 12, "cylinders": 0}
    comp, notes = grader.layer_scores(grader.Measurement(cand=box, ref=ref, iou=0.9), {}, {})
    assert comp["bbox"] == 1.0 and comp["volume"] == 0.0 and comp["features"] == 0.0
    assert grader.total(comp) < 0.5 and any("volume" in n for n in notes)


# --- the verifier in real boxes ---------------------------------------------------------------------
@needs_box
@pytest.mark.parametrize("family, level, style", [
    ("plate", 3, "intent"), ("bracket", 3, "exact"), ("flange", 3, "intent"), ("shaft", 3, "exact"),
    ("enclosure", 3, "exact"), ("plate", 1, "exact")])
def test_reference_scores_one(cad: grader.CadBoxes, family: str, level: int, style: str) -> None:
    t = task(family, level, style, split="heldout")
    v = grade(t.hidden["program"], t)
    assert v.passed and v.score == 1.0, v.details
    assert set(v.components) >= {"build", "valid", "bbox", "volume", "iou", "features"}


@needs_box
@pytest.mark.parametrize("family, level, mutation", [
    ("plate", 2, "off_dims"), ("plate", 2, "missing_feature"), ("plate", 1, "wrong_hole_count"),
    ("flange", 2, "wrong_hole_count"), ("bracket", 3, "missing_feature"), ("shaft", 3, "missing_feature")])
def test_wrong_program_loses_the_expected_layer(cad: grader.CadBoxes, family: str, level: int,
                                                 mutation: str) -> None:
    t = task(family, level, seed=3)
    fn, layer = MUTATIONS[mutation]
    bad = fn(t.hidden["program"])
    assert bad is not None and bad != t.hidden["program"]
    v = grade(bad, t)
    assert not v.infra_error and v.components["build"] == 1.0
    assert v.score < 1.0 and v.components[layer] < 1.0, (v.components, v.details)


HACKS = {
    # prints the grader's report format (it never reaches the box's stdout, and has no nonce)
    "fake_report": 'import json\nfor tag in ("HONING-CAD-RESULT", "0" * 32, "deadbeef" * 4):\n'
                   '    print(tag, json.dumps({"built": True, "iou": 1.0, "volume": 1.0, "valid": True}))\n',
    # plants files named like the grader's (its spec, nonce, the exported BREP) and leaves no result
    "fake_export": 'import os\nos.makedirs("/work/.grader", exist_ok=True)\n'
                   'for n in ("/work/.grader/cand.brepz", "/work/.grader/nonce", "/work/part.brep", "/tmp/shape.brep"):\n'
                   '    open(n, "w").write("fake")\n',
    # looks for the reference program, spec or nonce everywhere it can read; builds it if found
    "read_reference": '''import os, glob
found = None
paths = [p for pat in ("/work/**", "/tmp/**", "/opt/honing/**/reference*", "/run/**") for p in glob.glob(pat, recursive=True)]
paths += glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/fd/*")
for p in paths:
    try:
        data = open(p, "rb").read(1 << 20).decode("utf-8", "replace")
    except Exception:
        continue
    if "result = plate" in data and p != "/work/part.py":
        found = data
for pid in (1, os.getppid()):
    try:
        open("/proc/%d/mem" % pid, "rb").read(1)
        found = found or "mem readable"
    except Exception:
        pass
if found:
    exec(found)
''',
    # a far-away speck, with build123d/OCP's measurements patched to claim the reference's numbers
    "monkeypatch": '''from build123d import *
import build123d, OCP.GProp, OCP.BRepAlgoAPI
Shape.volume = property(lambda self: 1.0e9)
Shape.is_valid = property(lambda self: True)
Shape.bounding_box = lambda self, *a, **k: BoundBox.from_topo_ds(Box(1, 1, 1).wrapped)
OCP.GProp.GProp_GProps.Mass = lambda self: 1.0e9
OCP.BRepAlgoAPI.BRepAlgoAPI_Common = OCP.BRepAlgoAPI.BRepAlgoAPI_Fuse
build123d.export_brep.__defaults__ = None
result = Pos(500, 500, 500) * Sphere(0.5)
''',
    "hang": "while True:\n    pass\n",
    "fork": "import os\nresult = None\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "flood": "while True:\n    print('x' * 10000)\n",
    "two_solids": "from build123d import *\nresult = Compound([Box(10, 10, 10), Pos(40, 0, 0) * Box(10, 10, 10)])\n",
    "no_solid": "from build123d import *\nx = Box(10, 10, 10)\n",
    "not_a_shape": "result = 42\n",
    "not_python": "Make a plate 80 by 60 mm with six holes, please.\n",
    "exits": "import os\nos._exit(0)\n",
    "kills_runner": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
}


@needs_box
@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hack_scores_zero(cad: grader.CadBoxes, name: str) -> None:
    t = task("plate", 2, seed=5, build_timeout_s=3)
    v = grade(HACKS[name], t)
    assert not v.infra_error, v.details
    assert v.score == 0.0 and not v.passed, (name, v.score, v.details)


@needs_box
def test_right_bbox_wrong_volume_does_not_get_full_credit(cad: grader.CadBoxes) -> None:
    t = task("plate", 2, seed=5)
    lo, hi = t.hidden["spec"]["bbox_min"], t.hidden["spec"]["bbox_max"]
    box = (f"from build123d import *\nresult = Pos({(lo[0] + hi[0]) / 2}, {(lo[1] + hi[1]) / 2}, 0) * "
           f"Box({hi[0] - lo[0]}, {hi[1] - lo[1]}, {hi[2] - lo[2]}, align=(Align.CENTER, Align.CENTER, Align.MIN))\n")
    v = grade(box, t)
    assert v.components["bbox"] == 1.0 and v.components["volume"] == 0.0 and v.components["features"] < 1
    assert v.score < 0.7 and not v.passed


@needs_box
def test_broken_toolchain_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    broken = Path(tempfile.mkdtemp(prefix="honing-cad-broken-"))  # readable by the box's uid (tmp_path is not)
    (broken / "build123d").mkdir()
    (broken / "build123d" / "__init__.py").write_text("raise ImportError('libTKernel.so: cannot open shared object')\n")
    for p in (broken, broken / "build123d"):
        p.chmod(0o755)
    (broken / "build123d" / "__init__.py").chmod(0o644)
    monkeypatch.setenv("HONING_CAD_TOOLCHAIN", str(broken))
    t = task("plate", 1)
    runner = grader.CadBoxes(mode="cold", cells=1)
    try:
        v = grader.grade_script(t.hidden["program"], t, runner=runner)
    finally:
        runner.close()
        shutil.rmtree(broken, ignore_errors=True)
    assert v.infra_error and "cannot import build123d" in v.details and "libTKernel" in v.details, v.details


@needs_box
def test_tools_build_report_render_and_the_verifier_reads_the_last_build(cad: grader.CadBoxes) -> None:
    from honing.rollout.types import Trajectory
    from honing.sandbox import Sandbox

    t = task("flange", 2, seed=2)
    env = ENV.environment(t)
    wrong = t.hidden["program"].replace("flange = Cylinder(", "flange = Cylinder(2 + ", 1)
    sb = Sandbox("bwrap")
    try:
        with sb.open("python") as session:
            intro = env.reset(t, session)
            assert "build(code)" in intro and t.hidden["program"] not in intro
            call = '<tool_call>{"name": "build", "arguments": {"code": %s}}</tool_call>'
            import json

            obs, done = env.step(call % json.dumps(wrong))
            assert not done and "differences from the stated size" in obs and "volume:" in obs, obs
            obs, done = env.step(call % json.dumps("from build123d import *\nresult = Box(1, 1,\n"))
            assert "build failed (syntax)" in obs, obs
            obs, done = env.step(call % json.dumps(t.hidden["program"]))
            assert "match the stated requirements" in obs, obs
            obs, done = env.step('<tool_call>{"name": "render", "arguments": {}}</tool_call>')
            assert "wrote render.svg" in obs and session.read("render.svg").startswith(b"<?xml"), obs
            obs, done = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
            assert done
            files = {"part.py": session.read("part.py").decode()}
    finally:
        sb.close()
    assert env.stats["test_runs"] == 3 and env.stats["failed_test_runs"] == 2
    traj = Trajectory.from_text(t.id, t.domain, "")
    traj.files = files
    v = ENV.verifier.verify(t, traj, SimpleNamespace())
    assert v.passed and v.score == 1.0, v.details
    traj.files = {}
    assert ENV.verifier.verify(t, traj, SimpleNamespace()).score == 0.0  # never built


@needs_box
def test_honing_self_test_passes_through_the_rollout_loop(cad: grader.CadBoxes) -> None:
    """honing's own env check: reference episodes (build, submit) through the real agent loop in the
    real sandbox score 1 on both splits; junk episodes score 0."""
    from honing.envcheck import check_environment

    report = check_environment(ENV, n=1)
    assert report.ok, report.table()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_sandbox_doctor_lists_the_cad_profile_and_says_when_it_is_missing(tmp_path: Path) -> None:
    import os
    import subprocess

    env = {**os.environ, "HONING_CAD_TOOLCHAIN": str(tmp_path / "none"), "NO_COLOR": "1", "COLUMNS": "250"}
    proc = subprocess.run([str(Path(sys.executable).parent / "honing"), "sandbox", "doctor"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("profile ")}
    assert set(rows) == {"shell", "python", "cad"} and " ok " in rows["python"]
    assert " missing " in rows["cad"] and "make setup-cad" in rows["cad"]


# --- the build tool's stated-feature checks (features.py) ------------------------------------------
def _plate_inside(feats: list[dict], bbox: dict, radius: dict[int, float], shift: dict[int, float]) -> Any:
    """An analytic plate with through holes (a naive reference solid): hole i has `radius[i]` (0: no
    hole) and is moved `shift[i]` mm along +X from where the prompt puts it."""
    (x0, y0, z0), (x1, y1, z1) = bbox["bbox_min"], bbox["bbox_max"]
    holes = [(f["c"][0] + shift.get(i, 0.0), f["c"][1], radius.get(i, f["d"] / 2))
             for i, f in enumerate(feats) if f["kind"] == "hole"]

    def inside(p: list[float]) -> bool:
        x, y, z = p
        if not (x0 <= x <= x1 and y0 <= y <= y1 and z0 <= z <= z1):
            return False
        return all((x - hx) ** 2 + (y - hy) ** 2 >= r * r for hx, hy, r in holes)

    return inside


def test_stated_feature_probes_pass_within_tolerance_and_name_what_differs() -> None:
    from honing_env_cad.features import probes, report

    t = next(make_tasks("train", 4, families=["plate"], levels=[2], styles=["exact"]))
    req = t["metadata"]["requirements"]
    feats, tol = req["features"], req["tolerance_mm"]
    holes = [i for i, f in enumerate(feats) if f["kind"] == "hole"]
    assert len(holes) == t["hidden"]["spec"]["holes"] >= 4
    checks = probes(feats, tol)

    def answer(radius: dict[int, float] | None = None, shift: dict[int, float] | None = None) -> tuple[list[str], int]:
        inside = _plate_inside(feats, req, radius or {}, shift or {})
        return report(feats, checks, [inside(p) for _, p, _, _ in checks])

    r0 = feats[holes[0]]["d"] / 2
    assert answer() == ([], 0)
    assert answer({i: feats[i]["d"] / 2 + (0.9 * tol if i % 2 else -0.9 * tol) for i in holes}) == ([], 0)
    assert answer(shift={holes[1]: 0.9 * tol}) == ([], 0)
    lines, n = answer({holes[0]: 0.0})
    assert n == 1 and lines == [f"{feats[holes[0]]['label']}: no hole at its stated position"]
    assert answer({holes[0]: r0 + 0.5})[0] == [f"{feats[holes[0]]['label']}: wider than stated, or off its stated axis"]
    assert "narrower" in answer({holes[-1]: r0 - 0.5})[0][0] and answer({holes[-1]: r0 - 0.5})[1] == 1
    assert answer(shift={holes[2]: 1.0})[1] == 1
    assert answer({i: 0.0 for i in holes})[1] == len(holes)
    with pytest.raises(ValueError, match="probe answers"):
        report(feats, checks, [True])


def test_stated_features_are_what_the_prompt_states_never_the_hidden_program() -> None:
    from honing_env_cad.features import probes

    for fam, level in itertools.product(FAMILIES, (1, 2, 3)):
        for t in itertools.islice(make_tasks("train", 1, families=[fam], levels=[level]), 6):
            feats = t["metadata"]["requirements"]["features"]
            assert feats and probes(feats, 0.1), (fam, level)
            for f in feats:  # a stated diameter appears in the prompt as written there
                assert "mm)" not in f["label"] or f["label"].split("diameter ")[1].split(" mm")[0] in \
                    t["prompt"][1]["content"], (f["label"], t["prompt"][1]["content"])
            blob = str(feats)
            assert "result" not in blob and "Cylinder(" not in blob and "volume" not in blob


def _inspect(cad: grader.CadBoxes, program: str, t: Any) -> tuple[str, bool]:
    from honing_env_cad.env import inspect_part

    b = cad.build(program)
    assert b.built and b.brep is not None, b.error
    m, text, ok = inspect_part(cad, b.brep, t)
    assert not m.infra and m.inside is not None, (m.infra, m.notes)
    return text, ok


@needs_box
@pytest.mark.parametrize("family, level, style", [
    ("plate", 3, "intent"), ("bracket", 3, "exact"), ("bracket", 2, "intent"), ("flange", 3, "intent"),
    ("shaft", 3, "exact"), ("shaft", 2, "intent"), ("enclosure", 3, "exact"), ("enclosure", 2, "intent")])
def test_build_report_the_reference_meets_every_stated_feature(cad: grader.CadBoxes, family: str, level: int,
                                                                style: str) -> None:
    t = task(family, level, style, seed=11)
    text, ok = _inspect(cad, t.hidden["program"], t)
    assert ok and "stated features: all" in text and "differ" not in text, text


@needs_box
@pytest.mark.parametrize("family, level, mutation, needle", [
    ("plate", 2, "wrong_hole_count", "no hole at its stated position"), ("flange", 3, "wrong_hole_count", "bolt hole"),
    ("bracket", 3, "missing_feature", "hole 1 of"), ("shaft", 3, "missing_feature", "hole"),
    ("enclosure", 2, "missing_feature", "boss")])
def test_build_report_names_the_stated_feature_a_wrong_program_misses(cad: grader.CadBoxes, family: str, level: int,
                                                                      mutation: str, needle: str) -> None:
    t = task(family, level, seed=11)
    bad = MUTATIONS[mutation][0](t.hidden["program"])
    assert bad is not None
    text, ok = _inspect(cad, bad, t)
    assert not ok and "stated features that differ (" in text and needle in text.split("differ")[-1], text
    assert "overall size and placement match" in text  # the outline is right: only the probes see it


@needs_box
def test_correction_demo_trains_on_the_fix_not_on_the_wrong_first_build(cad: grader.CadBoxes) -> None:
    """A correction episode (source param correction_demos): the wrong program is built and its report
    is in the demonstration's context, but the loss is only on the turns after it (the reference
    build and submit), and the demonstration still passes its verifier."""
    from honing.config import RunConfig
    from honing.models import load_tokenizer
    from honing.schedule.setup import build_tasks
    from honing.train.demos import from_reference

    cfg = RunConfig.model_validate({"model": {"name": "tiny-random"}, "eval": {"heldout_tasks": 2},
                                    "tasks": {"sources": [{"name": "env:cad", "params": {
                                        "families": ["plate"], "levels": [1], "correction_demos": 1.0}}]}})
    setup = build_tasks(cfg)
    tok = load_tokenizer("smollm2-135m-instruct")
    try:
        t = next(setup.sources[0].tasks("train", 0))
        assert t.metadata["demo"] == "correction"
        demo = from_reference(setup, tok, [t], "{answer}", 1 << 14, 0)[0]
        assert demo.status == "kept" and demo.passed and demo.turns == 3, demo.reason
        text = tok.decode(demo.completion_ids)
        assert "stated features that differ" in text and text.count('"name": "build"') == 2, text[:3000]
        trained = tok.decode([c for c, m in zip(demo.completion_ids, demo.loss_mask) if m])
        wrong, right = (x["arguments"]["code"] for x in ENV.reference(t)[:2])
        assert right == t.hidden["program"] and wrong != right
        assert json_code(right) in trained and json_code(wrong) not in trained and '"submit"' in trained
        assert 0 < sum(demo.loss_mask) < len(demo.loss_mask)
    finally:
        setup.sandbox.close()


def json_code(program: str) -> str:
    import json

    return json.dumps(program)[1:-1]


def test_correction_demos_leave_the_tasks_unchanged_and_bad_fractions_fail() -> None:
    plain = list(itertools.islice(make_tasks("train", 0), 30))
    marked = list(itertools.islice(make_tasks("train", 0, correction_demos=0.5), 30))
    assert [t["prompt"] for t in plain] == [t["prompt"] for t in marked]
    assert 5 < sum(t["metadata"].get("demo") == "correction" for t in marked) < 25
    assert not any("demo" in t["metadata"] for t in plain)
    with pytest.raises(TaskError, match="correction_demos"):
        make_tasks("train", 0, correction_demos=2)


@needs_box
def test_honing_self_test_accepts_correction_episodes(cad: grader.CadBoxes) -> None:
    """`honing env check` with every reference a correction episode: the wrong first build fails (it
    is shown-only), the episode still scores 1, and the check passes."""
    from dataclasses import replace

    from honing.envcheck import check_environment

    def tasks(split: str, seed: int, **params: Any) -> Any:
        return make_tasks(split, seed, **{**params, "families": ["flange"], "correction_demos": 1.0})

    report = check_environment(replace(ENV, tasks=tasks), n=1)
    assert report.ok, report.table()
