"""`check_environment` catches what it promises to catch: a leaked hidden field (in the prompt or
in what the environment really shows after reset), a wrong reference, a verifier that rewards
junk, splits that share questions, malformed tasks, missing metadata, a failing reference tool
call. Packages are built in-process (`Environment` objects), nothing is installed."""

from __future__ import annotations

import hashlib
import itertools
import sys
from dataclasses import replace
from typing import Any, Iterator

import pytest

from honing.envcheck import check_environment, hidden_values
from honing.envpkg import Environment, register
from honing.errors import HoningError
from honing.tasks.types import Task, VerifierSpec

from .conftest import EXAMPLES, needs_bwrap


def _split(q: str) -> str:
    return "heldout" if int(hashlib.sha256(q.encode()).hexdigest(), 16) % 4 == 0 else "train"


def products(split: str, seed: int, leak: bool = False, overlap: bool = False, broken: bool = False) -> Iterator[dict]:
    for i in itertools.count():
        a, b = 31 + (i * 7 + (0 if overlap else seed)) % 60, 40 + (i * 13) % 59  # overlap: one stream for both
        q = f"What is {a} times {b}?" + (f" (it is {a * b})" if leak else "")
        if not overlap and _split(q) != split:
            continue
        if broken and i == 5:
            yield {"id": "x", "answer": 1}  # no prompt
        yield {"id": f"p/{split}/{seed}/{i}", "prompt": q, "answer": a * b}


def exact(completion: str, answer: int) -> float:
    return float(completion.strip().split()[-1:] == [str(answer)])


def make(name: str, **changes: Any) -> Environment:
    env = Environment(name=name, version="1.0.0", description="products of two numbers", tasks=products,
                      verifier=exact)
    return replace(env, **changes)


def results(report) -> dict[str, str]:
    return {c.name: c.result for c in report.checks}


def test_a_sound_package_passes_and_prints_a_table() -> None:
    report = check_environment(make("chk_good"), n=4)
    assert report.ok, report.table()
    table = report.table()
    assert table.splitlines()[0].split() == ["check", "result", "detail"]
    assert results(report) == {"package": "ok", "fields": "ok", "splits": "ok", "hidden": "ok", "reference": "ok",
                               "junk": "ok", "suite": "skip"}
    assert table.splitlines()[-1] == "env:chk_good 1.0.0: passed"


def test_a_hidden_answer_in_the_prompt_fails() -> None:
    report = check_environment(make("chk_leak", params={"leak": True}), n=4)
    assert results(report)["hidden"] == "FAIL" and not report.ok
    assert "hidden['answer']" in next(c.detail for c in report.checks if c.name == "hidden")


def test_a_wrong_reference_and_a_generous_verifier_fail() -> None:
    wrong = check_environment(make("chk_wrongref", reference=lambda t: str(t.hidden["answer"] + 1)), n=3)
    assert results(wrong)["reference"] == "FAIL" and "score 0" in wrong.checks[4].detail
    generous = check_environment(make("chk_generous", verifier=lambda completion: 1.0), n=3)
    assert results(generous)["junk"] == "FAIL" and results(generous)["reference"] == "ok"
    crash = check_environment(make("chk_crash", verifier=lambda completion: 1 / 0), n=3)
    assert results(crash)["reference"] == "FAIL" and "ZeroDivisionError" in crash.checks[4].detail


def test_shared_questions_and_malformed_tasks_fail() -> None:
    assert results(check_environment(make("chk_overlap", params={"overlap": True}), n=3))["splits"] == "FAIL"
    broken = check_environment(make("chk_broken", params={"broken": True}), n=3)
    assert results(broken) == {"package": "ok", "fields": "FAIL"}
    assert "missing field 'prompt'" in broken.checks[1].detail


def test_metadata_is_required() -> None:
    report = check_environment(make("chk_nometa", description="", version="0.0.0"), n=2)
    assert results(report)["package"] == "FAIL" and "no description" in report.checks[0].detail


def test_an_unknown_name_is_a_user_error() -> None:
    with pytest.raises(HoningError, match="unknown environment package 'surely_not_installed'"):
        check_environment("surely_not_installed")


def test_hidden_values_are_top_level_strings_and_numbers_of_four_characters() -> None:
    t = Task("t", "d", ({"role": "user", "content": "q"},), VerifierSpec("v"),
             hidden={"answer": 1234, "short": "abc", "flag": True, "nested": {"x": "long enough"}, "s": "word"})
    assert hidden_values(t) == {"answer": "1234", "s": "word"}


@pytest.fixture
def calc_env():
    sys.path.insert(0, str(EXAMPLES / "calc_tool"))
    try:
        import honing_env_calc_tool as calc

        yield register(calc.ENV)
    finally:
        sys.path.remove(str(EXAMPLES / "calc_tool"))


@needs_bwrap
def test_a_failing_reference_tool_call_fails(calc_env: Environment) -> None:
    bad = replace(calc_env, name="calc_badref",
                  reference=lambda t: [{"name": "lookup", "arguments": {"item": "nosuch"}}, *calc_env.reference(t)])
    report = check_environment(bad, n=2)
    detail = next(c.detail for c in report.checks if c.name == "reference")
    assert results(report)["reference"] == "FAIL" and "reference turn 1 (lookup) failed" in detail


@needs_bwrap
def test_a_leak_the_environment_makes_at_reset_fails(calc_env: Environment) -> None:
    """Hidden data an environment factory writes into the workspace is only visible after a real
    reset in a real session: the multi-turn check looks there too."""
    import honing_env_calc_tool as calc

    def tasks(split: str, seed: int) -> Iterator[dict]:
        for t in calc.make_tasks(split, seed):
            yield {**t, "hidden": {**t["hidden"], "key": f"secret-{t['id']}"},
                   "environment": {**t["environment"], "kind": "env:calc_leak"}}

    def leaky(task: Any):
        env = calc.make_environment(task)
        reset = env.reset

        def reset_and_leak(task: Any, session: Any) -> str:
            out = reset(task, session)
            session.write("notes.txt", task.hidden["key"])
            return out

        env.reset = reset_and_leak  # type: ignore[method-assign]
        return env

    report = check_environment(replace(calc_env, name="calc_leak", tasks=tasks, environment=leaky, params={}), n=2)
    detail = next((c.detail for c in report.checks if c.name == "hidden"), report.table())
    assert results(report)["hidden"] == "FAIL", report.table()
    assert "workspace file notes.txt after reset" in detail
