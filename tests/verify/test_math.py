"""The `math` verifier: fast paths, math-verify slow path in worker processes, timeouts, wiring."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import honing.verify.math as vm
from honing.rollout.types import Trajectory
from honing.tasks import JsonlSource, Task, VerifierSpec
from honing.verify import Verdict, VerifyContext, get_verifier, grade, verifier_names

CTX = VerifyContext()  # extractor "auto": the maths reading


def _task(gold: str, **params: object) -> Task:
    return Task(id="t", domain="d", prompt=({"role": "user", "content": "q"},),
                verifier=VerifierSpec("math", dict(params)), hidden={"answer": gold})


def _grade(gold: str, completion: str, ctx: VerifyContext = CTX, **params: object) -> Verdict:
    return grade(_task(gold, **params), completion, ctx)


# (gold, prediction inside \boxed{}, expected correct)
CASES: list[tuple[str, str, bool]] = [
    # integers, negatives, signs
    ("3", "3", True), ("3", "4", False), ("-3", "-3", True), ("-3", "3", False), ("3", "+3", True),
    ("0", "0", True), ("0", "-0", True), ("0", "0.0", True), ("12", "012", True), ("-7", "- 7", True),
    ("100", "100.", True), ("100", "1000", False), ("42", "$42$", True), ("42", "42.0", True),
    ("-1", "\\!-1", True), ("7", "\\, 7", True),
    # decimals and tolerance
    ("0.5", "0.5", True), ("0.5", ".5", True), ("0.5", "0.50", True), ("0.5", "0.51", False),
    ("3.14159", "3.14159", True), ("3.14159", "3.1416", False), ("2.5", "2.5000001", True),
    ("1.0", "1", True), ("-0.25", "-.25", True), ("0.333333", "0.3333333", True),
    ("0.1", "0.10000001", True), ("0.1", "0.1001", False),
    # thousands separators
    ("1000", "1,000", True), ("1234567", "1,234,567", True), ("1000", "1{,}000", True),
    ("1000000", "1,000,000.", True), ("1500", "1,500.0", True), ("1000", "1,001", False),
    # fractions
    ("1/2", "\\frac{1}{2}", True), ("\\frac{1}{2}", "0.5", True), ("\\frac{1}{2}", "1/2", True),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", True), ("\\frac{1}{2}", "\\tfrac{1}{2}", True),
    ("\\frac{1}{2}", "\\frac12", True), ("\\frac{2}{4}", "\\frac{1}{2}", True), ("\\frac{1}{3}", "0.333", False),
    ("-\\frac{1}{3}", "\\frac{-1}{3}", True), ("-\\frac{1}{3}", "-1/3", True), ("\\frac{3}{4}", "\\frac{4}{3}", False),
    ("\\frac{7}{3}", "2\\frac{1}{3}", True), ("5/2", "2.5", True), ("1/3", "\\frac{1}{3}", True),
    ("\\frac{1}{4}", "0.25", True), ("\\frac{1}{4}", "0.4", False), ("\\frac{22}{7}", "\\pi", False),
    # percentages (math-verify semantics: "50%" matches 50 and 0.5; bare 50 does not match 0.5)
    ("50", "50\\%", True), ("0.5", "50\\%", True), ("50\\%", "50", True), ("50\\%", "0.5", True),
    ("0.5", "50", False), ("25", "25%", True), ("12.5\\%", "0.125", True), ("50\\%", "40\\%", False),
    ("0.5", "5\\%", False), ("20", "20 \\%", True),
    # scientific notation
    ("1000", "1e3", True), ("1000", "1E3", True), ("1200", "1.2\\times10^{3}", True),
    ("1200", "1.2 \\times 10^3", True), ("0.001", "1e-3", True), ("0.001", "10^{-3}", True),
    ("3000000", "3\\times 10^{6}", True), ("3000000", "3\\times 10^{5}", False), ("6.02e23", "6.02\\times10^{23}", True),
    ("1e3", "999", False), ("1200", "1.2\\cdot10^{3}", True), ("1000", "10^3", True),
    ("1e400", "10^{400}", True), ("1e400", "1e399", False),
    # LaTeX / symbolic
    ("\\sqrt{2}", "\\sqrt{2}", True), ("\\sqrt{2}", "\\sqrt2", True), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True), ("2", "\\sqrt{4}", True), ("\\sqrt{3}", "\\sqrt{2}", False),
    ("2\\sqrt{3}", "\\sqrt{12}", True), ("\\pi", "\\pi", True), ("2\\pi", "2 \\pi", True), ("\\pi/2", "\\frac{\\pi}{2}", True),
    ("\\pi", "3.14159265", True), ("\\pi", "3", False), ("2^{10}", "1024", True), ("x^2", "x^{2}", True),
    ("x^2+2x+1", "(x+1)^2", True), ("x^2-1", "(x-1)(x+1)", True), ("x^2+1", "(x+1)^2", False),
    ("2x+3", "3+2x", True), ("\\frac{x}{2}", "0.5x", True), ("e", "e", True), ("e^{2}", "e^2", True),
    ("\\sin(x)", "\\sin x", True), ("\\ln 8", "3\\ln 2", True), ("3^{4}", "81", True), ("3^{4}", "64", False),
    ("\\binom{5}{2}", "10", True), ("5!", "120", True), ("10", "\\frac{20}{2}", True), ("-\\sqrt{5}", "\\sqrt{5}", False),
    ("\\frac{1+\\sqrt{5}}{2}", "\\frac{1}{2}+\\frac{\\sqrt{5}}{2}", True), ("a+b", "b+a", True), ("a-b", "b-a", False),
    # sets, intervals, tuples
    ("\\{1,2\\}", "\\{2,1\\}", True), ("\\{1,2\\}", "\\{1,3\\}", False), ("(1,2]", "(1,2]", True),
    ("(1,2]", "[1,2]", False), ("(0,\\infty)", "(0, \\infty)", True), ("[0,1)", "[0,1)", True),
    ("(-\\infty, 3)", "(-\\infty,3)", True), ("(1,2)", "(2,1)", False), ("1,2,3", "3,2,1", True),
    ("\\{3\\}", "3", True), ("[2,5]", "[2,5)", False), ("(1,2)\\cup(3,4)", "(1,2)\\cup(3,4)", True),
    # units and degree signs
    ("5", "5 cm", True), ("5", "5\\text{ cm}", True), ("5", "5\\ \\text{cm}", True), ("5", "5\\mathrm{m}", True),
    ("5", "6 cm", False), ("30", "30^\\circ", True), ("30", "30^{\\circ}", True), ("30", "30°", True),
    ("12", "12 \\text{ dollars}", True), ("12", "\\$12", True), ("9", "9 \\text{apples}", True), ("9", "8 apples", False),
    ("45", "45 \\text{ km/h}", True), ("5", "5 m", True), ("5", "5 x", False), ("5", "5n", False),
    # equations / assignments
    ("3", "x=3", True), ("3", "x = 3", True), ("3", "y=4", False), ("-2", "x=-2", True), ("x=3", "x=3", True),
    ("x=3", "3", True), ("y=2x+1", "y=1+2x", True), ("5", "n = 5", True), ("\\frac{1}{2}", "k=\\frac{1}{2}", True),
    # text answers
    ("Yes", "yes", True), ("No", "yes", False), ("\\text{Alice}", "Alice", True), ("A", "a", True), ("B", "C", False),
    # hedged / multiple answers (no credit)
    ("3", "3 or 4", False), ("3", "either 3 or 4", False), ("3", "3 and/or 4", False), ("3", "x = 3 or x = 4", False),
    ("3", "3 \\text{ or } 4", False), ("3", "3 \\lor 4", False), ("3", "3, 4", False), ("3", "\\{3, 4\\}", False),
    ("3", "3 \\vee 4", False), ("-1", "-1 \\text{ or } 1", False), ("2", "\\pm 2", False),
    # empty / garbage
    ("3", "", False), ("3", " ", False), ("3", "}{", False), ("3", "banana", False), ("3", "\\frac{", False),
    ("3", "???", False), ("1/2", "abc/def", False), ("0", "\\text{}", False), ("5", "NaN", False),
    ("5", "\\infty", False), ("\\infty", "\\infty", True), ("3", "$$", False),
]


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize(("gold", "pred", "expected"), CASES)
def test_math_table(gold: str, pred: str, expected: bool) -> None:
    v = _grade(gold, f"Working... so the answer is \\boxed{{{pred}}}.")
    assert not v.infra_error, v.details
    assert v.passed is expected, (gold, pred, v.details)
    assert v.score == (1.0 if expected else 0.0)


def test_extraction_order_and_single_answer() -> None:
    assert _grade("7", "<answer>7</answer>").passed
    assert _grade("7", "<answer>\\frac{14}{2}</answer>").passed
    assert _grade("7", "<answer>7</answer> and then \\boxed{8}").passed is False  # boxed wins
    assert _grade("7", "\\boxed{7} ... \\boxed{8}").passed is False  # two different boxed answers
    assert _grade("7", "\\boxed{7} so again \\boxed{7}").passed  # the same answer twice is one answer
    assert _grade("7", "I think 3, then 7", VerifyContext(extractor="last_number")).passed
    assert _grade("7", "no answer here", VerifyContext(extractor="last_number")).passed is False


def test_format_layer() -> None:
    ctx = VerifyContext(format_weight=0.2)
    v = _grade("7", "\\boxed{7}", ctx)
    assert v.passed and v.score == pytest.approx(1.0) and v.components == {"correct": 1.0, "format": 1.0}
    v = _grade("7", "\\boxed{8}", ctx)
    assert not v.passed and v.score == pytest.approx(0.2)


def test_rel_tol_param() -> None:
    assert _grade("100", "\\boxed{100.5}").passed is False
    assert _grade("100", "\\boxed{100.5}", rel_tol=0.01).passed


def _sleepy(gold: str, pred: str) -> tuple[str, tuple]:
    return "time:sleep", (30,)


def test_slow_path_timeout_is_infra_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _grade("x^2+2x+1", "\\boxed{(x+1)^2}").passed  # warms a worker so startup is not timed
    monkeypatch.setattr(vm, "_slow_call", _sleepy)
    t0 = time.perf_counter()
    v = _grade("x^2+4x+4", "\\boxed{(x+2)^2}", timeout_s=0.5)
    assert v.infra_error and not v.passed and "timed out" in v.details
    assert time.perf_counter() - t0 < 5
    monkeypatch.undo()
    assert _grade("x^2-1", "\\boxed{(x-1)(x+1)}").passed  # the pool recovers (worker replaced; not a cache hit)


def test_pathological_input_times_out_as_infra() -> None:
    """A real hang inside math-verify/sympy (a power tower), not a simulated one."""
    t0 = time.perf_counter()
    v = _grade("1", "\\boxed{9^{9^{9^{9}}}}", timeout_s=1)
    assert v.infra_error and not v.passed and "timed out" in v.details
    assert time.perf_counter() - t0 < 30  # 1 s plus, at worst, starting a replacement worker


def test_worker_error_is_infra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vm, "_slow_call", lambda g, p: ("honing.verify.math:no_such_function", ()))
    v = _grade("x^2+2x+1", "\\boxed{(x+1)^2}")
    assert v.infra_error and "AttributeError" in v.details


def test_callable_from_threads() -> None:
    results: list[bool] = []

    def work() -> None:
        results.append(_grade("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}").passed)
        results.append(_grade("3", "\\boxed{x=3}").passed)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 8


def test_missing_gold_is_infra() -> None:
    task = Task(id="t", domain="d", prompt=(), verifier=VerifierSpec("math"), hidden={})
    assert get_verifier("math").verify(task, Trajectory.from_text("t", "d", "\\boxed{1}"), CTX).infra_error


def test_jsonl_task_graded_by_math(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"id": f"q{i}", "prompt": "What is half of 1?", "answer": "\\frac{1}{2}", "verifier": "math",
             "split": "train"} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = list(JsonlSource(str(path)).tasks("train", 0))
    assert len(tasks) == 2 and tasks[0].verifier.name == "math"
    assert grade(tasks[0], "so it is \\boxed{0.5}", CTX).passed
    assert grade(tasks[1], "<answer>1/2</answer>", CTX).passed
    assert not grade(tasks[1], "\\boxed{2}", CTX).passed


def test_gym_source_with_math_verifier() -> None:
    """`verifier: math` on a gym source (as a config would build it): the gold is hidden['answer']."""
    from honing.tasks import make_source

    src = make_source("gym:basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                               "operators": ["+"], "allow_negation": False,
                                               "allow_parentheses": False}, verifier="math")
    task = next(iter(src.tasks("train", 0)))
    assert task.verifier.name == "math" and "math" in verifier_names()
    gold = task.hidden["answer"]
    assert grade(task, f"\\boxed{{{gold}}}", CTX).passed
    assert grade(task, f"<answer>{gold}.0</answer>", CTX).passed
    assert not grade(task, f"\\boxed{{{int(gold) + 1}}}", CTX).passed
    frac = next(iter(make_source("gym:fraction_simplification", {}, verifier="math").tasks("train", 0)))
    assert grade(frac, f"\\boxed{{{frac.hidden['answer']}}}", CTX).passed


STDIN_SCRIPT = r"""
from honing.tasks import Task, VerifierSpec
from honing.verify import VerifyContext, grade
t = Task("t", "d", (), VerifierSpec("math"), {"answer": "2"})
print(grade(t, r"\boxed{\sqrt{4}}", VerifyContext()).passed)
"""


def test_works_from_a_stdin_script() -> None:
    """Workers are fresh interpreters: a caller without an importable __main__ still works."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-"], input=STDIN_SCRIPT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "True", r.stderr[-2000:]
