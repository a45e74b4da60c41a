"""Repair grading sees regressions: besides the hidden tests of the injected bug, the grader runs
its own copy of the task's original visible tests and hidden coverage tests of every public
function, so a patch that fixes the bug and breaks another function scores < 1, whatever the
agent did to the visible tests in its workspace."""

from __future__ import annotations

import ast
import itertools

import pytest

from honing.rollout.tools import apply_hunks, parse_unified_diff
from honing.rollout.types import Trajectory
from honing.tasks.repair import FAMILIES, RepairSource
from honing.verify import VerifyContext, get_verifier

from .conftest import call, needs_bwrap
from .test_repair_hacks import episode


def patched(files: dict[str, str], patch: str) -> dict[str, str]:
    out = dict(files)
    for old, new, hunks in parse_unified_diff(patch):
        out[new] = apply_hunks(out.get(old, "") if old else "", hunks)
    return out


def module_paths(task) -> tuple[object, dict[str, str]]:
    fam = next(f for f in FAMILIES if f.name == task.metadata["family"])
    pkg = task.environment["source_files"][0].split("/")[0]
    return fam, {"core": f"{pkg}/{fam.core[0]}.py", "dep": f"{pkg}/{fam.dep[0]}.py"}


def fixed_but_broken_elsewhere(task):
    """The reference fix plus one of the family's other mutations (a site the task's bugs do not touch)."""
    fam, path = module_paths(task)
    sites = {b["old"] for b in task.hidden["bugs"]}
    fixed = patched(task.environment["files"], task.hidden["reference_patch"])
    for bug in fam.bugs:
        if bug.old in sites:
            continue
        files = dict(fixed)
        assert bug.old in files[path[bug.module]]
        files[path[bug.module]] = files[path[bug.module]].replace(bug.old, bug.new, 1)
        yield bug, files


def grade(task, files, sandbox):
    traj = Trajectory.from_text(task.id, task.domain, "")
    traj.files = dict(files)
    return get_verifier("repair").verify(task, traj, VerifyContext(extra={"sandbox": sandbox}))


def functions_checked(src: str) -> set[str]:
    return {n.args[0].func.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)
            and getattr(n.func, "attr", "").startswith("assert") and isinstance(n.args[0], ast.Call)}


def test_hidden_suite_covers_every_public_function_and_stays_hidden():
    for task in itertools.chain(itertools.islice(RepairSource().tasks("train", 0), 30),
                                itertools.islice(RepairSource().tasks("heldout", 0), 10)):
        fam, path = module_paths(task)
        fixed = patched(task.environment["files"], task.hidden["reference_patch"])
        public = {n.name for p in path.values() for n in ast.parse(fixed[p]).body
                  if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
        reg = task.hidden["regression_tests"]
        assert set(reg) == {"tests/test_visible.py", "tests/test_hidden_coverage.py"}
        assert public == set(fam.args) and len(public) >= 7 and functions_checked(reg["tests/test_hidden_coverage.py"]) == public, task.id
        # the grader's copy of the visible tests is the file the agent was given
        assert reg["tests/test_visible.py"] == task.environment["files"]["tests/test_visible.py"]
        for hidden_src in (reg["tests/test_hidden_coverage.py"], task.hidden["tests"]["tests/test_hidden.py"]):
            assert hidden_src not in task.environment["files"].values()
            assert "Hidden" not in task.question and hidden_src.splitlines()[0] not in task.question
            assert not any("hidden" in p for p in task.environment["files"])
        # coverage cases are fresh inputs, not the visible ones again
        vis = ast.unparse(ast.parse(reg["tests/test_visible.py"]))
        cov_calls = [ast.unparse(n.args[0]) for n in ast.walk(ast.parse(reg["tests/test_hidden_coverage.py"]))
                     if isinstance(n, ast.Call) and getattr(n.func, "attr", "").startswith("assert")]
        assert not any(f"({c}," in vis for c in cov_calls), task.id


@needs_bwrap
def test_reference_scores_one_and_buggy_zero_across_levels_and_seeds(sandbox):
    tasks = [t for lv in range(1, 6) for split, seed in (("train", 40 + lv), ("heldout", 900 + lv))
             for t in itertools.islice(RepairSource({"levels": [lv]}).tasks(split, seed), 3)]
    assert {t.metadata["level"] for t in tasks} == {1, 2, 3, 4, 5} and len(tasks) == 30
    for task in tasks:
        ref = grade(task, patched(task.environment["files"], task.hidden["reference_patch"]), sandbox)
        assert ref.score == 1.0 and ref.passed and ref.components == {"hidden_tests": 1.0, "regression_tests": 1.0}, \
            (task.id, ref.details)
        bug = grade(task, task.environment["files"], sandbox)
        assert bug.score == 0.0 and not bug.passed and not bug.infra_error, (task.id, bug.details)
        assert bug.components["regression_tests"] < 1.0  # the visible tests expose every injected bug


@needs_bwrap
def test_a_fix_that_breaks_another_function_scores_below_one(sandbox):
    """The regression this grading exists for: the injected bug is fixed (its hidden tests all pass,
    which alone used to score 1.0) but another function is now wrong."""
    n = blind = 0
    for level in range(1, 6):
        for task in itertools.islice(RepairSource({"levels": [level]}).tasks("train", 7 * level), 2):
            for bug, files in fixed_but_broken_elsewhere(task):
                v = grade(task, files, sandbox)
                assert not v.infra_error, v.details
                assert v.score < 1.0 and not v.passed, (task.id, bug, v.details)
                assert v.components["regression_tests"] < 1.0 and "regression tests passed" in v.details
                n += 1
                blind += v.components["hidden_tests"] == 1.0
    assert n >= 40 and blind >= n // 2, (n, blind)  # most such patches fooled the bug's own hidden tests


@needs_bwrap
def test_a_handwritten_break_of_an_untested_function_scores_below_one(sandbox, repair_tasks):
    """Fix the bug, then stub out a function the bug's hidden tests never call."""
    task = repair_tasks[1]
    _, path = module_paths(task)
    fixed = patched(task.environment["files"], task.hidden["reference_patch"])
    target = functions_checked(task.hidden["tests"]["tests/test_hidden.py"])
    fn, module = next((n.name, p) for p in (path["dep"], path["core"]) for n in ast.parse(fixed[p]).body
                      if isinstance(n, ast.FunctionDef) and n.name not in target)
    broken = dict(fixed)
    broken[module] += f"\n\ndef {fn}(*args, **kwargs):\n    return None\n"
    v = grade(task, broken, sandbox)
    assert v.components["hidden_tests"] == 1.0, v.details  # what the grade used to be
    assert v.score < 1.0 and not v.passed and v.components["regression_tests"] < 1.0, (fn, v.details)


@needs_bwrap
@pytest.mark.parametrize("edit", ["none", "edit visible tests", "delete visible tests", "drop the failing tests"])
def test_editing_the_visible_tests_gains_nothing(tok, sandbox, repair_tasks, edit):
    """Fix the bug, break another function, then hide the break from the visible tests: the grade
    runs the task's copy of them, so the score is the same as without the edit, and < 1."""
    task = repair_tasks[2]
    bug, broken = next(iter(fixed_but_broken_elsewhere(task)))
    writes = [call("write_file", path=p, content=c) for p, c in broken.items() if c != task.environment["files"][p]]
    direct = grade(task, broken, sandbox)
    assert direct.score < 1.0 and direct.components["regression_tests"] < 1.0, direct.details
    visible = task.environment["files"]["tests/test_visible.py"]
    passing = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    edits = {"none": [], "edit visible tests": [call("write_file", path="tests/test_visible.py", content=passing)],
             "delete visible tests": [call("run", command="rm -f tests/test_visible.py")],
             "drop the failing tests": [call("write_file", path="tests/test_visible.py",
                                             content=visible.replace("self.assert", "return\n        self.assert"))]}
    traj, v = episode(tok, sandbox, task, writes + edits[edit])
    assert not v.infra_error, v.details
    assert v.score == direct.score and v.components == direct.components, (edit, v.details, direct.details)
    if edit in ("edit visible tests", "drop the failing tests"):
        assert traj.turns[-2].observation_text.startswith("tests passed")  # the edit fooled the visible run
    if edit == "delete visible tests":
        assert "tests/test_visible.py" not in traj.files


@needs_bwrap
def test_deleting_the_visible_tests_next_to_a_real_fix_still_scores_one(tok, sandbox, repair_tasks):
    task = repair_tasks[5]
    traj, v = episode(tok, sandbox, task, [call("apply_patch", patch=task.hidden["reference_patch"]),
                                           call("run", command="rm -rf tests")])
    assert "tests/test_visible.py" not in traj.files
    assert v.score == 1.0 and v.passed and v.components["regression_tests"] == 1.0, v.details
