"""The `math` verifier: final-answer equivalence for maths problems.

Grading order, cheapest first:

1. extraction: with the `auto` extractor (the default) honing.verify.math_extract reads the
   completion (boxed, answer tags, answer phrases, LaTeX spans, plain expressions, in that
   order); a named extractor (`verify.extractor`, or the task's `extractor` param) is used
   alone. The reference is read the same way when it carries markup. Exactly one final answer:
   several different boxed answers, or a hedge such as "3 or 4", "either 3 or 4", "3 and/or 4",
   "x = 3 or x = 4", "$a$ or $b$" get no credit (unless the reference itself contains "or").
2. exact string match after normalisation (`$`, `\\!`, spaces, trailing period, `\\text{}`,
   `\\left`/`\\right`, `\\dfrac`/`\\tfrac`, degree signs, thousands commas).
3. numeric comparison with relative tolerance (param `rel_tol`, default 1e-6) when both sides are
   plain numbers: integers, decimals, `a/b`, `\\frac{a}{b}`, scientific notation (`1e3`,
   `1.2\\times10^{3}`), percentages. A trailing unit word (`5 cm`, `5\\text{ cm}`) and a single
   variable assignment (`x = 3`, when the reference has no `=`) are dropped first. Percentages
   follow math-verify: "50%" matches both 50 and 0.5 (either side may carry the `%`), but a bare
   "50" does not match "0.5".
   Closed forms made only of numbers (`2\\sqrt{2}`, `\\pi/4`) and sets of plain numbers are
   compared by honing.verify.math_closed where the verdict is certain.
4. only then math-verify (`parse` + `verify`) for symbolic equivalence (LaTeX expressions, sets,
   intervals, equations), run in a small persistent pool of worker processes (fresh interpreters)
   with a per-call timeout (param `timeout_s`, default 5). math-verify's own signal-based timeouts
   are disabled there (they only work on the main thread and do not stop every hang); on timeout
   or a worker crash the worker is killed and replaced and the verdict is `Verdict.infra(...)`.
   Successful slow-path results are kept in a bounded LRU cache keyed by (gold, prediction).

The score is layered like the built-ins: (1 - format_weight) * correct + format_weight * format.
"""

from __future__ import annotations

import atexit
import importlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from fractions import Fraction
from multiprocessing.connection import Connection
from typing import Any, Callable

from honing.rollout.types import Trajectory
from honing.verify.builtin import layered
from honing.verify.extract import EXTRACTORS
from honing.verify.math_closed import closed_compare
from honing.verify.math_extract import Extracted, extract_math, reference_answer
from honing.verify.registry import register_verifier
from honing.verify.types import Verdict, VerifyContext

DEFAULT_REL_TOL = 1e-6
DEFAULT_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 120.0  # a fresh worker imports sympy/math-verify; not counted in timeout_s

# ----------------------------------------------------------------------------- extraction


def extract_answer(text: str, extractor: str = "auto") -> tuple[str | None, bool]:
    """The final answer and format flag: `auto` is the maths reading (math_extract.extract_math:
    boxed, tags, anchored phrases, LaTeX spans, plain expressions); any other extractor is used
    alone, exactly as the recipe asks."""
    ex = extract(text, extractor)
    return ex.answer, ex.format_ok


def extract(text: str, extractor: str = "auto") -> Extracted:
    if extractor == "auto":
        return extract_math(text)
    ans, ok = EXTRACTORS[extractor](text)
    return Extracted(ans, ok, extractor, _as_mv_text(ans) if ans is not None else "")


def _as_mv_text(ans: str) -> str:
    return ans if ("\\boxed" in ans or "$" in ans) else f"\\boxed{{{ans}}}"


_HEDGE = re.compile(r"(?:\bor\b|\beither\b|and\s*/\s*or|\\lor\b|\\vee\b)", re.I)


def is_hedged(pred: str, gold: str) -> bool:
    """True when the prediction offers alternatives the reference does not."""
    p = _unwrap_text(pred)
    return bool(_HEDGE.search(p)) and not _HEDGE.search(_unwrap_text(gold))


# ----------------------------------------------------------------------------- normalisation

_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACES = re.compile(r"\\[!,;: ]|\\quad|\\qquad|~|\s+")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _unwrap_text(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, _TEXT.sub(r" \1 ", s)
    return s


def normalize(s: str) -> str:
    """A canonical string for exact comparison (whitespace-free)."""
    s = _unwrap_text(str(s).strip())
    s = s.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "").replace("\\displaystyle", "")
    s = s.replace("\\%", "%").replace("$", "").replace("{,}", ",").replace("\\cfrac", "\\frac")
    listed = bool(re.search(r",\s", s))  # "32, 349" is a list of two numbers, "32,349" one number
    s = _SPACES.sub("", s)
    s = s.rstrip(".")
    if not listed and _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_RE_DEC = re.compile(rf"^{_NUM}$")
_RE_SLASH = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_RE_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_RE_FRAC_SHORT = re.compile(r"^([+-]?)\\frac(\d)(\d)$")
_RE_E = re.compile(rf"^({_NUM})[eE]([+-]?\d+)$")
_RE_TIMES = re.compile(rf"^({_NUM})(?:\\times|\\cdot|\*|x)10\^\{{?([+-]?\d+)\}}?$")
_RE_POW10 = re.compile(r"^10\^\{?([+-]?\d+)\}?$")
_RE_ASSIGN = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=(.+)$")
# a unit after a number, written as \text{..}/\mathrm{..} or as a word separated by a space (raw text)
_RAW_UNIT = re.compile(r"^\s*\$?(.*?\d)\s*(?:\\(?:text|mathrm|mbox)\{\s*[a-zA-Z][a-zA-Z .]*\}"
                       r"|\s(?:[a-zA-Z]{2,12}|[mgsLhKNJWVA]))"
                       r"(?:\^\{?\d\}?)?(?:/[a-zA-Z]{1,8})?\s*\$?\s*\.?\s*$")
_MAX_EXP = 400


def _number(s: str) -> Fraction | None:
    """An exact value for a plain number (already normalised, no '%'), else None."""
    try:
        if _RE_DEC.match(s):
            return Fraction(s)
        if m := _RE_SLASH.match(s):
            return Fraction(int(m[1]), int(m[2])) if int(m[2]) else None
        if m := (_RE_FRAC.match(s) or _RE_FRAC_SHORT.match(s)):
            den = int(m[3])
            return (-1 if m[1] == "-" else 1) * Fraction(int(m[2]), den) if den else None
        if m := (_RE_E.match(s) or _RE_TIMES.match(s)):
            e = int(m[2])
            return Fraction(m[1]) * Fraction(10) ** e if abs(e) <= _MAX_EXP else None
        if m := _RE_POW10.match(s):
            e = int(m[1])
            return Fraction(10) ** e if abs(e) <= _MAX_EXP else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def numeric_values(norm: str, allow_assign: bool = True) -> list[Fraction] | None:
    """Candidate values of a normalised answer ('50%' -> [50, 1/2]), or None if not a plain number."""
    s = norm
    if allow_assign and (m := _RE_ASSIGN.match(s)):
        s = m[1]
    pct = s.endswith("%")
    if pct:
        s = s[:-1]
    v = _number(s)
    if v is None:
        return None
    return [v, v / 100] if pct else [v]


def _close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    if a == b:
        return True
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))  # exact: no float overflow


def fast_compare(gold: str, pred: str, rel_tol: float = DEFAULT_REL_TOL) -> bool | None:
    """True/False when decidable without symbolic maths, None to defer to math-verify."""
    g, p = normalize(gold), normalize(pred)
    if not p:
        return False
    if g == p or (g.isalpha() and g.lower() == p.lower()):
        return True
    gv = numeric_values(g, allow_assign=False)
    pv = numeric_values(p, allow_assign="=" not in g)
    if gv is not None and pv is None and (m := _RAW_UNIT.match(pred)):
        pv = numeric_values(normalize(m[1]), allow_assign="=" not in g)
    if gv is not None and pv is not None:
        return any(_close(a, b, rel_tol) for a in gv for b in pv)
    if "%" in g or "%" in p or "=" in g or "=" in p:
        return None
    return closed_compare(g, p, _number)


# ----------------------------------------------------------------------------- worker pool


def _resolve(target: str) -> Callable[..., Any]:
    mod, _, name = target.partition(":")
    return getattr(importlib.import_module(mod), name)


def _worker_main(rfd: int, wfd: int) -> None:
    """Worker loop (a fresh interpreter): receives (target 'module:function', args) on `rfd`,
    sends ('ok', result) or ('error', message) on `wfd`. Exits when the parent closes the pipe."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    inp, out = Connection(rfd, writable=False), Connection(wfd, readable=False)
    try:
        import math_verify  # noqa: F401 - warm import before reporting ready
    except Exception:  # noqa: BLE001 - the call itself will report it
        pass
    out.send("ready")
    while True:
        try:
            target, args = inp.recv()
        except (EOFError, OSError):
            return
        try:
            out.send(("ok", _resolve(target)(*args)))
        except Exception as e:  # noqa: BLE001 - reported to the parent as infra
            out.send(("error", f"{type(e).__name__}: {e}"))


class WorkerTimeout(Exception):
    pass


class _Worker:
    """A plain subprocess (not multiprocessing, which would re-import the caller's __main__)
    talking over two pipes with multiprocessing's Connection framing."""

    def __init__(self) -> None:
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = f"from honing.verify.math import _worker_main; _worker_main({p2c_r}, {c2p_w})"
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(p2c_r, c2p_w), env=env,
                                         stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self.tx = Connection(p2c_w, readable=False)
        self.rx = Connection(c2p_r, writable=False)
        self.ready = False

    def call(self, target: str, args: tuple, timeout_s: float) -> Any:
        if not self.ready:
            if not self.rx.poll(STARTUP_TIMEOUT_S):
                raise WorkerTimeout(f"worker did not start within {STARTUP_TIMEOUT_S:.0f}s")
            self.rx.recv()
            self.ready = True
        self.tx.send((target, args))
        if not self.rx.poll(timeout_s):
            raise WorkerTimeout(f"timed out after {timeout_s:g}s")
        return self.rx.recv()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            self.tx.close()
            self.rx.close()


class WorkerPool:
    """A few persistent worker processes; at most `size` calls run at once. Thread-safe."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._slots = threading.BoundedSemaphore(size)
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._closed = False

    def call(self, target: str, args: tuple, timeout_s: float) -> tuple[bool, Any]:
        """(True, result) or (False, reason): timeouts and crashes kill and drop the worker."""
        with self._slots:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                try:
                    w = _Worker()
                except OSError as e:
                    return False, f"could not start a worker: {e}"
            try:
                status, value = w.call(target, args, timeout_s)
            except WorkerTimeout as e:
                w.kill()
                return False, str(e)
            except (EOFError, OSError) as e:
                w.kill()
                return False, f"worker died: {type(e).__name__}: {e}"
            if self._closed:
                w.kill()
            else:
                self._idle.put(w)
            return (status == "ok"), value

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool(int(os.environ.get("HONING_MATH_WORKERS", "2")))
            atexit.register(_POOL.close)
        return _POOL


# ----------------------------------------------------------------------------- slow path (in the worker)

_GOLD_CACHE: dict[str, Any] = {}


def _mv_parse(s: str) -> Any:
    """math-verify's own reading of an extracted piece (`$...$`, `\\boxed{...}` or plain text),
    with its LaTeX and expression targets and boxed answers first."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(s, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()], parsing_timeout=None)


def mv_equal(gold: str, pred: str) -> bool:
    """math-verify equivalence with its own timeouts off (runs in a worker process)."""
    from math_verify import verify

    g = _GOLD_CACHE.get(gold)
    if g is None:
        if len(_GOLD_CACHE) > 4096:
            _GOLD_CACHE.clear()
        g = _GOLD_CACHE[gold] = _mv_parse(gold)
    p = _mv_parse(pred)
    return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))


# Verdicts of the slow path by (target, args): GRPO groups and repeated tasks produce the same
# (gold, prediction) pairs over and over. Only successful calls are cached. 0 disables it.
SLOW_CACHE_SIZE = 65536
_SLOW_CACHE: "OrderedDict[tuple, bool]" = OrderedDict()
_SLOW_CACHE_LOCK = threading.Lock()


def _slow_path(gold: str, pred: str, timeout_s: float) -> tuple[bool, Any]:
    target, args = _slow_call(gold, pred)
    key = (target, args)
    with _SLOW_CACHE_LOCK:
        if key in _SLOW_CACHE:
            _SLOW_CACHE.move_to_end(key)
            return True, _SLOW_CACHE[key]
    good, value = pool().call(target, args, timeout_s)
    if good and SLOW_CACHE_SIZE > 0:
        with _SLOW_CACHE_LOCK:
            _SLOW_CACHE[key] = value
            while len(_SLOW_CACHE) > SLOW_CACHE_SIZE:
                _SLOW_CACHE.popitem(last=False)
    return good, value


def _slow_call(gold: str, pred: str) -> tuple[str, tuple]:
    """What the worker runs for the slow path (tests replace this to simulate hangs)."""
    return "honing.verify.math:mv_equal", (gold, pred)


# ----------------------------------------------------------------------------- the verifier


class MathVerifier:
    """Params: `rel_tol` (default 1e-6), `timeout_s` (default 5) for the math-verify slow path."""

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        params = task.verifier.params
        gold_raw = task.hidden.get("answer")
        if gold_raw is None:
            return Verdict.infra("math: task has no hidden['answer']", time.perf_counter() - t0)
        extractor = str(params.get("extractor", ctx.extractor))
        if extractor != "auto" and extractor not in EXTRACTORS:
            return Verdict.infra(f"math: unknown extractor {extractor!r}", time.perf_counter() - t0)
        gold = reference_answer(str(gold_raw))
        ex = extract(trajectory.completion_text, extractor)
        pred, format_ok = ex.answer, ex.format_ok
        if pred is None or not pred.strip():
            return layered(0.0, format_ok, ctx, "no single final answer", t0)
        if is_hedged(pred, gold.answer or ""):
            return layered(0.0, format_ok, ctx, f"hedged answer {pred!r}", t0)
        ok = fast_compare(gold.answer or "", pred, float(params.get("rel_tol", DEFAULT_REL_TOL)))
        if ok is not None:
            return layered(float(ok), format_ok, ctx, f"extracted={pred!r} ({ex.tier}, fast)", t0)
        timeout_s = float(params.get("timeout_s", DEFAULT_TIMEOUT_S))
        good, value = _slow_path(gold.mv_text, ex.mv_text, timeout_s)
        if not good:
            return Verdict.infra(f"math-verify failed on {pred!r}: {value}", time.perf_counter() - t0)
        return layered(float(bool(value)), format_ok, ctx, f"extracted={pred!r} ({ex.tier}, math-verify)", t0)


register_verifier("math", MathVerifier())
