"""Log records -> pool items: verifiable tasks where a verifier can be attached, judge-graded tasks
or preference material otherwise, each marked with its `kind`.

Kinds, first match wins:

- `code`: metadata `tests` (Python asserts that call the function, e.g. `assert add(2, 3) == 5`).
  Verifier `code` in its assert mode: the asserts become `check(candidate)` and run in the
  sandbox against the model's function. The function's name is the first one the asserts call.
- `extract`: metadata `correction`, a JSON object the user supplied as the right extraction
  (or a string holding one). Verifier `honing.flywheel.verifiers:json_fields`, field by field.
- `math`: metadata `accepted_answer` (a number or an expression), or a reply the user accepted
  (`accepted: true` / positive `feedback`) whose final answer is marked (`\\boxed{}` or
  `<answer>` tags; a bare last number is not trusted). Verifier `math`.
- `tool`: a tool episode (tool messages or tool calls) with `outcome`/`tool_outcome`
  `{"success": true, "answer": ...}`. The logged tool results are given as context and the final
  answer is graded (`math` for numbers, `exact` otherwise): the production tools themselves are
  not replayable here. A successful or failed episode without an answer is preference material.
- `preference`: `chosen`/`rejected` in metadata, a negative `feedback` with a text correction
  (chosen = the correction, rejected = the reply), or one-sided feedback on a reply (`label`
  desirable/undesirable, KTO-style). Never yielded as an RL task.
- `judge`: everything else. Verifier `judge` with a rubric; a reply the user accepted is the
  hidden reference. Yielded by a pool source only when asked for (`kinds: [judge]`).

Nothing here sees a raw value after `scrub_item`: the pipeline converts, then scrubs the whole
item (prompt, hidden material, pair, log id) before anything is stored.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from honing.flywheel.logs import LogRecord
from honing.tasks.types import Task, VerifierSpec

VERIFIABLE_KINDS = ("code", "extract", "math", "tool")
KINDS = VERIFIABLE_KINDS + ("judge", "preference")
JSON_FIELDS = "honing.flywheel.verifiers:json_fields"
JUDGE_RUBRIC = ("Grade how well the answer does what the user asked: correct, complete, and no longer than needed. "
                "A reference answer the user accepted may be given; an answer as good as it scores high.")
_POSITIVE = {"accepted", "accept", "thumbs_up", "up", "positive", "good", "like", "yes", "1", "true"}
_NEGATIVE = {"rejected", "reject", "thumbs_down", "down", "negative", "bad", "dislike", "no", "0", "false"}
_NUMBER = re.compile(r"^\s*[-+]?(?:\d+(?:[.,]\d+)*|\.\d+)(?:[eE][-+]?\d+)?\s*%?\s*$")


@dataclass
class PoolItem:
    kind: str
    question: str
    log_id: str
    where: str
    task: Task | None = None  # every kind but preference
    pair: dict[str, Any] | None = None  # preference: prompt, chosen, rejected, label
    notes: list[str] = field(default_factory=list)


def feedback(meta: dict[str, Any]) -> bool | None:
    """True (the user accepted the reply), False (rejected it) or None (no signal)."""
    acc = meta.get("accepted")
    if isinstance(acc, bool):
        return acc
    if isinstance(acc, str) and acc.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return acc.strip().lower() in ("true", "yes", "1")  # OpenAI metadata values are strings
    fb = meta.get("feedback")
    if isinstance(fb, dict):
        fb = fb.get("rating", fb.get("label", fb.get("value")))
    if isinstance(fb, bool):
        return fb
    if isinstance(fb, (int, float)):
        return fb > 0
    if isinstance(fb, str):
        low = fb.strip().lower()
        return True if low in _POSITIVE else False if low in _NEGATIVE else None
    return None


def _prompt(rec: LogRecord) -> tuple[dict[str, str], ...]:
    """The conversation up to the reply, in the roles a Task prompt allows (tool turns are
    folded into the tool kind's context instead)."""
    return tuple({"role": m["role"], "content": m["content"]} for m in rec.messages
                 if m["role"] in ("system", "user", "assistant") and not m.get("tool_calls"))


def _entry_point(tests: str, reply: str | None) -> str | None:
    called: list[str] = []
    for node in ast.walk(ast.parse(tests)):
        if isinstance(node, ast.Assert):
            called += [c.func.id for c in ast.walk(node.test) if isinstance(c, ast.Call)
                       and isinstance(c.func, ast.Name) and not hasattr(builtins, c.func.id)]
    if reply:  # prefer a function the accepted reply defines that the tests call
        try:
            defined = {n.name for n in ast.walk(ast.parse(_code_of(reply))) if isinstance(n, ast.FunctionDef)}
            for name in called:
                if name in defined:
                    return name
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass
    return called[0] if called else None


def _code_of(text: str) -> str:
    from honing.verify.code import extract_program

    return extract_program(text)[0]


def code_hidden(tests: str, reply: str | None) -> dict[str, Any] | None:
    """The `code` verifier's assert-mode material from user tests, or None if they are not usable."""
    try:  # hostile input: null bytes (ValueError), absurd nesting (RecursionError, MemoryError)
        tree = ast.parse(tests)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
        return None
    fn = _entry_point(tests, reply)
    if fn is None:
        return None
    body = "\n".join("    " + line for line in tests.splitlines()) or "    pass"
    # the runner executes the prompt alone, and humaneval_program appends "    pass" + the candidate
    # to it: a stub with a body is valid both ways (the candidate's own def replaces it)
    return {"test": f"def check(candidate):\n{body}\n", "prompt": f"def {fn}(*args, **kwargs):\n    pass\n",
            "entry_point": fn}


def _correction(meta: dict[str, Any]) -> dict[str, Any] | None:
    c = meta.get("correction")
    if isinstance(c, str):
        try:
            c = json.loads(c)
        except ValueError:
            return None
    return c if isinstance(c, dict) and c else None


def _accepted_answer(rec: LogRecord) -> str | None:
    meta = rec.metadata
    ans = meta.get("accepted_answer")
    if isinstance(ans, (int, float)) and not isinstance(ans, bool):
        return str(ans)
    if isinstance(ans, str) and ans.strip():
        return ans.strip()
    if feedback(meta) and rec.response:
        from honing.verify.extract import EXTRACTORS

        for ex in ("answer_tag", "boxed"):
            got, ok = EXTRACTORS[ex](rec.response)
            if got and ok:
                return got.strip()
    return None


def _task(kind: str, prompt: tuple[dict[str, str], ...], verifier: VerifierSpec, hidden: dict[str, Any],
          rec: LogRecord) -> Task:
    return Task(id="", domain=f"flywheel:{kind}", prompt=prompt, verifier=verifier, hidden=hidden,
                tags=("flywheel", kind), metadata={"kind": kind})


def convert(rec: LogRecord) -> PoolItem:
    """The pool item of one (not yet scrubbed) record; see the module docstring for the rules."""
    meta, prompt = rec.metadata, _prompt(rec)
    item = PoolItem("judge", rec.question, rec.log_id, rec.where)
    if isinstance(meta.get("tests"), str) and meta["tests"].strip():
        hidden = code_hidden(meta["tests"], rec.response)
        if hidden is not None:
            item.kind, item.task = "code", _task("code", prompt, VerifierSpec("code"), hidden, rec)
            return item
        item.notes.append("tests unusable (no asserts calling a function)")
    corr = _correction(meta)
    if corr is not None:
        item.kind = "extract"
        item.task = _task("extract", prompt, VerifierSpec(JSON_FIELDS), {"fields": corr}, rec)
        return item
    outcome = meta.get("outcome", meta.get("tool_outcome"))
    if rec.is_tool_episode and isinstance(outcome, dict):
        return _tool_item(rec, outcome, item)
    ans = _accepted_answer(rec)
    if ans is not None and feedback(meta) is not False:
        item.kind, item.task = "math", _task("math", prompt, VerifierSpec("math"), {"answer": ans}, rec)
        return item
    pair = _pair(rec)
    if pair is not None:
        item.kind, item.pair = "preference", pair
        return item
    hidden = {"reference": rec.response} if rec.response and feedback(meta) else {}
    item.task = _task("judge", prompt, VerifierSpec("judge", {"rubric": JUDGE_RUBRIC}), hidden, rec)
    return item


def _tool_item(rec: LogRecord, outcome: dict[str, Any], item: PoolItem) -> PoolItem:
    success, ans = outcome.get("success"), outcome.get("answer")
    if success is True and ans is not None and str(ans).strip():
        ans = str(ans).strip()
        observations = [m["content"] for m in rec.messages if m["role"] == "tool" and m["content"]]
        question = rec.question
        context = "\n\n".join(f"[tool result {i + 1}]\n{o}" for i, o in enumerate(observations))
        text = f"{question}\n\nResults of the tools already called:\n{context}" if context else question
        system = [{"role": "system", "content": m["content"]} for m in rec.messages if m["role"] == "system"]
        ver = "math" if _NUMBER.match(ans) else "exact"
        item.kind, item.question = "tool", text
        item.task = _task("tool", tuple(system) + ({"role": "user", "content": text},), VerifierSpec(ver),
                          {"answer": ans}, rec)
        return item
    item.kind = "preference"
    item.pair = {"prompt": [dict(m) for m in _prompt(rec)], "chosen": rec.response if success else None,
                 "rejected": None if success else rec.response,
                 "label": "desirable" if success else "undesirable", "signal": "tool_outcome"}
    return item


def _pair(rec: LogRecord) -> dict[str, Any] | None:
    meta, fb = rec.metadata, feedback(rec.metadata)
    chosen = meta.get("chosen") if isinstance(meta.get("chosen"), str) else None
    rejected = meta.get("rejected") if isinstance(meta.get("rejected"), str) else None
    if fb is False and isinstance(meta.get("correction"), str) and rec.response:
        chosen, rejected = meta["correction"], rec.response
    if chosen is None and rejected is None:
        if fb is None or not rec.response or fb:  # an accepted reply is judge reference material instead
            return None
        rejected = rec.response
    return {"prompt": [dict(m) for m in _prompt(rec)], "chosen": chosen, "rejected": rejected,
            "label": "pair" if chosen and rejected else ("desirable" if chosen else "undesirable"),
            "signal": "feedback"}


def scrub_item(item: PoolItem, deid: Any, report: Any) -> PoolItem:
    """The item with every string scrubbed. Verifier material that PII touched is not trusted: a
    math answer or code test with a placeholder in it can no longer grade, so the task becomes
    judge material (an extraction correction stays: its document is scrubbed the same way)."""
    from honing.tasks.types import task_to_json

    log_id = deid.scrub(item.log_id, report)[:200]
    question = deid.scrub(item.question)  # also in the prompt: counted there, not twice
    pair = deid.scrub_value(item.pair, report) if item.pair is not None else None
    task, kind, notes = item.task, item.kind, list(item.notes)
    if task is not None:
        tj = task_to_json(task)
        prompt = tuple(deid.scrub_value(tj["prompt"], report))
        hidden = deid.scrub_value(tj["hidden"], report)
        if kind in ("code", "math", "tool") and hidden != tj["hidden"]:
            notes.append(f"{kind} verifier material held personal data; demoted to judge")
            kind = "judge"
            task = replace(task, verifier=VerifierSpec("judge", {"rubric": JUDGE_RUBRIC}), hidden={},
                           domain="flywheel:judge", tags=("flywheel", "judge"))
        else:
            task = replace(task, hidden=hidden)
        task = replace(task, prompt=prompt)
    return PoolItem(kind, question, log_id, item.where, task, pair, notes)


def content_id(item: PoolItem) -> str:
    """A content address: the same scrubbed content always gets the same id."""
    from honing.tasks.types import task_to_json

    body = task_to_json(item.task) if item.task is not None else item.pair
    body = {k: v for k, v in (body or {}).items() if k not in ("id", "metadata")}
    blob = json.dumps({"kind": item.kind, "body": body}, sort_keys=True, default=str)
    return "flywheel/" + hashlib.sha256(blob.encode()).hexdigest()[:20]
