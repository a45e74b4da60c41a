"""The `extract` verifier: structured JSON answers about a document (the `finance` tasks).

The completion must hold exactly one JSON object (a ```json block, <answer> tags, or a bare
{...}); several different objects (a hedge) or malformed JSON score 0 with a reason. Each field
named in `task.hidden["fields"]` is graded on its own:

* raw (a value copied from the document): traceability first, scoped to where the question
  points. The field's spec names its table (`sections`, hidden); the number as written, or the
  same number converted to the document's unit, must occur among the numbers of that table in the
  document text (read from the prompt between the DOCUMENT markers, split at its "## " headings).
  A number that occurs nowhere is a fabrication; one that occurs only elsewhere (a narrative
  paragraph, another statement, the segment table) is untraceable; both score 0 even when
  numerically right. The answer's "sources" object must cite, for the field, that table's title
  (or an alias in SOURCE_ALIASES): a missing source, or one naming another table, scores 0 even
  when the number equals the right one (the balance sheet's cash is also the cash-flow
  statement's ending cash; net income is printed in two statements). Then numeric equality.
* derived (growth, margins, ratios, free cash flow): numeric, within the field's tolerance.
* check (cross-table consistency: the balance sheet balances; the cash-flow statement's ending
  cash reconciles with the balance sheet's cash): a bool compared exactly, or a number like
  derived. Derived and check fields are graded on their value; their inputs are asked as raw
  fields alongside (spec `inputs`) and each is traced and source-checked as above.

Money fields are normalised by the answer's "unit" field ("thousands", "in millions of USD",
"USD"...). A missing or unrecognised unit means "as printed" (the document's unit) and fails
the format layer. A value off by a unit factor (1000x, or 100x for percentages) is reported as
unit-confused and scores 0. Score = (1 - format_weight) * mean field score + format_weight *
format (every field present, a recognised unit where amounts are asked, a source for every raw
field); `passed` = every field correct. Task specs without `sections` (older task files) are
traced against the whole document and need no source. Not covered: a model that cites the right
table while reading a same-valued number elsewhere cannot be told apart from one that read the
right table (the number is then in the right table too).
"""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from fractions import Fraction
from typing import Any

from honing.rollout.types import Trajectory
from honing.tasks.finance import DERIVED, DOC_END, DOC_START, LINE_ITEMS, SOURCE_ALIASES, UNIT_FACTORS, source_key
from honing.verify.registry import register_verifier
from honing.verify.types import Verdict, VerifyContext

_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.S)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BARE_AMOUNT = re.compile(r'(:\s*)(\(?-?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?\)?|\(\$?\d+(?:\.\d+)?\))(\s*[,}\n])')
_NUM_STR = re.compile(r"^(\()?\s*([-−])?\s*\$?\s*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s*%?\s*(\))?$")
_DOC_NUM = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_UNIT_WORDS = {"ones": 1, "units": 1, "usd": 1, "dollars": 1, "dollar": 1, "thousand": 1_000, "thousands": 1_000,
               "k": 1_000, "000s": 1_000, "million": 1_000_000, "millions": 1_000_000, "m": 1_000_000,
               "mm": 1_000_000, "mn": 1_000_000, "billion": 10 ** 9, "billions": 10 ** 9, "bn": 10 ** 9, "b": 10 ** 9}
MAX_BARE_TRIES = 200
_FILLER = {"in", "of", "us", "usd", "dollars", "dollar", "amounts", "the", "except", "per", "share", "data"}


# --- parsing -------------------------------------------------------------------------------------
def _loads(s: str) -> Any:
    """JSON with exact decimals; retries once with printed amounts like 45,678 or (1,234) quoted."""
    try:
        return json.loads(s, parse_float=Decimal)
    except json.JSONDecodeError:
        return json.loads(_BARE_AMOUNT.sub(r'\1"\2"\3', s), parse_float=Decimal)


def parse_answer(text: str) -> tuple[dict | None, str]:
    """Exactly one JSON object from the completion, or (None, why not)."""
    blocks = [b for b in _FENCE.findall(text) + _TAG.findall(text) if "{" in b]
    objs: list[Any] = []
    if blocks:
        for b in blocks:
            body = b[b.find("{"): b.rfind("}") + 1]
            try:
                objs.append(_loads(body))
            except json.JSONDecodeError as e:
                return None, f"malformed JSON: {e.msg} (line {e.lineno} col {e.colno})"
            except RecursionError:  # absurd nesting is a malformed answer, not a grader crash
                return None, "malformed JSON: nested too deeply"
    else:
        dec, i, tries = json.JSONDecoder(parse_float=Decimal), text.find("{"), 0
        while i >= 0 and tries < MAX_BARE_TRIES:  # bounded: a wall of '{' must not make grading quadratic
            tries += 1
            try:
                obj, end = dec.raw_decode(text, i)
                objs.append(obj)
                i = text.find("{", end)
            except (json.JSONDecodeError, RecursionError):
                i = text.find("{", i + 1)
        if not objs:
            return None, "no JSON object found" if "{" not in text else "malformed JSON: no parsable {...}"
    distinct = {json.dumps(o, sort_keys=True, default=str) for o in objs}
    if len(distinct) > 1:
        return None, f"{len(distinct)} different JSON objects (a hedged answer)"
    if not isinstance(objs[0], dict):
        return None, f"the answer is a JSON {type(objs[0]).__name__}, not an object"
    return objs[0], ""


def to_number(v: Any) -> Fraction | None:
    """A JSON number or a printed amount ('$45,678', '(1,234)', '12.3%') -> exact value."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, Decimal)):
        return Fraction(v)
    if isinstance(v, float):
        return Fraction(str(v))
    if not isinstance(v, str):
        return None
    m = _NUM_STR.match(v.strip())
    if not m or bool(m.group(1)) != bool(m.group(5)):
        return None
    x = Fraction(m.group(3).replace(",", "") + (m.group(4) or ""))
    return -x if (m.group(1) or m.group(2)) else x


def unit_factor(v: Any) -> int | None:
    """'thousands', 'in millions of USD', 'USD', '$000s' -> multiplier; None if unrecognised."""
    if not isinstance(v, str):
        return None
    words = re.sub(r"[^a-z0-9]+", " ", v.lower().replace("$", " usd ")).split()
    scale = [w for w in words if w not in _FILLER]
    if len(scale) > 1 or (scale and scale[0] not in _UNIT_WORDS) or not words:
        return None
    return _UNIT_WORDS[scale[0]] if scale else 1


def document_text(task: Any) -> str:
    text = "\n".join(m["content"] for m in task.prompt if m.get("role") == "user")
    start, end = text.find(DOC_START), text.rfind(DOC_END)
    return text[start + len(DOC_START): end] if 0 <= start < end else str(task.hidden.get("document", text))


def document_numbers(doc: str) -> set[Fraction]:
    return {Fraction(s.replace(",", "")) for s in _DOC_NUM.findall(doc)}


def document_sections(doc: str) -> dict[str, str]:
    """'## Title' -> the text under it, up to the next '## ' heading (a repeated title: joined)."""
    out: dict[str, str] = {}
    for block in re.split(r"^## ", doc, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        out[title.strip()] = out.get(title.strip(), "") + "\n" + body
    return out


def cites(source: Any, sections: list[str]) -> bool:
    """Whether an answer's source names one of `sections` (its title or an alias, normalised)."""
    if not isinstance(source, str) or not source.strip():
        return False
    key = source_key(source.strip().lstrip("#"))
    return any(key == source_key(s) or key in {source_key(a) for a in SOURCE_ALIASES.get(s, ())} for s in sections)


# --- grading -------------------------------------------------------------------------------------
def _close(a: Fraction, b: Fraction, rel: float, abs_tol: Fraction) -> bool:
    return abs(a - b) <= max(abs_tol, Fraction(rel) * abs(b))


def grade_field(spec: dict, value: Any, ans_unit: int | None, doc_unit: int, doc_nums: set[Fraction],
                scope_nums: set[Fraction] | None = None, source: Any = None) -> tuple[float, str, bool | None]:
    """(score, why it failed or '', traced: None for non-raw fields). `scope_nums`: the numbers of the
    sections the field points to (None: the whole document); `source`: the answer's citation."""
    ref = spec["value"]
    if isinstance(ref, bool):
        got = value if isinstance(value, bool) else {"true": True, "yes": True, "false": False, "no": False}.get(
            str(value).strip().lower()) if isinstance(value, str) else None
        if got is None:
            return 0.0, f"expected true or false, got {value!r}", None
        return (1.0, "", None) if got == ref else (0.0, f"{got} is wrong", None)
    x = to_number(value)
    if x is None:
        return 0.0, f"{value!r} is not a single number", False if spec["kind"] == "raw" else None
    unit = (ans_unit or doc_unit) if spec["money"] else 1
    a, b = x * unit, Fraction(str(ref)) * (doc_unit if spec["money"] else 1)
    if spec.get("sign_free"):
        a, b = abs(a), abs(b)
    abs_tol = Fraction(str(spec.get("abs_tol", 0.0))) * (doc_unit if spec["money"] else 1)
    ok = _close(a, b, spec["rel_tol"], abs_tol)
    confused = None if ok else next((k for k in ((1000, 10 ** 6, 10 ** 9) if spec["money"] else (100,)) if b and (
        _close(a, b * k, spec["rel_tol"], abs_tol * k) or _close(a * k, b, spec["rel_tol"], abs_tol))), None)
    traced = None
    if spec["kind"] == "raw":  # traceability first: a right number that is not where it is asked is invented
        forms = {abs(x), abs(a / doc_unit if spec["money"] else x)}
        scope = doc_nums if scope_nums is None else scope_nums
        traced = bool(forms & scope)
        if not traced and not confused:
            if forms & doc_nums:
                return 0.0, (f"untraceable: {value!r} does not occur in {' / '.join(spec['sections'])} (only "
                             "elsewhere in the document)"), False
            return 0.0, f"fabricated: {value!r} does not occur in the document", False
    if confused:
        return 0.0, f"unit-confused: {value!r} is off by a factor of {confused}", traced
    if spec["kind"] == "raw" and spec.get("sections") and not cites(source, spec["sections"]):
        why = "no source given" if source is None else f"source {repr(source)[:80]} is not the table the question names"
        return 0.0, f"wrong source: {why} ({' / '.join(spec['sections'])})", traced
    if ok:
        return 1.0, "", traced
    return 0.0, f"{value!r} is wrong", traced


class ExtractVerifier:
    """Per-field grading of one JSON answer; partial credit is the mean field score."""

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        fields: dict[str, dict] = dict(task.hidden["fields"])
        obj, why = parse_answer(trajectory.completion_text)
        w = ctx.format_weight
        if obj is None:
            comps = {f"field:{n}": 0.0 for n in fields} | {"format": 0.0, "traceability": 0.0, "fabricated": 0.0,
                                                            "correct": 0.0}
            return Verdict(0.0, False, comps, why, cost_s=time.perf_counter() - t0)
        doc_unit = UNIT_FACTORS[task.hidden["unit"]]
        needs_unit = any(f["money"] for f in fields.values())
        ans_unit = unit_factor(obj.get("unit")) if needs_unit else None
        doc = document_text(task)
        doc_nums, sections = document_numbers(doc), document_sections(doc)
        sources = obj.get("sources") if isinstance(obj.get("sources"), dict) else {}
        cited = [n for n, f in fields.items() if f["kind"] == "raw" and f.get("sections")]
        scores, problems, traced, fabricated = {}, [], [], 0
        for name, spec in fields.items():
            if name not in obj:
                scores[name], reason, tr = 0.0, "missing", False if spec["kind"] == "raw" else None
            else:
                scope = (set().union(*(document_numbers(sections.get(s, "")) for s in spec["sections"]))
                         if spec["kind"] == "raw" and spec.get("sections") else None)
                scores[name], reason, tr = grade_field(spec, obj[name], ans_unit, doc_unit, doc_nums, scope,
                                                       sources.get(name))
            if tr is not None:
                traced.append(tr)
            fabricated += reason.startswith("fabricated")
            if reason:
                problems.append(f"{name}: {reason}")
        format_ok = (all(n in obj for n in fields) and (ans_unit is not None or not needs_unit)
                     and all(n in sources for n in cited))
        if needs_unit and ans_unit is None:
            problems.append(f"unit: {'missing' if 'unit' not in obj else repr(obj['unit']) + ' not recognised'}"
                            " (amounts read as printed)")
        correct = sum(scores.values()) / max(len(scores), 1)
        comps = {f"field:{n}": s for n, s in scores.items()} | {
            "format": float(format_ok), "traceability": sum(traced) / len(traced) if traced else 1.0,
            "fabricated": float(fabricated), "correct": correct}
        return Verdict((1.0 - w) * correct + w * float(format_ok), correct >= 1.0, comps,
                       "; ".join(problems) or "all fields correct", cost_s=time.perf_counter() - t0)


register_verifier("extract", ExtractVerifier())


# --- reference solver (reads the document text, never task.hidden) --------------------------------
def parse_tables(doc: str) -> tuple[dict[str, dict[str, dict[int, str]]], str | None]:
    """Every '## TITLE' table as {title: {row label: {year: printed value}}}, and the statements' unit."""
    tables: dict[str, dict[str, dict[int, str]]] = {}
    unit = None
    for block in re.split(r"^## ", doc, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        years: list[int] = []
        rows: dict[str, dict[int, str]] = {}
        for line in body.splitlines():
            m = re.match(r"\(in (\w+)", line)
            if m and unit is None and title.startswith("CONSOLIDATED"):
                unit = m.group(1)
            cells = ([c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|")
                     else re.split(r"\s{2,}", line.strip()))
            head = cells[1:] if line.startswith("|") else cells
            if head and all(re.fullmatch(r"\d{4}", c) for c in head):
                years = [int(c) for c in head]
            elif years and len(cells) == len(years) + 1 and not set(cells[0]) <= set("-:"):
                rows[cells[0]] = dict(zip(years, cells[1:]))
        tables[title.strip()] = rows
    return tables, unit


def solve(task: Any) -> str:
    """The completion a careful reader writes: values looked up in the printed tables."""
    text = task.question
    tables, unit = parse_tables(document_text(task))
    names = re.findall(r'^- "(\w+)":', text, flags=re.M)

    def lookup(metric: str, year: int) -> str:
        stmt, label, _ = LINE_ITEMS[metric]
        return tables[stmt][label][year]

    out: dict[str, Any] = {}
    for name in names:
        if name == "unit":
            out["unit"] = unit
            continue
        if name == "sources":
            out["sources"] = {n: LINE_ITEMS[n.rsplit("_", 1)[0]][0] for n in names
                              if n.rsplit("_", 1)[0] in LINE_ITEMS}  # the title of the table it was read in
            continue
        metric, year = name.rsplit("_", 1)[0], int(name.rsplit("_", 1)[1])
        if metric not in DERIVED:
            out[name] = lookup(metric, year)
            continue
        inputs, fn, kind, _ = DERIVED[metric]
        v = fn(*(to_number(lookup(m, year + off)) for m, off in inputs))
        out[name] = round(float(v), 1 if kind == "pct" else 2) if kind in ("pct", "ratio") else (
            bool(v) if kind == "check" else int(v))
    return "```json\n" + json.dumps(out) + "\n```"
