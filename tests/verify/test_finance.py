"""The `finance` task source and the `extract` verifier: a reference solver that reads only the
document scores 1.0 on 200 tasks (and on 720 more across levels, hops and document sizes);
fabricated, unit-confused, hedged and malformed answers score 0 on the affected fields, and so does
a right number cited from the wrong table or printed only outside the table the question names;
the cash-flow statement's ending cash reconciles with the balance sheet's cash, and a cross-check
question asks about it; tasks are deterministic, splits disjoint, params checked."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from honing.errors import TaskError
from honing.tasks import make_source, task_from_json, task_to_json
from honing.tasks.finance import BS, CF, IS, LINE_ITEMS, FinanceSource, _financials
from honing.verify import VerifyContext, grade
from honing.verify.finance import (document_numbers, document_sections, document_text, grade_field, parse_answer,
                                   parse_tables, solve, to_number, unit_factor)

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


@pytest.mark.parametrize("level", [1, 2, 3])
def test_reference_cites_the_named_tables_and_scores_one(level: int) -> None:
    tasks = [t for hops in (1, 2, 3) for ds in (1, 8)
             for t in _tasks(40, "train", level=level, hops=hops, doc_sections=ds)]
    asked = set()
    for t in tasks:
        fields, ans = t.hidden["fields"], _answer(t)
        assert json.loads(solve(dataclasses.replace(t, hidden={})).strip("`\njson")) == ans  # reads no hidden data
        for n, f in fields.items():
            metric = n.rsplit("_", 1)[0]
            asked.add(metric)
            if f["kind"] == "raw":  # each value is asked from one named table, and the reference cites it
                assert f["sections"] == [LINE_ITEMS[metric][0]] and ans["sources"][n] == f["sections"][0]
                assert f"as printed in the {f['sections'][0]}" in t.question
            else:  # a derived value's inputs are asked alongside, each from its table
                assert set(f["inputs"]) <= set(fields) and f["sections"]
                assert set(f["sections"]) == {fields[i]["sections"][0] for i in f["inputs"]}
        v = grade(t, solve(t), CTX)
        assert v.passed and v.score == 1.0 and v.components["traceability"] == 1.0, (t.id, v.details)
        assert v.components["format"] == 1.0
    if level == 3:
        assert {"cash_reconciles", "balances", "cash_ending", "free_cash_flow"} <= asked


_TWINS = {"cash": "Cash and cash equivalents at end of year", "net_income": "Net income (loss)"}  # -> CF row


def _twin_tasks() -> list:
    """Level-1 look-ups of a value the cash-flow statement prints too, in documents with all three statements."""
    return [t for t in _tasks(300, level=1, doc_sections=3)
            if next(iter(t.hidden["fields"])).rsplit("_", 1)[0] in _TWINS]


def test_same_valued_number_from_the_wrong_table_scores_zero() -> None:
    """The balance sheet's cash is also the cash-flow statement's ending cash, and net income is printed
    in the income statement and the cash-flow statement: the right number cited from the wrong table
    scores 0, as does an uncited one."""
    tasks = _twin_tasks()
    assert {next(iter(t.hidden["fields"])).rsplit("_", 1)[0] for t in tasks} == set(_TWINS) and len(tasks) >= 20
    for t in tasks:
        ans = _answer(t)
        name = next(iter(t.hidden["fields"]))
        metric, year = name.rsplit("_", 1)[0], int(name.rsplit("_", 1)[1])
        right = LINE_ITEMS[metric][0]
        tables, _ = parse_tables(document_text(t))
        assert to_number(tables[CF][_TWINS[metric]][year]) == to_number(ans[name])  # the same value, wrong table
        assert grade(t, _completion(ans), CTX).passed
        alias = {IS: "Income statement", BS: "the balance sheet"}[right]
        assert grade(t, _completion({**ans, "sources": {name: alias}}), CTX).passed
        for wrong in (CF, "Statement of cash flows", "## CONSOLIDATED STATEMENTS OF CASH FLOWS",
                      f"{right} / {CF}", "CONSOLIDATED", "SEGMENT INFORMATION", "Liquidity and capital resources",
                      "fabricated " * 999):
            v = grade(t, _completion({**ans, "sources": {name: wrong}}), VerifyContext(format_weight=0.1))
            assert v.components[f"field:{name}"] == 0.0 and not v.passed and "wrong source" in v.details, wrong
            assert v.score == pytest.approx(0.1) and v.components["traceability"] == 1.0
            assert v.components["fabricated"] == 0.0 and len(v.details) < 300  # the citation is not echoed whole
        # no source, or sources that are not a title per field: 0, and the format layer fails without one
        for bad in ({}, {"sources": right}, {"sources": [right]}, {"sources": {name: 7}}, {"sources": {name: ""}},
                    {"sources": {name: [right]}}, {"sources": {name: {"title": right}}}, {"sources": None}):
            obj = {k: v for k, v in ans.items() if k != "sources"} | bad
            v = grade(t, _completion(obj), CTX)
            assert v.score == 0.0 and not v.passed and "wrong source" in v.details and not v.infra_error, bad


def test_a_value_printed_only_outside_the_named_table_is_untraceable() -> None:
    """Blank the asked cell in the named table: the right number still occurs in the cash-flow statement,
    so a whole-document check would accept it; scoped to the named table it is untraceable."""
    for t in _twin_tasks():
        ans = _answer(t)
        name = next(iter(t.hidden["fields"]))
        metric, year = name.rsplit("_", 1)[0], int(name.rsplit("_", 1)[1])
        right, label = LINE_ITEMS[metric][0], LINE_ITEMS[metric][1]
        doc = document_text(t)
        body = document_sections(doc)[right]
        printed = parse_tables(doc)[0][right][label][year]
        lines = body.split("\n")
        i = next(i for i, ln in enumerate(lines) if ln.startswith((label + "  ", f"| {label} |")))
        lines[i] = lines[i].replace(printed, "n/a")
        tampered_doc = doc.replace(body, "\n".join(lines))
        task = dataclasses.replace(t, prompt=({"role": "user", "content": t.question.replace(doc, tampered_doc)},))
        value = abs(to_number(ans[name]))
        assert value not in document_numbers(document_sections(tampered_doc)[right])
        assert value in document_numbers(document_sections(tampered_doc)[CF])
        v = grade(task, _completion(ans), CTX)
        assert v.score == 0.0 and "untraceable" in v.details and v.components["traceability"] == 0.0, v.details
        assert v.components["fabricated"] == 0.0  # it is in the document, just not where the question points
        # the same answer against the same document, traced document-wide (a spec without sections): accepted
        spec = {k: x for k, x in t.hidden["fields"][name].items() if k != "sections"}
        unit = {"thousands": 1000, "millions": 10 ** 6}[t.hidden["unit"]]
        assert grade_field(spec, ans[name], unit, unit, document_numbers(tampered_doc))[0] == 1.0
        v = grade(task, _completion({**ans, "sources": {name: CF}}), CTX)  # citing where it is: still 0
        assert v.score == 0.0 and "untraceable" in v.details


def test_ending_cash_reconciles_with_balance_sheet_cash() -> None:
    for seed in range(500):
        rng = random.Random(seed)
        years = list(range(2015, 2015 + rng.randint(2, 5)))
        fin = _financials(rng, years, rng.choice(("thousands", "millions")))
        for i, y in enumerate(years):
            d = fin[y]
            assert d["cash_ending"] == d["cash"] > 0 and d["cash_beginning"] > 0, (seed, y)
            flows = d["operating_cash_flow"] + d["investing_cash_flow"] + d["financing_cash_flow"]
            assert d["net_change_in_cash"] == flows
            assert d["cash_beginning"] + d["net_change_in_cash"] == d["cash_ending"]
            assert i == 0 or d["cash_beginning"] == fin[years[i - 1]]["cash"]
            assert d["total_assets"] == d["total_liabilities"] + d["total_equity"]
            assert d["total_current_assets"] == d["cash"] + d["receivables"] + d["inventories"]
    # and as printed: every year reconciles, except the year a reconciliation question plants a break in
    tasks = ([t for lv in (1, 2, 3) for t in _tasks(60, "train", level=lv, doc_sections=2)]
             + _tasks(60, "train", level=3, hops=3))
    planted = 0
    for t in tasks:
        tables, _ = parse_tables(document_text(t))
        cf, bs = tables[CF], tables[BS]
        brk = {int(n.rsplit("_", 1)[1]) for n, f in t.hidden["fields"].items() if n.startswith("cash_reconciles_")
               and f["value"] is False}
        planted += len(brk)
        years = t.metadata["years"]
        for y in years:
            end, cash = (to_number(cf["Cash and cash equivalents at end of year"][y]),
                         to_number(bs["Cash and cash equivalents"][y]))
            assert (end == cash) == (y not in brk), (t.id, y)
            begin, change = (to_number(cf["Cash and cash equivalents at beginning of year"][y]),
                             to_number(cf["Net increase (decrease) in cash and cash equivalents"][y]))
            assert begin + change == cash
            assert y == years[0] or begin == to_number(bs["Cash and cash equivalents"][y - 1])
    assert planted >= 3


def test_cash_reconciliation_cross_check() -> None:
    tasks = [t for t in _tasks(200, "train", level=3, hops=3) if "cash_reconciles" in "".join(t.hidden["fields"])]
    assert len(tasks) >= 20
    refs = []
    for t in tasks:
        ans = _answer(t)
        flag = next(n for n in ans if n.startswith("cash_reconciles_"))
        disc = flag.replace("reconciles", "discrepancy")
        fields = t.hidden["fields"]
        refs.append(fields[flag]["value"])
        assert set(fields[flag]["inputs"]) == {f"cash_ending_{flag[-4:]}", f"cash_{flag[-4:]}"}
        assert ans[flag] is fields[flag]["value"] and (fields[disc]["value"] == 0) is fields[flag]["value"]
        v = grade(t, solve(t), CTX)
        assert v.passed and v.score == 1.0, v.details
        for k, wrong in ((flag, not ans[flag]), (flag, "maybe"), (disc, ans[disc] + 1), (disc, -ans[disc] or 5)):
            v = grade(t, _completion({**ans, k: wrong}), CTX)
            assert not v.passed and v.components[f"field:{k}"] == 0.0, (k, wrong)
            assert v.score == pytest.approx(1 - 1 / len(fields))
    assert set(refs) == {True, False}
    # a policy that always claims the statements reconcile is wrong exactly on the planted breaks
    flag_of = {t.id: next(n for n in t.hidden["fields"] if n.startswith("cash_reconciles_")) for t in tasks}
    always = [grade(t, _completion({**_answer(t), flag_of[t.id]: True}), CTX).passed for t in tasks]
    assert always == refs


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
    src = {"sources": ans["sources"]}
    # a different unit, stated: accepted (and traceable through the conversion)
    assert grade(task, _completion({name: int(value * factor), "unit": "USD", **src}), CTX).passed
    # x1000 with the document's unit, or with no unit: unit-confused
    for bad in ({name: int(value * 1000), "unit": unit, **src}, {name: int(value * 1000), **src},
                {name: int(value), "unit": "USD", **src}):
        v = grade(task, _completion(bad), CTX)
        assert v.score == 0.0 and "unit-confused" in v.details, (bad, v.details)
    # right value, unit missing: read as printed, passes, but the format layer fails
    v = grade(task, _completion({name: ans[name], **src}), CTX)
    assert v.passed and v.components["format"] == 0.0
    assert grade(task, _completion({name: ans[name], **src}),
                 VerifyContext(format_weight=0.2)).score == pytest.approx(0.8)
    near_zero = {"kind": "derived", "value": 0.01, "money": False, "rel_tol": 1e-6, "abs_tol": 0.05}
    assert grade_field(near_zero, 0.0, None, 1000, set())[0] == 1.0  # within rounding, not "100x off"
    assert unit_factor("in thousands of USD") == 1000 and unit_factor("$ millions") == 10 ** 6
    assert unit_factor("USD") == 1 and unit_factor("furlongs") is None and unit_factor(None) is None


def test_printed_forms_are_accepted() -> None:
    assert to_number("$1,234") == 1234 and to_number("(1,234)") == -1234 and to_number("12.5%") == 12.5
    assert to_number("1,23,4") is None and to_number("12 or 13") is None and to_number(True) is None
    task = _tasks(1, level=1)[0]
    name, ans = _raw_field(task), _answer(task)
    bare = (f'```json\n{{"{name}": {ans[name]}, "unit": "{ans["unit"]}", '  # 45,678 unquoted
            f'"sources": {json.dumps(ans["sources"])}}}\n```')
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
    with pytest.raises(TaskError, match="unknown task source 'financial'; closest: finance"):
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
