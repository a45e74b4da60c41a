"""The program families of the procedural repair tasks (honing.tasks.repair).

A family is a small package: a core module and a dependent module that imports it, each a format
string over the family's random constants, a random-argument generator for every public function
(the tests' inputs; expected values come from running the reference on the host), and the bugs that
can be injected, each a (kind, module, old text, new text) substitution. Every family has at least one
bug of each single-bug kind (operator, off_by_one, branch, edge) and at least one bug in each module
(level 5 puts one in each). Boundary values (a threshold, an empty list) appear among the generated
arguments often enough that an off-by-one or a dropped edge case is exposed by some case.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

@dataclass(frozen=True)
class Bug:
    kind: str
    module: str  # "core" or "dep"
    old: str
    new: str


@dataclass(frozen=True)
class Family:
    name: str
    core: tuple[str, str]  # (file stem, source); sources are format strings over the constants
    dep: tuple[str, str]
    constants: Callable[[random.Random], dict[str, Any]]
    args: dict[str, Callable[[random.Random], tuple]]  # function -> random arguments
    bugs: tuple[Bug, ...]


def _ints(r: random.Random, n: int = 6, lo: int = -9, hi: int = 20) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(0, n))]


def _lines(r: random.Random) -> list[tuple[float, int]]:
    return [(round(r.uniform(0.5, 40), 2), r.randint(1, 6)) for _ in range(r.randint(0, 5))]


def _text(r: random.Random) -> str:
    words = ["alpha", "be", "cat", "delta", "echo", "fig", "golf", "hi", "io", "jupiter", "kilo", "lemon"]
    return " ".join(r.choice(words) for _ in range(r.randint(0, 6)))


SHOP_CORE = '''TAX_PERCENT = {tax}


def line_total(price, qty):
    return price * qty


def with_tax(amount):
    return round(amount + amount * TAX_PERCENT / 100, 2)


def discount(amount, threshold):
    if amount >= threshold:
        return round(amount * {factor}, 2)
    return amount


def average_price(prices):
    if not prices:
        return 0.0
    return sum(prices) / len(prices)
'''
SHOP_DEP = '''from .pricing import line_total, with_tax


def subtotal(lines):
    return round(sum(line_total(p, q) for p, q in lines), 2)


def invoice(lines):
    return with_tax(subtotal(lines))


def top_items(lines, n):
    ranked = sorted(lines, key=lambda line: line_total(*line), reverse=True)
    return ranked[:n]


def bulk_lines(lines, min_qty):
    return [line for line in lines if line[1] >= min_qty]
'''
TEXT_CORE = '''def words(s):
    return s.split()


def truncate(s, width):
    if len(s) <= width:
        return s
    return s[:width - 3] + "..."


def initials(name):
    return "".join(p[0].upper() for p in words(name))


def pad_left(s, width, fill="{fill}"):
    if len(s) >= width:
        return s
    return fill * (width - len(s)) + s
'''
TEXT_DEP = '''from .textutil import truncate, words


def word_count(s):
    return len(words(s))


def longest_word(s):
    ws = words(s)
    if not ws:
        return None
    return max(ws, key=len)


def headline(s, width):
    return truncate(s.strip(), width)


def count_long_words(s, min_len):
    return sum(1 for w in words(s) if len(w) >= min_len)
'''
NUM_CORE = '''def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def scale(x, factor):
    return x * factor + {offset}


def safe_ratio(a, b):
    if b == 0:
        return None
    return round(a / b, 6)


def inclusive_range(a, b):
    return list(range(a, b + 1))
'''
NUM_DEP = '''from .mathx import clamp, safe_ratio


def normalize(xs, lo, hi):
    return [clamp(x, lo, hi) for x in xs]


def growth(xs):
    return [safe_ratio(b - a, a) for a, b in zip(xs, xs[1:])]


def window_sums(xs, k):
    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]


def peak_index(xs):
    if not xs:
        return -1
    best = 0
    for i in range(1, len(xs)):
        if xs[i] > xs[best]:
            best = i
    return best
'''

FIRST_FAMILIES: tuple[Family, ...] = (
    Family("shop", ("pricing", SHOP_CORE), ("orders", SHOP_DEP),
           lambda r: {"tax": r.choice([5, 8, 10, 12, 15, 20, 25]), "factor": r.choice([0.8, 0.85, 0.9, 0.95])},
           {"line_total": lambda r: (round(r.uniform(0.5, 50), 2), r.randint(0, 9)),
            "with_tax": lambda r: (round(r.uniform(0, 200), 2),),
            "discount": lambda r: (float(r.randint(0, 100)), float(r.choice([20, 50, 80]))),
            "average_price": lambda r: ([round(r.uniform(1, 30), 2) for _ in range(r.randint(0, 4))],),
            "subtotal": lambda r: (_lines(r),), "invoice": lambda r: (_lines(r),),
            "top_items": lambda r: (_lines(r), r.randint(1, 3)),
            "bulk_lines": lambda r: (_lines(r), r.randint(1, 5))},
           (Bug("operator", "core", "return price * qty", "return price + qty"),
            Bug("operator", "core", "amount + amount * TAX_PERCENT", "amount - amount * TAX_PERCENT"),
            Bug("off_by_one", "dep", "return ranked[:n]", "return ranked[:n - 1]"),
            Bug("off_by_one", "dep", "line[1] >= min_qty", "line[1] > min_qty"),
            Bug("branch", "core", "if amount >= threshold:", "if amount < threshold:"),
            Bug("edge", "core", "    if not prices:\n        return 0.0\n", ""))),
    Family("text", ("textutil", TEXT_CORE), ("report", TEXT_DEP),
           lambda r: {"fill": r.choice(["*", ".", "0", "-"])},
           {"words": lambda r: (_text(r),), "truncate": lambda r: (_text(r), r.randint(4, 20)),
            "initials": lambda r: (_text(r),), "pad_left": lambda r: (_text(r)[:8], r.randint(0, 10)),
            "word_count": lambda r: (_text(r),), "longest_word": lambda r: (_text(r),),
            "headline": lambda r: ("  " + _text(r) + " ", r.randint(4, 20)),
            "count_long_words": lambda r: (_text(r), r.randint(2, 6))},
           (Bug("operator", "core", "s[:width - 3]", "s[:width + 3]"),
            Bug("operator", "core", "fill * (width - len(s))", "fill * (width + len(s))"),
            Bug("off_by_one", "dep", "len(w) >= min_len", "len(w) > min_len"),
            Bug("off_by_one", "core", "s[:width - 3]", "s[:width - 2]"),
            Bug("branch", "core", "if len(s) <= width:\n        return s", "if len(s) > width:\n        return s"),
            Bug("edge", "dep", "    if not ws:\n        return None\n", ""))),
    Family("num", ("mathx", NUM_CORE), ("series", NUM_DEP),
           lambda r: {"offset": r.randint(1, 9)},
           {"clamp": lambda r: (r.randint(-20, 20), r.randint(-10, 0), r.randint(1, 10)),
            "scale": lambda r: (r.randint(-10, 10), r.randint(-3, 5)),
            "safe_ratio": lambda r: (r.randint(-20, 20), r.choice([0, 0, r.randint(-5, 5)])),
            "inclusive_range": lambda r: (r.randint(-3, 3), r.randint(-3, 6)),
            "normalize": lambda r: (_ints(r), r.randint(-5, 0), r.randint(1, 10)),
            "growth": lambda r: (_ints(r, lo=0, hi=9),),
            "window_sums": lambda r: (_ints(r), r.randint(1, 3)), "peak_index": lambda r: (_ints(r),)},
           (Bug("operator", "core", "x * factor + ", "x * factor - "),
            Bug("off_by_one", "core", "range(a, b + 1)", "range(a, b)"),
            Bug("off_by_one", "dep", "range(len(xs) - k + 1)", "range(len(xs) - k)"),
            Bug("branch", "core", "if x < lo:\n        return lo", "if x < lo:\n        return hi"),
            Bug("edge", "core", "    if b == 0:\n        return None\n", ""),
            Bug("edge", "dep", "    if not xs:\n        return -1\n", ""))),
)

GRADE_CORE = '''PASS_MARK = {mark}


def percent(score, total):
    if total == 0:
        return 0.0
    return round(100 * score / total, 1)


def letter(pct):
    if pct >= 90:
        return "A"
    if pct >= 75:
        return "B"
    if pct >= PASS_MARK:
        return "C"
    return "F"


def curve(scores, bonus):
    return [min(s + bonus, 100) for s in scores]
'''
GRADE_DEP = '''from .grading import PASS_MARK, letter


def class_average(scores):
    if not scores:
        return 0.0
    return round(sum(scores) / len(scores), 2)


def pass_count(pcts):
    return sum(1 for p in pcts if p >= PASS_MARK)


def best_scores(scores, n):
    return sorted(scores, reverse=True)[:n]


def grade_sheet(pcts):
    return [letter(p) for p in pcts]
'''
STOCK_CORE = '''REORDER_LEVEL = {level}


def restock(qty, amount):
    return qty + amount


def take(qty, amount):
    if amount > qty:
        return qty
    return qty - amount


def needs_reorder(qty):
    return qty <= REORDER_LEVEL


def unit_cost(total, count):
    if count == 0:
        return None
    return round(total / count, 2)
'''
STOCK_DEP = '''from .stock import needs_reorder, take


def low_stock(items):
    return sorted(name for name, qty in items if needs_reorder(qty))


def ship_all(qty, orders):
    for amount in orders:
        qty = take(qty, amount)
    return qty


def total_units(items):
    return sum(qty for _, qty in items)


def largest(items):
    if not items:
        return None
    return max(items, key=lambda item: item[1])[0]
'''
CLOCK_CORE = '''OPEN_HOUR = {open_hour}


def to_minutes(h, m):
    return h * 60 + m


def duration(start, end):
    if end < start:
        end += 24 * 60
    return end - start


def is_open(t, close_hour):
    return OPEN_HOUR * 60 <= t < close_hour * 60


def fmt(t):
    h, m = divmod(t, 60)
    return "%02d:%02d" % (h, m)
'''
CLOCK_DEP = '''from .clock import duration, fmt


def total_time(slots):
    return sum(duration(a, b) for a, b in slots)


def longest_slot(slots):
    if not slots:
        return None
    return max(slots, key=lambda s: duration(*s))


def agenda(starts):
    return [fmt(t) for t in sorted(starts)]


def count_between(times, lo, hi):
    return sum(1 for t in times if lo <= t <= hi)
'''


def _pct(r: random.Random, mark: int = 50) -> float:
    """A percentage, often exactly on a grade boundary."""
    return float(r.choice([90, 75, mark, r.randint(0, 100), round(r.uniform(0, 100), 1)]))


def _minute(r: random.Random) -> int:
    return r.choice([r.randint(0, 24 * 60 - 1), 60 * r.randint(0, 23)])


def _slots(r: random.Random) -> list[tuple[int, int]]:
    return [(_minute(r), _minute(r)) for _ in range(r.randint(0, 4))]


def _stock(r: random.Random) -> list[tuple[str, int]]:
    names = r.sample(["bolt", "nut", "gear", "pipe", "valve", "screw", "hinge"], r.randint(0, 5))
    return [(n, r.randint(0, 15)) for n in names]


NEW_FAMILIES: tuple[Family, ...] = (
    Family("grades", ("grading", GRADE_CORE), ("roster", GRADE_DEP),
           lambda r: {"mark": r.choice([40, 50, 60])},
           {"percent": lambda r: (r.randint(0, 40), r.choice([0, r.randint(1, 40)])),
            "letter": lambda r: (_pct(r, r.choice([40, 50, 60])),),
            "curve": lambda r: ([r.randint(40, 100) for _ in range(r.randint(0, 4))], r.randint(0, 15)),
            "class_average": lambda r: ([r.randint(0, 100) for _ in range(r.randint(0, 5))],),
            "pass_count": lambda r: ([_pct(r, r.choice([40, 50, 60])) for _ in range(r.randint(0, 5))],),
            "best_scores": lambda r: ([r.randint(0, 100) for _ in range(r.randint(0, 5))], r.randint(1, 3)),
            "grade_sheet": lambda r: ([_pct(r, r.choice([40, 50, 60])) for _ in range(r.randint(0, 4))],)},
           (Bug("operator", "core", "min(s + bonus, 100)", "min(s - bonus, 100)"),
            Bug("operator", "dep", "sum(scores) / len(scores)", "sum(scores) * len(scores)"),
            Bug("off_by_one", "core", "if pct >= 90:", "if pct > 90:"),
            Bug("off_by_one", "dep", "if p >= PASS_MARK", "if p > PASS_MARK"),
            Bug("branch", "core", 'if pct >= 75:\n        return "B"', 'if pct >= 75:\n        return "A"'),
            Bug("edge", "core", "    if total == 0:\n        return 0.0\n", ""),
            Bug("edge", "dep", "    if not scores:\n        return 0.0\n", ""))),
    Family("stock", ("stock", STOCK_CORE), ("warehouse", STOCK_DEP),
           lambda r: {"level": r.choice([3, 5, 8, 10])},
           {"restock": lambda r: (r.randint(0, 20), r.randint(1, 10)),
            "take": lambda r: (r.randint(0, 10), r.randint(0, 12)),
            "needs_reorder": lambda r: (r.choice([3, 5, 8, 10, r.randint(0, 15)]),),
            "unit_cost": lambda r: (round(r.uniform(0, 100), 2), r.choice([0, r.randint(1, 9)])),
            "low_stock": lambda r: (_stock(r),),
            "ship_all": lambda r: (r.randint(0, 20), [r.randint(0, 8) for _ in range(r.randint(0, 4))]),
            "total_units": lambda r: (_stock(r),), "largest": lambda r: (_stock(r),)},
           (Bug("operator", "core", "return qty + amount", "return qty - amount"),
            Bug("operator", "core", "return qty - amount", "return qty + amount"),
            Bug("off_by_one", "core", "if amount > qty:", "if amount >= qty:"),
            Bug("off_by_one", "core", "qty <= REORDER_LEVEL", "qty < REORDER_LEVEL"),
            Bug("branch", "core", "if amount > qty:\n        return qty", "if amount > qty:\n        return 0"),
            Bug("edge", "core", "    if count == 0:\n        return None\n", ""),
            Bug("edge", "dep", "    if not items:\n        return None\n", ""))),
    Family("clock", ("clock", CLOCK_CORE), ("schedule", CLOCK_DEP),
           lambda r: {"open_hour": r.choice([6, 7, 8, 9])},
           {"to_minutes": lambda r: (r.randint(0, 23), r.randint(0, 59)),
            "duration": lambda r: (_minute(r), _minute(r)),
            "is_open": lambda r: (r.choice([_minute(r), 60 * r.choice([6, 7, 8, 9])]), r.randint(16, 22)),
            "fmt": lambda r: (_minute(r),),
            "total_time": lambda r: (_slots(r),), "longest_slot": lambda r: (_slots(r),),
            "agenda": lambda r: ([_minute(r) for _ in range(r.randint(0, 4))],),
            "count_between": lambda r: ([r.randint(0, 20) for _ in range(r.randint(0, 6))], r.randint(0, 8),
                                        r.randint(8, 16))},
           (Bug("operator", "core", "return h * 60 + m", "return h * 60 - m"),
            Bug("operator", "core", "return end - start", "return end + start"),
            Bug("off_by_one", "core", "OPEN_HOUR * 60 <= t", "OPEN_HOUR * 60 < t"),
            Bug("off_by_one", "dep", "lo <= t <= hi", "lo <= t < hi"),
            Bug("branch", "core", "if end < start:\n        end += 24 * 60", "if end > start:\n        end += 24 * 60"),
            Bug("edge", "dep", "    if not slots:\n        return None\n", ""))),
)
FAMILIES: tuple[Family, ...] = FIRST_FAMILIES + NEW_FAMILIES
"""Every family, in a fixed order (a task's family is drawn from the `families` the source was given)."""
