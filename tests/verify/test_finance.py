"""The `finance` task source and the `extract` verifier: a reference solver that reads only the
document scores 1.0 on 200 tasks; fabricated, unit-confused, hedged and malformed answers score 0
on the affected fields; tasks are deterministic, splits disjoint, params checked."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from honing.errors import TaskError
from honing.tasks import make_source, task_from_json, task_to_json
from honing.tasks.finance import IS, FinanceSource
from honing.verify import VerifyContext, grade
from honing.verify.finance import document_text, grade_field, parse_answer, parse_tables, solve, to_number, unit_factor

CTX = VerifyContext()
HONING = str(Path(sys.executable).parent / "honing")


def _tasks(n: int, split: str = "heldout", **params: object) -> list:
    return list(islice(FinanceSource(dict(params)).tasks(split, 0), n))


def _answer(task) -> dict:
    """The reference solver's JSON (read from the document, never from task.hidden)."""
    return json.loads(solve(task).strip("`\njson"))


def _completion(obj: dict) -> str:
    return "Here is my answer.\n```json\n" + json.dumps(obj) + "\n```"


def _raw_field(task) -> str:
    return next(n for n, f in task.hidden["fields"].items() if f["kind"] == "raw" and f["money"])


def test_reference_solver_scores_one_on_200_tasks() -> None:
    tasks = [t for lv in (1, 2, 3) for split in ("train", "heldout") for t in _tasks(34, split, level=lv)][:200]
    assert len(tasks) == 200
    kinds = {f["format"] for t in tasks for f in t.hidden["fields"].values() if "format" in f}
    assert kinds == {"pct", "ratio", "money", "check"}
    assert {t.metadata["hops"] for t in tasks} == {1, 2, 3}
    for t in tasks:
        v = grade(t, solve(t), CTX)
        assert v.passed and v.score == 1.0 and v.components["traceability"] == 1.0, (t.id, v.details)


def test_planted_imbalance_is_caught() -> None:
    tasks = [t for t in _tasks(150, "train", level=3, hops=3) if "balances" in "".join(t.hidden["fields"])]
    flags = {next(f["value"] for n, f in t.hidden["fields"].items() if n.startswith("balances")) for t in tasks}
    assert flags == {True, False}
    for t in tasks:
        ans = _answer(t)
        name = next(n for n in ans if n.startswith("balances_"))
        assert grade(t, _completion(ans), CTX).passed
        ans[name] = not ans[name]
        v = grade(t, _completion(ans), CTX)
        assert not v.passed and v.components[f"field:{name}"] == 0.0


def test_fabricated_value_scores_zero_even_when_numerically_right() -> None:
    task = _tasks(1, level=1)[0]
    name, ans = _raw_field(task), _answer(task)
    printed = str(ans[name])
    doc = task.prompt[-1]["content"]
    # the same task whose document no longer prints the value: the right number is now a fabrication
    tampered = dataclasses.replace(task, prompt=({"role": "user", "content": doc.replace(printed, "n/a")},))
    v = grade(tampered, _completion(ans), CTX)
    assert v.score == 0.0 and v.components["fabricated"] == 1.0 and "fabricated" in v.details
    # a number that occurs nowhere in the document
    ans[name] = to_number(printed) + 7
    v = grade(task, _completion({**ans, name: int(ans[name])}), CTX)
    assert v.components[f"field:{name}"] == 0.0 and "fabricated" in v.details
    assert v.components["traceability"] == 0.0


def test_fabrication_only_zeroes_the_affected_field() -> None:
    task = next(t for t in _tasks(60, level=2) if len(t.hidden["fields"]) >= 3)
    ans = _answer(task)
    name = _raw_field(task)
    ans[name] = int(to_number(ans[name])) + 13
    v = grade(task, _completion(ans), CTX)
    n = len(task.hidden["fields"])
    assert v.components[f"field:{name}"] == 0.0 and not v.passed
    assert v.score == pytest.approx((n - 1) / n)  # the derived field is still right: partial credit


def test_unit_handling() -> None:
    task = _tasks(1, level=1)[0]
    name, ans = _raw_field(task), _answer(task)
    value, unit = to_number(ans[name]), task.hidden["unit"]
    factor = {"thousands": 1000, "millions": 10 ** 6}[unit]
    # a different unit, stated: accepted (and traceable through the conversion)
    assert grade(task, _completion({name: int(value * factor), "unit": "USD"}), CTX).passed
    # x1000 with the document's unit, or with no unit: unit-confused
    for bad in ({name: int(value * 1000), "unit": unit}, {name: int(value * 1000)},
                {name: int(value), "unit": "USD"}):
        v = grade(task, _completion(bad), CTX)
        assert v.score == 0.0 and "unit-confused" in v.details, (bad, v.details)
    # right value, unit missing: read as printed, passes, but the format layer fails
    v = grade(task, _completion({name: ans[name]}), CTX)
    assert v.passed and v.components["format"] == 0.0
    assert grade(task, _completion({name: ans[name]}), VerifyContext(format_weight=0.2)).score == pytest.approx(0.8)
    near_zero = {"kind": "derived", "value": 0.01, "money": False, "rel_tol": 1e-6, "abs_tol": 0.05}
    assert grade_field(near_zero, 0.0, None, 1000, set())[0] == 1.0  # within rounding, not "100x off"
    assert unit_factor("in thousands of USD") == 1000 and unit_factor("$ millions") == 10 ** 6
    assert unit_factor("USD") == 1 and unit_factor("furlongs") is None and unit_factor(None) is None


def test_printed_forms_are_accepted() -> None:
    assert to_number("$1,234") == 1234 and to_number("(1,234)") == -1234 and to_number("12.5%") == 12.5
    assert to_number("1,23,4") is None and to_number("12 or 13") is None and to_number(True) is None
    task = _tasks(1, level=1)[0]
    name, ans = _raw_field(task), _answer(task)
    bare = f'```json\n{{"{name}": {ans[name]}, "unit": "{ans["unit"]}"}}\n```'  # 45,678 unquoted
    assert grade(task, bare, CTX).passed
    assert grade(task, f"<answer>{json.dumps(ans)}</answer>", CTX).passed
    assert grade(task, "The values: " + json.dumps(ans), CTX).passed


def test_hedged_and_malformed_answers_score_zero() -> None:
    task = _tasks(1, level=1)[0]
    name, ans = _raw_field(task), _answer(task)
    other = {**ans, name: "1"}
    for text, reason in (
        (_completion(ans) + "\nor maybe\n" + _completion(other), "hedged"),
        (json.dumps(ans) + " or " + json.dumps(other), "hedged"),
        ("```json\n{\"" + name + "\": 12,\n```", "malformed"),
        ("I think it is 45,678 thousand.", "no JSON"),
        ("```json\n[1, 2]\n```", "no JSON object"), ("```json\n" + '{"a": ' * 5000 + "1" + "}" * 5000 + "\n```",
                                                    "nested too deeply"), ('{"a": ' * 3000, "malformed"),
    ):
        v = grade(task, text, VerifyContext(format_weight=0.3))
        assert v.score == 0.0 and not v.passed and v.components["format"] == 0.0 and not v.infra_error
        assert reason in v.details, v.details
    same_twice = _completion(ans) + "\nAgain:\n" + _completion(ans)
    assert grade(task, same_twice, CTX).passed
    assert parse_answer('{"a": [1, 2]}')[0] == {"a": [1, 2]}
    v = grade(task, _completion({**ans, name: [ans[name], 1]}), CTX)
    assert v.score == 0.0 and "not a single number" in v.details


def test_derived_tolerance_and_distractors() -> None:
    task = next(t for t in _tasks(80, level=2) if any(n.startswith("gross_margin") for n in t.hidden["fields"]))
    ans = _answer(task)
    pct = next(n for n in ans if n.startswith("gross_margin"))
    exact = task.hidden["fields"][pct]["value"]
    assert grade(task, _completion({**ans, pct: round(exact, 3)}), CTX).passed  # finer than asked is fine
    off = grade(task, _completion({**ans, pct: round(exact + 0.2, 1)}), CTX)
    assert off.components[f"field:{pct}"] == 0.0 and not off.passed and f"{pct}: " in off.details
    frac = grade(task, _completion({**ans, pct: round(exact / 100, 4)}), CTX)
    assert "unit-confused" in frac.details
    # a number printed in the document for another year: traceable, still wrong
    rev = next(n for n in ans if n.startswith("revenue_"))
    year = int(rev.rsplit("_", 1)[1])
    other = next(y for y in task.metadata["years"] if y != year)
    tables, _ = parse_tables(document_text(task))
    v = grade(task, _completion({**ans, rev: tables[IS]["Revenue"][other]}), CTX)
    assert v.components[f"field:{rev}"] == 0.0 and "fabricated" not in v.details
    assert v.components["traceability"] == 1.0


def test_determinism_splits_and_knobs() -> None:
    a, b = _tasks(5, "train"), _tasks(5, "train")
    assert [task_to_json(t) for t in a] == [task_to_json(t) for t in b]
    train = {t.question for t in _tasks(100, "train")}
    held = {t.question for t in _tasks(100, "heldout")}
    assert not train & held and len(train) == 100
    easy, hard = _tasks(20, level=1), _tasks(20, level=3)
    assert max(len(t.question) for t in easy) < min(len(t.question) for t in hard)
    assert all(len(t.hidden["fields"]) == 1 and t.metadata["hops"] == 1 for t in easy)
    long = _tasks(5, level=1, doc_sections=8, years=5, distractors=10)
    assert min(len(t.question) for t in long) > max(len(t.question) for t in easy)
    assert all(t.metadata["hops"] == 2 for t in _tasks(5, level=1, hops=2))


def test_param_errors_are_clear() -> None:
    with pytest.raises(TaskError, match=r"unknown parameters \['lenght'\].*valid: distractors, doc_sections"):
        FinanceSource({"lenght": 3})
    for bad in ({"level": 4}, {"years": 1}, {"hops": [1, 5]}, {"distractors": "many"}, {"doc_sections": 0}):
        with pytest.raises(TaskError, match=f"parameter '{next(iter(bad))}'"):
            FinanceSource(bad)
    with pytest.raises(TaskError, match="unknown split"):
        next(FinanceSource().tasks("test", 0))
    with pytest.raises(TaskError, match="'finance'"):
        make_source("financial")


def test_json_round_trip_grades_the_same() -> None:
    for t in _tasks(6, level=3) + _tasks(3, level=2):
        back = task_from_json(json.loads(json.dumps(task_to_json(t))))
        for text in (solve(t), _completion({k: 1 for k in t.hidden["fields"]}), "nothing"):
            a, b = grade(back, text, CTX), grade(t, text, CTX)
            assert dataclasses.replace(a, cost_s=0.0) == dataclasses.replace(b, cost_s=0.0)


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([HONING, *args], input=stdin, capture_output=True, timeout=120)


def test_cli_show_and_verify(tmp_path: Path) -> None:
    p = _cli("tasks", "show", "finance", "--n", "1")
    assert p.returncode == 0 and b"=== DOCUMENT ===" in p.stdout and b"[hidden fields]" in p.stdout, p.stderr
    p = _cli("tasks", "show", "finance", "--n", "1", "--json", "--split", "heldout", "--params", '{"level": 2}')
    assert p.returncode == 0, p.stderr
    path = tmp_path / "task.json"
    path.write_text(p.stdout.decode().splitlines()[0])
    task = task_from_json(json.loads(path.read_text()))
    good = _cli("verify", "--task", str(path), "--completion", "-", stdin=solve(task).encode())
    assert good.returncode == 0 and json.loads(good.stdout)["passed"] is True, good.stderr
    bad = _cli("verify", "--task", str(path), "--completion", "-", stdin=b"```json\n{oops\n```")
    out = json.loads(bad.stdout)
    assert out["score"] == 0.0 and "malformed JSON" in out["details"]
