"""Final-answer extraction for maths completions: what the `math` verifier grades.

The `auto` extractor reads a completion the way math-verify's own extraction does, in this
priority order (the first tier that finds anything decides; inside a tier the answer nearest
the end of the text wins). A reasoning model's `<think>...</think>` is skipped: only what
follows it is read.

0. "The final answer is X. I hope it is correct." (the MATH few-shot format).
1. `\\boxed{...}` (and `\\fbox{...}`). Boxed answers next to each other ("\\boxed{1} and
   \\boxed{2}", "\\boxed{(1,2)}, \\boxed{(2,1)}") are one list answer `1, 2`; joined by "or" a
   hedge `1 or 2`; boxed answers apart from each other that say different things are several
   final answers (no credit).
2. `<answer>...</answer>` tags: the same rule for several different tags.
3. an anchored phrase: "final answer ... is X" (up to 100 characters between), then "the
   answer is X", "Answer: X" (the last such phrase), where X is a LaTeX span or a plain
   expression starting within 50 characters of "answer".
4. the last LaTeX span (`$$...$$`, `\\[...\\]`, `$...$`, `\\(...\\)`) or plain expression,
   whichever ends later. Spans written one after another with "," or "and" between them are
   one list answer (`$-2$, $1$` is `-2, 1`); joined by "or" they are a hedge, kept as
   `a or b` so the hedge rule refuses them.

Plain expressions: a number standing on its own (after the start, a space, `=` or `:`, never
inside a word: `AZYUK2A` holds none), with thousands separators (`1,000`, `1 000`), a decimal
comma (`1000,99`), a leading dot (`.4`), a currency sign before it and `%`/percent/pct after
it; or simple arithmetic such as `1/3` or `(9+1)`. Numbers come back canonical (`1000.99`,
`0.4`, `28\\%`).

Each result carries `mv_text`, the smallest piece of the completion that math-verify's own
parser reads the same way (`$...$` for a span, `\\boxed{...}` for a boxed answer), so the
symbolic slow path grades exactly what was extracted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from honing.verify.extract import braced_after, single_answer


@dataclass(frozen=True)
class Extracted:
    """One final answer: `answer` for honing's fast paths, `mv_text` for math-verify."""

    answer: str | None
    format_ok: bool
    tier: str = "none"
    mv_text: str = ""


NONE = Extracted(None, False)

# ----------------------------------------------------------------------------- tier 1 and 2


_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


# What may stand between boxed answers that are parts of one list answer ("\\boxed{1} and \\boxed{2}",
# "\\boxed{(1,2)}, \\boxed{(2,1)}", "y_1 = \\boxed{..} \\) and \\( y_2 = \\boxed{..}"): punctuation, "and"/"or",
# spacing commands, math delimiters, a short \\text{}, a variable being assigned. Anything else (prose)
# makes them separate final answers.
_BOX_SEP = re.compile(r"(?:\s|[,;.&]|\band\b|\bor\b|\\q?quad|\\[,;!: ]|\\(?:text|textbf|mbox)\{[^{}]{0,30}\}"
                      r"|\$|\\[()\[\]]|[a-zA-Z](?:_\{?\w+\}?)?\s*=)*", re.I)
_OR = re.compile(r"\bor\b", re.I)


def _adjacent(sep: str) -> bool:
    return bool(_BOX_SEP.fullmatch(sep))


def _reference_parts(sep: str) -> bool:
    """In a reference (trusted text) boxed parts are one list when only symbols or an 'and' stand
    between them ('\\boxed{1} papers and \\boxed{2} bins'); other words make the last one the answer."""
    return _adjacent(sep) or not re.search(r"[a-zA-Z]", sep) or bool(re.search(r"\band\b", sep, re.I))


def _box_runs(text: str, boxes: list[tuple[int, int, str]], joins=_adjacent) -> list[tuple[list[str], bool]]:
    """Boxed answers grouped into runs of adjacent ones: (distinct contents in order, joined by 'or')."""
    boxes = sorted(boxes)
    runs: list[tuple[list[str], bool]] = []
    prev_end = None
    for start, end, content in boxes:
        sep = text[prev_end:start] if prev_end is not None else None
        c = content.strip()
        if sep is not None and joins(sep):
            items, hedged = runs[-1]
            runs[-1] = (items + [c] if c not in items else items, hedged or bool(_OR.search(_strip_text_cmds(sep))))
        else:
            runs.append(([c], False))
        prev_end = end
    return runs


def _run_answer(items: list[str], hedged: bool, n_boxes: int) -> Extracted:
    """One run as an answer: 'a' alone, 'a, b' for a list, 'a or b' for a hedge."""
    sep = " or " if hedged else ", "
    return Extracted(sep.join(items), n_boxes == 1, "boxed", sep.join(f"\\boxed{{{c}}}" for c in items))


def _boxed_answer(text: str, boxes: list[tuple[int, int, str]]) -> Extracted:
    """The boxed answer; runs that say different things are several final answers (no credit)."""
    runs = _box_runs(text, boxes)
    if len({frozenset(items) for items, _ in runs}) > 1:
        return Extracted(None, False, "boxed")
    items, _ = runs[-1]
    return _run_answer(items, any(h for _, h in runs), len(boxes))


def _strip_text_cmds(sep: str) -> str:
    return re.sub(r"\\(?:text|textbf|mbox)\{([^{}]*)\}", r" \1 ", sep)


# ----------------------------------------------------------------------------- LaTeX spans

_SPAN = re.compile(
    r"(?<!\\)\$\$(?P<dd>(?:[^$]|\$(?!\$))+?)(?<!\\)\$\$"
    r"|(?<!\\)\\\[(?P<db>(?:[^\\]|\\(?!\]))+?)(?<!\\)\\\]"
    r"|(?<![\\\d])\$(?P<id>(?:\\\$|[^\n$])+?)(?<!\\)\$"
    r"|(?<!\\)\\\((?P<ip>(?:[^\\\n]|\\(?!\)))+?)(?<!\\)\\\)",
    re.S,
)
_PCT_AFTER = re.compile(r"\s*(?:\\?%|[Pp]ercentage|[Pp]ercent|[Pp]ct)")
_JOIN = re.compile(r"\s*(,?\s*and|,?\s*or|,)\s*$", re.I)


@dataclass(frozen=True)
class _Item:
    start: int
    end: int
    answer: str
    mv_text: str


def _spans(text: str) -> list[_Item]:
    """LaTeX spans, each with a `%`/percent right after it folded in."""
    items = []
    for m in _SPAN.finditer(text):
        body = next(v for v in m.groupdict().values() if v is not None).strip()
        end = m.end()
        if p := _PCT_AFTER.match(text, end):
            body, end = body + "\\%", p.end()
        if body:
            items.append(_Item(m.start(), end, body, m.group(0) + ("\\%" if end != m.end() else "")))
    return items


def _joined(text: str, items: list[_Item], k: int) -> _Item:
    """Item k together with the spans before it that are joined to it by ',', 'and' or 'or'."""
    group, seps = [items[k]], []
    while k > 0 and len(group) < 6:
        between = text[items[k - 1].end: items[k].start]
        m = _JOIN.match(between) if between.strip() else None
        if not (m and m.start() == 0):
            break
        seps.append("or" if "or" in m[1].lower() else ",")
        k -= 1
        group.append(items[k])
    if len(group) == 1:
        return group[0]
    group.reverse()
    seps.reverse()
    ans, mv = group[0].answer, group[0].mv_text
    for sep, it in zip(seps, group[1:]):
        ans += (" or " if sep == "or" else ", ") + it.answer
        mv += (" or " if sep == "or" else ", ") + it.mv_text
    return _Item(group[0].start, group[-1].end, ans, mv)


# ----------------------------------------------------------------------------- plain expressions

_PRE = r"(?:(?<=[\s=:])|^)(?:\*\*)?"
_CURRENCY = "$€£¥₹₽₩"
_NUMBER = (r"(?P<num>-?(?:[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?|[1-9]\d{0,2}(?: \d{3})+(?!\d)(?:\.\d+)?"
           r"|\d+[.,]\d+|\.\d+|\d+))"
           r"(?P<pct>\s*(?:%|\\%|[Pp]ercentage|[Pp]ercent|[Pp]ct)(?![a-zA-Z]))?")
_OPS = r"+\-*×/^()÷"
_EXPR = rf"(?P<expr>-?\(?-?\d[\d.\s{_OPS}]*[{_OPS}][\d.\s{_OPS}]*[\d)])(?=[.,:;\s)$]|$)"
_FRAC = r"(?P<frac>-?\\[dtc]?frac\{-?\d+(?:[.,]\d+)?\}\{-?\d+(?:[.,]\d+)?\})"
_PLAIN = re.compile(rf"{_FRAC}|{_PRE}(?:{_EXPR}|[{re.escape(_CURRENCY)}]?{_NUMBER})", re.M)


def canonical_number(num: str, pct: bool = False) -> str:
    """'1 000' -> '1000', '1,000.5' -> '1000.5', '1000,99' -> '1000.99', '.4' -> '0.4'."""
    neg = num.startswith("-")
    s = num.lstrip("-")
    if re.fullmatch(r"[1-9]\d{0,2}(?:[, ]\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "").replace(" ", "")
    elif re.fullmatch(r"\d+,\d+", s):
        s = s.replace(",", ".")
    if s.startswith("."):
        s = "0" + s
    return ("-" if neg else "") + s + ("\\%" if pct else "")


def _plain(text: str) -> list[_Item]:
    items = []
    for m in _PLAIN.finditer(text):
        if m["frac"]:
            items.append(_Item(m.start(), m.end(), m["frac"], f"${m['frac']}$"))
            continue
        if m["expr"]:
            ans = " ".join(m["expr"].split())
            if ans.count("(") != ans.count(")"):
                continue
        else:
            ans = canonical_number(m["num"], bool(m["pct"]))
        items.append(_Item(m.start(), m.end(), ans, ans))
    return items


def _mask(text: str, items: list[_Item]) -> str:
    chars = list(text)
    for it in items:
        chars[it.start: it.end] = " " * (it.end - it.start)
    return "".join(chars)


# ----------------------------------------------------------------------------- tiers 3 and 4

_ANCHOR = re.compile(r"answer", re.I)
_ANCHOR_WINDOW = 50


# "The final answer is X. I hope it is correct." (the MATH few-shot format; above boxed answers),
# and "final answer ... is X" with up to 100 characters between.
_FINAL_HOPE = re.compile(r"final answer is:?\s*", re.I)
_FINAL_IS = re.compile(r"final answer", re.I)
_IS = re.compile(r"\s+is:?\s*", re.I)


def _item_at(text: str, spans: list[_Item], plain: list[_Item], pos: int) -> _Item | None:
    """The span (with any spans joined after it) or plain expression starting at `pos`."""
    for k, it in enumerate(spans):
        if it.start == pos:
            while k + 1 < len(spans) and _joined(text, spans, k + 1).start <= pos:
                k += 1
            return _joined(text, spans, k)
    return next((it for it in plain if it.start == pos or (it.start == pos - 1 and text[pos - 1].isspace())), None)


def _final_hope(text: str, spans: list[_Item], plain: list[_Item]) -> _Item | None:
    for m in reversed(list(_FINAL_HOPE.finditer(text))):
        it = _item_at(text, spans, plain, m.end())
        if it and re.match(r"\.?\s?I hope", text[it.end: it.end + 10]):
            return it
    return None


def _final_is(text: str, spans: list[_Item], plain: list[_Item]) -> _Item | None:
    for m in reversed(list(_FINAL_IS.finditer(text))):
        for is_m in _IS.finditer(text, m.end(), min(len(text), m.end() + 100 + 8)):
            if is_m.start() - m.end() > 100:
                break
            if it := _item_at(text, spans, plain, is_m.end()):
                return it
    return None


def _candidates(text: str) -> tuple[list[_Item], list[_Item]]:
    spans = _spans(text)
    return spans, _plain(_mask(text, spans))


def _anchored(text: str, spans: list[_Item], plain: list[_Item]) -> _Item | None:
    anchors = [m.end() for m in _ANCHOR.finditer(text)]
    for a in reversed(anchors):
        near = [(k, it) for k, it in enumerate(spans) if a <= it.start <= a + _ANCHOR_WINDOW]
        near_plain = [it for it in plain if a <= it.start <= a + _ANCHOR_WINDOW]
        first_span = near[0] if near else None
        first_plain = near_plain[0] if near_plain else None
        if first_span and (not first_plain or first_span[1].start <= first_plain.start):
            k = first_span[0]
            while k + 1 < len(spans) and _joined(text, spans, k + 1).start <= spans[first_span[0]].start:
                k += 1
            return _joined(text, spans, k)
        if first_plain:
            return first_plain
    return None


def _last(text: str, spans: list[_Item], plain: list[_Item]) -> _Item | None:
    best_span = _joined(text, spans, len(spans) - 1) if spans else None
    best_plain = plain[-1] if plain else None
    if best_span and (not best_plain or best_span.end >= best_plain.end):
        return best_span
    return best_plain


def extract_math(text: str) -> Extracted:
    """The final answer of a maths completion (see the module docstring for the order)."""
    if "</think>" in text and (after := text.rsplit("</think>", 1)[1]).strip():
        text = after  # a reasoning model's answer follows its thinking
    if "I hope" in text:
        spans, plain = _candidates(text)
        if it := _final_hope(text, spans, plain):
            return Extracted(it.answer, False, "final_answer", it.mv_text)
    boxed = braced_after(text, "\\boxed") + braced_after(text, "\\fbox")
    if boxed:
        return _boxed_answer(text, boxed)
    if "<answer>" in text:
        found = _TAG.findall(text)
        ans = single_answer(found)
        if ans is None:
            return Extracted(None, False, "answer_tag")
        inner = extract_math(ans) if ("$" in ans or "\\(" in ans or "\\[" in ans) else None
        return Extracted(ans.strip(), len(found) == 1, "answer_tag",
                         inner.mv_text if inner and inner.answer else ans.strip())
    spans, plain = _candidates(text)
    if it := _final_is(text, spans, plain):
        return Extracted(it.answer, False, "final_answer", it.mv_text)
    if it := _anchored(text, spans, plain):
        return Extracted(it.answer, False, "anchored", it.mv_text)
    if it := _last(text, spans, plain):
        return Extracted(it.answer, False, "last", it.mv_text)
    return NONE


def reference_answer(gold: str) -> Extracted:
    """A reference as an answer: markup (`\\boxed`, `$...$`, tags) is read like a completion's;
    a reference with none is the answer as written (plain numbers made canonical)."""
    g = gold.strip()
    if "\\boxed" in g or "\\fbox" in g:
        runs = _box_runs(g, braced_after(g, "\\boxed") + braced_after(g, "\\fbox"), _reference_parts)
        if runs:  # a reference's last run of boxed parts is its answer
            ex = _run_answer(runs[-1][0], False, 1)
            return Extracted(ex.answer, True, "boxed", ex.mv_text)
    if "<answer>" in g or "$" in g or "\\(" in g or "\\[" in g:
        ex = extract_math(g)
        if ex.answer is not None:
            return ex
    if re.fullmatch(r"-?(?:[1-9]\d{0,2}(?:[, ]\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)", g):
        c = canonical_number(g)
        return Extracted(c, True, "plain", c)
    return Extracted(g, True, "plain", f"\\boxed{{{g}}}")
