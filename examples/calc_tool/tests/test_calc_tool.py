"""calc_tool's own tests: the tools act in a real sandbox session, the verifier reads the
submitted value, and honing's self-test passes."""

from __future__ import annotations

import itertools
import shutil

import pytest

from honing_env_calc_tool import CALCULATOR, ENV, LOOKUP, make_tasks, score

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def test_answers_never_readable_and_splits_disjoint() -> None:
    train = list(itertools.islice(make_tasks("train", 0), 40))
    held = list(itertools.islice(make_tasks("heldout", 0), 40))
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in held}
    for t in train + held:
        assert str(t["hidden"]["answer"]) not in t["prompt"] + t["environment"]["files"]["catalog.txt"]


def test_score_needs_a_successful_submit() -> None:
    from honing.rollout.types import Trajectory

    assert score("42", 42, Trajectory.from_text("t", "d", "42")) == 0.0  # no episode, no submit


@needs_bwrap
def test_tools_run_in_the_sandbox_session() -> None:
    from honing.rollout.tools import ToolContext
    from honing.sandbox import Limits, Sandbox

    sb = Sandbox("bwrap")
    try:
        with sb.open("python") as session:
            session.write("catalog.txt", "gear: 12\nvalve: 30\n")
            ctx = ToolContext(session, None, Limits(timeout_s=10))
            assert LOOKUP.call(ctx, {"item": "Gear"}).text == "gear: 12"
            assert not LOOKUP.call(ctx, {"item": "nope"}).ok
            assert CALCULATOR.call(ctx, {"expression": "3*12 + 2*30"}).text == "96"
            bad = CALCULATOR.call(ctx, {"expression": "__import__('os').system('id')"})
            assert not bad.ok and "only numbers" in bad.text
    finally:
        sb.close()


@needs_bwrap
def test_honing_self_test_passes() -> None:
    from honing.envcheck import check_environment

    report = check_environment(ENV, n=3)
    assert report.ok, report.table()
