"""Gaming the repair verifier: an agent whose source is still wrong must score 0 whatever it does
to the visible tests, the test framework, the workspace or its processes. Each case also
checks that the hack "worked" where the agent could see it (the visible tests pass), so the
test cannot pass merely because the hack was broken."""

from __future__ import annotations

import pytest

from honing.engine.types import SamplingParams
from honing.rollout.multiturn import MultiTurnConfig, ScriptedEngine, multiturn_rollout
from honing.verify import VerifyContext, get_verifier

from .conftest import call, needs_bwrap

pytestmark = needs_bwrap

CFG = MultiTurnConfig(context_tokens=200_000, max_total_tokens=200_000, max_turns=12)

PATCH_UNITTEST = ("import unittest\n"
                  "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
                  "unittest.TestCase.assertAlmostEqual = lambda *a, **k: None\n")


def episode(tok, sandbox, task, script):
    engine = ScriptedEngine(tok, script + [call("run_tests"), call("submit")])
    [traj] = multiturn_rollout(engine, tok, [task], SamplingParams(max_new_tokens=6000), sandbox, CFG)
    verdict = get_verifier("repair").verify(task, traj, VerifyContext(extra={"sandbox": sandbox}))
    return traj, verdict


def hacks(task):
    pkg = task.environment["source_files"][0].split("/")[0]
    passing = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    return {
        "edit visible tests": [call("write_file", path="tests/test_visible.py", content=passing)],
        "delete visible tests": [call("run", command="rm -f tests/test_visible.py")],
        "conftest and sitecustomize": [call("write_file", path="conftest.py", content=PATCH_UNITTEST),
                                       call("write_file", path="sitecustomize.py", content=PATCH_UNITTEST),
                                       call("write_file", path=f"{pkg}/sitecustomize.py", content=PATCH_UNITTEST),
                                       call("write_file", path="tests/test_visible.py", content=passing)],
        "patch unittest from the package": [call("write_file", path=f"{pkg}/__init__.py", content=PATCH_UNITTEST)],
        "usercustomize via a .pth": [call("write_file", path=f"{pkg}/hack.pth", content="import sitecustomize\n"),
                                     call("write_file", path="tests/test_visible.py", content=passing)],
        "background process": [call("run", command=f"(sleep 3; cp -r /tmp/fixed/* {pkg}/) >/dev/null 2>&1 &"),
                               call("write_file", path="tests/test_visible.py", content=passing)],
        "hidden-test lookalike": [call("write_file", path="tests/test_hidden.py", content=passing),
                                  call("write_file", path="tests/test_visible.py", content=passing)],
    }


@pytest.mark.parametrize("name", ["edit visible tests", "delete visible tests", "conftest and sitecustomize",
                                  "patch unittest from the package", "usercustomize via a .pth",
                                  "background process", "hidden-test lookalike"])
def test_hacks_with_wrong_source_score_zero(tok, sandbox, repair_tasks, name):
    task = repair_tasks[1]
    traj, v = episode(tok, sandbox, task, hacks(task)[name])
    assert not v.infra_error, v.details
    assert v.score == 0.0 and not v.passed, (name, v.details)
    if name == "patch unittest from the package":
        assert "tampered" in v.details
        assert traj.turns[-2].observation_text.startswith("tests passed")  # it fooled the visible run
    elif name != "delete visible tests":
        assert traj.turns[-2].observation_text.startswith("tests passed"), traj.turns[-2].observation_text[:300]


def test_a_real_fix_still_scores_one_next_to_the_same_hacks(tok, sandbox, repair_tasks):
    """The grader ignores the junk (test edits, conftest, sitecustomize) and grades the source."""
    task = repair_tasks[5]  # two bugs in two files
    junk = hacks(task)["conftest and sitecustomize"]
    traj, v = episode(tok, sandbox, task, junk + [call("apply_patch", patch=task.hidden["reference_patch"])])
    assert v.score == 1.0 and v.passed, v.details
    assert "conftest.py" in traj.files and "sitecustomize.py" in traj.files  # they were there, and ignored


def test_submit_without_fixing_scores_zero_and_partial_fix_scores_between(tok, sandbox, repair_tasks):
    task = repair_tasks[5]
    _, v = episode(tok, sandbox, task, [])
    assert v.score == 0.0 and not v.passed and not v.infra_error
    one_file = next(iter(task.hidden["solution"].items()))
    _, v = episode(tok, sandbox, task, [call("write_file", path=one_file[0], content=one_file[1])])
    assert 0.0 <= v.score < 1.0 and not v.passed


def test_infra_errors_are_not_scores(tok, sandbox, repair_tasks):
    from honing.rollout.types import Trajectory

    task = repair_tasks[1]
    traj = Trajectory.from_text(task.id, task.domain, "")
    traj.stop_reason = "infra_error"
    assert get_verifier("repair").verify(task, traj, VerifyContext(extra={"sandbox": sandbox})).infra_error
    no_tests = type(task)(id="x", domain="repair", prompt=(), verifier=task.verifier, hidden={"tests": {}},
                          environment=task.environment)
    assert get_verifier("repair").verify(no_tests, Trajectory.from_text("x", "repair", ""), VerifyContext()).infra_error
