"""Built-in verifiers: reasoning-gym scorers, exact match, numeric match; plus the format layer."""

from __future__ import annotations

import time
from typing import Any, Callable

from honing.rollout.types import Trajectory
from honing.tasks.gym import gym_dataset
from honing.verify.extract import EXTRACTORS, NUMBER
from honing.verify.registry import register_verifier
from honing.verify.types import Verdict, VerifyContext


def layered(correct: float, format_ok: bool, ctx: VerifyContext, details: str, t0: float) -> Verdict:
    """score = (1 - w) * correctness + w * format. `passed` is correctness alone."""
    w = ctx.format_weight
    fmt = 1.0 if format_ok else 0.0
    return Verdict(
        score=(1.0 - w) * correct + w * fmt,
        passed=correct >= 1.0,
        components={"correct": correct, "format": fmt},
        details=details,
        cost_s=time.perf_counter() - t0,
    )


def _bool_answer(answer: str, entry: dict[str, Any]) -> float:
    """'True'/'False' against the reference, case-insensitively."""
    return float(answer.strip().lower() == str(entry["answer"]).strip().lower())


# Scorers honing replaces. reasoning-gym 0.1.19's game_of_life_halting compares bool(answer) with
# bool(entry["answer"]), both non-empty strings, so every non-empty answer scored 1.
SCORER_FIXES: dict[str, Callable[[str, dict[str, Any]], float]] = {"game_of_life_halting": _bool_answer}
# The longest completion read whole as an answer (longer ones are not a bare answer).
MAX_WHOLE_ANSWER = 20_000


class ReasoningGymVerifier:
    """The dataset's own `score_answer` on the extracted answer.

    reasoning-gym's convention is an <answer> tag, so a completion with <answer> tags is graded on
    the tag's content, passed through intact (multi-line grids, comma lists, expressions; two
    different tags get no credit), whatever `ctx.extractor` is. Without tags a named extractor
    picks the answer; `auto` reads the last number when the reference is a plain number and the
    whole reply otherwise (a bare 'START,...,END' ladder must not be cut to its last number).
    Exactly one reading is scored: trying a second one would give a reply two chances (the
    last number for one reading, the first number for gsm_symbolic's scorer on the whole text).
    `format` is `ctx.extractor`'s.
    A scorer that raises on a malformed answer (boxnet, game_of_life, prime_factorization do)
    grades it 0, not as an infra error.
    """

    cheap = True  # in-process, bounded work: graded inline by the batch grader

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        text = trajectory.completion_text
        answer, format_ok = EXTRACTORS[ctx.extractor](text)
        name = task.verifier.params["dataset"]
        ds = gym_dataset(name, dict(task.verifier.params.get("params", {})))
        scorer = SCORER_FIXES.get(name, ds.score_answer)
        entry = task.hidden["entry"]
        raised: list[str] = []

        def score(a: str | None, note: bool = True) -> float:
            if a is None:
                return 0.0
            try:
                return float(scorer(a, entry))
            except Exception as e:  # noqa: BLE001 - the model's malformed answer, not an infra fault
                if note:
                    raised.append(f"{type(e).__name__}: {e}"[:200])
                return 0.0

        if "<answer>" in text:
            answer = EXTRACTORS["answer_tag"](text)[0]
        elif ctx.extractor == "auto" and not NUMBER.fullmatch(str(entry.get("answer", "")).strip()):
            whole = text.strip()
            answer = whole if whole and len(whole) <= MAX_WHOLE_ANSWER else None
        correct = score(answer)
        details = f"extracted={answer!r}" + (f"; scorer raised {raised[0]}" if raised else "")
        return layered(max(0.0, min(correct, 1.0)), format_ok, ctx, details, t0)


def _norm(s: str) -> str:
    return " ".join(s.strip().lower().split())


class ExactVerifier:
    """Normalised (case, whitespace) string equality with the reference answer."""

    cheap = True  # in-process, bounded work: graded inline by the batch grader

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        answer, format_ok = EXTRACTORS[ctx.extractor](trajectory.completion_text)
        ok = answer is not None and _norm(answer) == _norm(str(task.hidden["answer"]))
        return layered(float(ok), format_ok, ctx, f"extracted={answer!r}", t0)


class NumericVerifier:
    """Numeric equality within a relative tolerance (param `rel_tol`, default 1e-6)."""

    cheap = True  # in-process, bounded work: graded inline by the batch grader

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        answer, format_ok = EXTRACTORS[ctx.extractor](trajectory.completion_text)
        tol = float(task.verifier.params.get("rel_tol", 1e-6))
        try:
            a, b = float(str(answer).replace(",", "")), float(str(task.hidden["answer"]).replace(",", ""))
            ok = abs(a - b) <= tol * max(1.0, abs(b))
        except ValueError:
            ok = False
        return layered(float(ok), format_ok, ctx, f"extracted={answer!r}", t0)


register_verifier("reasoning_gym", ReasoningGymVerifier())
register_verifier("exact", ExactVerifier())
register_verifier("numeric", NumericVerifier())
