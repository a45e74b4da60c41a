"""Built-in verifiers: reasoning-gym scorers, exact match, numeric match; plus the format layer."""

from __future__ import annotations

import time
from typing import Any

from honing.rollout.types import Trajectory
from honing.tasks.gym import gym_dataset
from honing.verify.extract import EXTRACTORS
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


class ReasoningGymVerifier:
    """The dataset's own `score_answer` on the extracted answer."""

    cheap = True  # in-process, bounded work: graded inline by the batch grader

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        answer, format_ok = EXTRACTORS[ctx.extractor](trajectory.completion_text)
        ds = gym_dataset(task.verifier.params["dataset"], dict(task.verifier.params.get("params", {})))
        correct = float(ds.score_answer(answer, task.hidden["entry"])) if answer is not None else 0.0
        return layered(correct, format_ok, ctx, f"extracted={answer!r}", t0)


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
