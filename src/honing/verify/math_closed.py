"""Exact-enough verdicts without sympy for two common answer shapes the `math` verifier sees:

- closed forms made only of numbers: `2\\sqrt{2}`, `\\frac{\\pi}{4}`, `\\pi/4`, `\\frac{\\sqrt{3}}{2}`,
  `3^{4}`, evaluated in floating point by a small recursive-descent reader (`closed_value`);
- sets of plain numbers, `\\{1, 3\\}` (`number_set`).

`closed_compare` returns a verdict only where it is certain: values equal to 1e-12 (relative)
are equal, values apart by more than 1e-4 relative and 1e-5 absolute are different
(math-verify itself rounds numbers to 6 decimals, so it cannot call those equal); anything in between, anything with a variable,
an equation, a percentage or a function the reader does not know goes to math-verify.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Callable

EQUAL_REL = 1e-12
DIFFERENT_REL = 1e-4
DIFFERENT_ABS = 1e-5  # math-verify rounds to 6 decimals: closer values may be equal to it
_MAX_EXP = 64

_TOKEN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+|\\frac|\\sqrt|\\pi|\\cdot|\\times|[-+*/^(){}])")


def _tokens(s: str) -> list[str] | None:
    out, i = [], 0
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    while i < len(s):
        if s[i].isspace():
            i += 1
            continue
        m = _TOKEN.match(s, i)
        if not m:
            return None  # a letter, a command or a symbol the reader does not know
        out.append(m.group(1))
        i = m.end()
    return out


class _Reader:
    def __init__(self, toks: list[str]) -> None:
        self.t, self.i = toks, 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError(f"expected {want!r}")
        self.i += 1
        return tok

    def expr(self) -> float:
        v = self.term()
        while self.peek() in ("+", "-"):
            v = v + self.term() if self.take() == "+" else v - self.term()
        return v

    def term(self) -> float:
        v = self.unary()
        divided = False
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                v *= self.unary()
            elif tok == "/":
                self.take()
                divided = True
                d = self.unary()
                if d == 0:
                    raise ValueError("division by zero")
                v /= d
            elif tok is not None and (tok[0].isdigit() or tok[0] == "." or tok in ("\\frac", "\\sqrt", "\\pi", "(", "{")):
                if tok[0].isdigit() or tok[0] == "." or tok == "\\frac" or divided:
                    # '2 3'; '2\frac{1}{3}' (a mixed number?); '11/9\pi' (11/(9 pi) to sympy)
                    raise ValueError("ambiguous juxtaposition")
                v *= self.power()  # implicit product: 2\sqrt{3}, 3\pi
            else:
                return v

    def unary(self) -> float:
        if self.peek() in ("+", "-"):
            return -self.unary() if self.take() == "-" else self.unary()
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            e = self.group() if self.peek() == "{" else self.unary_atom()
            if abs(e) > _MAX_EXP or (base < 0 and e != int(e)):
                raise ValueError("exponent out of range")
            return base ** e
        return base

    def unary_atom(self) -> float:
        if self.peek() == "-":
            self.take()
            return -self.atom()
        return self.atom()

    def group(self) -> float:
        self.take("{")
        v = self.expr()
        self.take("}")
        return v

    def digit_arg(self) -> float:
        """`\\frac13`, `\\sqrt3`: a single digit as the argument."""
        tok = self.take()
        if not (tok.isdigit()):
            raise ValueError("bad argument")
        if len(tok) > 1:  # '\frac13' tokenises as '13': split it
            self.t[self.i:self.i] = [tok[1:]]
            tok = tok[0]
        return float(tok)

    def atom(self) -> float:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end")
        if tok == "{":
            return self.group()
        if tok == "(":
            self.take()
            v = self.expr()
            self.take(")")
            return v
        if tok == "\\pi":
            self.take()
            return math.pi
        if tok == "\\frac":
            self.take()
            num = self.group() if self.peek() == "{" else self.digit_arg()
            den = self.group() if self.peek() == "{" else self.digit_arg()
            if den == 0:
                raise ValueError("division by zero")
            return num / den
        if tok == "\\sqrt":
            self.take()
            if self.peek() == "[":
                raise ValueError("nth root")
            v = self.group() if self.peek() == "{" else self.digit_arg()
            if v < 0:
                raise ValueError("sqrt of a negative")
            return math.sqrt(v)
        if tok[0].isdigit() or tok[0] == ".":
            self.take()
            return float(tok)
        raise ValueError(f"unexpected {tok!r}")


def closed_value(s: str) -> float | None:
    """The value of a numbers-only closed form, or None when the reader cannot be sure of it."""
    toks = _tokens(s)
    if not toks:
        return None
    r = _Reader(toks)
    try:
        v = r.expr()
    except (ValueError, OverflowError, ZeroDivisionError, IndexError):
        return None
    if r.peek() is not None or not math.isfinite(v):
        return None
    return v


_SET = re.compile(r"^\\\{(.*)\\\}$")


def number_set(s: str, number: Callable[[str], Fraction | None]) -> frozenset[Fraction] | None:
    """`\\{1,3\\}` as a set of exact values (`number` reads one normalised element), else None."""
    m = _SET.match(s)
    if not m:
        return None
    vals = [number(part) for part in m[1].split(",")]
    return None if any(v is None for v in vals) else frozenset(vals)  # type: ignore[arg-type]


def closed_compare(g: str, p: str, number: Callable[[str], Fraction | None]) -> bool | None:
    """A certain verdict for normalised gold `g` and prediction `p`, or None."""
    gs, ps = number_set(g, number), number_set(p, number)
    if gs is not None and ps is not None:
        return gs == ps
    if gs is not None or ps is not None or "," in g or "," in p:
        return None
    a, b = closed_value(g), closed_value(p)
    if a is None or b is None:
        return None
    diff, scale = abs(a - b), max(abs(a), abs(b))
    if diff <= EQUAL_REL * scale:
        return True
    if diff > DIFFERENT_REL * scale and diff > DIFFERENT_ABS:
        return False
    return None
