"""`json_fields`: grade a JSON answer field by field against a user-supplied correction.

The `extract` verifier is built for the finance documents (traceable numbers, cited tables,
units); a user's correction of a logged extraction is a plain JSON object (`{"invoice_no":
"A-17", "total": 1234.5, "items": [...]}`), so it gets this simpler grader. Tasks name it by
reference (`honing.flywheel.verifiers:json_fields`) so any process resolves it without a
registration step.

The completion must hold exactly one JSON object (the `extract` verifier's parser: a ```json
block, <answer> tags or a bare object). Each top-level field of `hidden["fields"]` scores 1 when
equal: strings after case and whitespace folding, numbers within `rel_tol` (default 1e-6; "1,234.50"
equals 1234.5), lists and objects recursively (lists in order). Score = (1 - format_weight) * mean
field score + format_weight * (every field present); passed = every field right. Not covered:
synonyms, dates written differently ("2024-01-02" vs "Jan 2, 2024"), reordered lists.
"""

from __future__ import annotations

import time
from typing import Any

from honing.rollout.types import Trajectory
from honing.verify.types import Verdict, VerifyContext


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.replace(",", "").replace("$", "").strip())
        except ValueError:
            return None
    return None


def same(want: Any, got: Any, tol: float) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and set(want) <= set(got) and all(same(v, got[k], tol) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(same(a, b, tol) for a, b in zip(want, got))
    if isinstance(want, bool) or want is None:
        return got is want
    a, b = _num(want), _num(got)
    if a is not None and b is not None:
        return abs(a - b) <= tol * max(1.0, abs(a))
    return " ".join(str(want).split()).casefold() == " ".join(str(got).split()).casefold()


class JsonFieldsVerifier:
    cheap = True  # in-process, bounded work

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        from honing.verify.finance import parse_answer

        t0 = time.perf_counter()
        fields = task.hidden.get("fields")
        if not isinstance(fields, dict) or not fields:
            return Verdict.infra("json_fields: task has no hidden['fields'] object", time.perf_counter() - t0)
        obj, why = parse_answer(trajectory.completion_text)
        w = ctx.format_weight
        if obj is None:
            return Verdict(0.0, False, {"correct": 0.0, "format": 0.0}, why, cost_s=time.perf_counter() - t0)
        tol = float(task.verifier.params.get("rel_tol", 1e-6))
        scores = {k: float(k in obj and same(v, obj[k], tol)) for k, v in fields.items()}
        correct = sum(scores.values()) / len(scores)
        fmt = float(all(k in obj for k in fields))
        wrong = [k for k, s in scores.items() if not s]
        return Verdict((1.0 - w) * correct + w * fmt, correct >= 1.0,
                       {f"field:{k}": s for k, s in scores.items()} | {"correct": correct, "format": fmt},
                       "all fields correct" if not wrong else "wrong or missing: " + ", ".join(wrong[:10]),
                       cost_s=time.perf_counter() - t0)


json_fields = JsonFieldsVerifier()
