"""honing.verify.math_closed against naive references: sympy's value of the same LaTeX, and
math-verify's own verdict wherever the fast closed-form path gives one."""

from __future__ import annotations

import logging
import math
import random

import pytest

from honing.verify.math import _number, normalize
from honing.verify.math_closed import closed_compare, closed_value, number_set


@pytest.mark.parametrize(("latex", "value"), [
    ("2\\sqrt{2}", 2 * math.sqrt(2)), ("\\sqrt{8}", math.sqrt(8)), ("\\frac{\\pi}{4}", math.pi / 4),
    ("\\pi/4", math.pi / 4), ("\\frac{\\sqrt{3}}{2}", math.sqrt(3) / 2), ("\\frac{1}{2}\\sqrt{3}", math.sqrt(3) / 2),
    ("3^{4}", 81.0), ("2^10", 1024.0), ("-\\frac13", -1 / 3), ("\\sqrt3", math.sqrt(3)), ("(1+2)\\cdot3", 9.0),
    ("2^{-2}", 0.25), ("\\frac{1+\\sqrt{5}}{2}", (1 + math.sqrt(5)) / 2), ("3\\times 10^{2}", 300.0),
])
def test_values(latex: str, value: float) -> None:
    assert closed_value(latex) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("latex", [
    "x", "2x", "\\sqrt{-1}", "1/0", "\\frac{1}{0}", "2\\frac{1}{3}", "2 3", "9^{9^{9}}", "\\sin 2", "e^2", "",
    "\\sqrt[3]{8}", "(1+2", "1+", "\\{1,2\\}", "11/9\\pi",
])
def test_refuses_what_it_cannot_be_sure_of(latex: str) -> None:
    assert closed_value(latex) is None


def test_number_sets() -> None:
    assert number_set("\\{1,2\\}", _number) == number_set("\\{2,1\\}", _number)
    assert number_set("\\{1,x\\}", _number) is None and number_set("(1,2)", _number) is None
    assert closed_compare("\\{1,2\\}", "\\{2,1.0\\}", _number) is True
    assert closed_compare("\\{1,2\\}", "\\{1,3\\}", _number) is False
    assert closed_compare("\\{3\\}", "3", _number) is None  # a set against a number: math-verify decides


def _random_closed(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < 0.3:
        return str(rng.randint(1, 12))
    if r < 0.45:
        return f"\\sqrt{{{_random_closed(rng, depth + 1)}}}"
    if r < 0.6:
        return f"\\frac{{{_random_closed(rng, depth + 1)}}}{{{_random_closed(rng, depth + 1)}}}"
    if r < 0.7:
        return f"{rng.randint(2, 9)}\\pi"
    if r < 0.8:
        return f"{_random_closed(rng, depth + 1)}^{{{rng.randint(0, 3)}}}"
    return f"({_random_closed(rng, depth + 1)}{rng.choice(['+', '-', '*', '/'])}{_random_closed(rng, depth + 1)})"


def test_values_match_sympy() -> None:
    from latex2sympy2_extended.latex2sympy2 import latex2sympy

    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        s = _random_closed(rng)
        v = closed_value(s)
        ref = complex(latex2sympy(s).evalf(30))
        if v is None:
            continue
        assert abs(v - ref.real) <= 1e-9 * max(1.0, abs(ref)) and abs(ref.imag) < 1e-12, (s, v, ref)
        checked += 1
    assert checked > 250


def test_fast_verdicts_agree_with_math_verify() -> None:
    """Wherever closed_compare answers, math-verify gives the same verdict."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    rng = random.Random(1)
    decided = 0
    for _ in range(250):
        a = _random_closed(rng)
        b = rng.choice([a, _random_closed(rng), f"{a}+1", f"2*{a}" if rng.random() < 0.5 else f"\\frac{{{a}}}{{1}}"])
        verdict = closed_compare(normalize(a), normalize(b), _number)
        if verdict is None:
            continue
        decided += 1
        assert verdict == bool(verify(parse(f"\\boxed{{{a}}}"), parse(f"\\boxed{{{b}}}"))), (a, b, verdict)
    assert decided > 150
