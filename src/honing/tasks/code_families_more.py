"""Nine more `code:functions` templates (65 structures), added so that held-out has enough distinct
structures to measure a lift on: element-wise maps and string rewrites (tier 1); number theory,
neighbours, positions and two lists (tier 2); grids, number bases and sliding windows (tier 3).
Same conventions as honing.tasks.code_families: each structure's `body` is the reference source and
its `ref` the same function written independently (a test checks that the two agree)."""

from __future__ import annotations

import math
import random
import re
import string
from honing.tasks.code_families import Template, Variant, _v
from honing.tasks.code_values import _ints, _mixed, _prose


def _elementwise() -> tuple[Variant, ...]:
    f, g, sig = "elementwise", (lambda r, s: (_ints(r, s),)), ("nums: list[int]", "list[int]")
    rows = (  # spec, name, description, ref, body expression
        ("abs", "absolute_values", "the absolute value of each number of `nums`",
         lambda nums: [x if x >= 0 else -x for x in nums], "[abs(x) for x in nums]"),
        ("square", "squares", "the square of each number of `nums`", lambda nums: [x * x for x in nums],
         "[x ** 2 for x in nums]"),
        ("negate", "negated", "each number of `nums` with its sign flipped", lambda nums: [0 - x for x in nums],
         "[-x for x in nums]"),
        ("sign", "signs", "the sign of each number of `nums` (-1, 0 or 1)",
         lambda nums: [(x > 0) - (x < 0) for x in nums], "[1 if x > 0 else -1 if x < 0 else 0 for x in nums]"),
        ("clamp", "clamp_to_digit", "each number of `nums` clamped to the range 0..9 (below 0 becomes 0, above 9 "
         "becomes 9)", lambda nums: [min(9, max(0, x)) for x in nums], "[0 if x < 0 else 9 if x > 9 else x for x in nums]"),
        ("halve", "halve_down", "each number of `nums` divided by 2 and rounded down (towards minus infinity)",
         lambda nums: [math.floor(x / 2) for x in nums], "[x // 2 for x in nums]"),
        ("last_digit", "last_digits", "the last decimal digit of the absolute value of each number of `nums`",
         lambda nums: [int(str(abs(x))[-1]) for x in nums], "[abs(x) % 10 for x in nums]"),
        ("plus_index", "add_positions", "nums[i] + i for each position i of `nums`",
         lambda nums: [x + i for i, x in enumerate(nums)], "[nums[i] + i for i in range(len(nums))]"),
    )
    return tuple(_v(f, spec, name, *sig, f"Return the list of {what}, in order.", ref, f"    return {expr}\n", g)
                 for spec, name, what, ref, expr in rows)


def _rewrite_string() -> tuple[Variant, ...]:
    f, g = "rewrite_string", (lambda r, s: (r.choice([_mixed(r, s), _prose(r, s)]),))
    rows = (
        ("swapcase", "swap_case", "every uppercase letter turned lowercase and every lowercase letter uppercase",
         lambda s: "".join(c.lower() if c.isupper() else c.upper() for c in s), "s.swapcase()"),
        ("alternate", "alternate_case", "the characters at even positions (0, 2, ...) in uppercase and those at "
         "odd positions in lowercase", lambda s: "".join((c.lower(), c.upper())[i % 2 == 0] for i, c in enumerate(s)),
         '"".join(c.upper() if i % 2 == 0 else c.lower() for i, c in enumerate(s))'),
        ("underscores", "spaces_to_underscores", "every space replaced by an underscore",
         lambda s: "".join("_" if c == " " else c for c in s), 's.replace(" ", "_")'),
        ("letters_only", "only_letters", "every character that is not a letter removed",
         lambda s: "".join(c for c in s if c in string.ascii_letters), '"".join(c for c in s if c.isalpha())'),
        ("double", "double_chars", 'every character repeated twice in a row ("ab" becomes "aabb")',
         lambda s: "".join(c * 2 for c in s), '"".join(c + c for c in s)'),
        ("mirror", "mirror_string", "its reverse appended to it", lambda s: s + "".join(reversed(s)), "s + s[::-1]"),
        ("no_punct", "strip_punctuation", "every punctuation mark (any of , . ! ?) removed",
         lambda s: s.translate(str.maketrans("", "", ",.!?")), '"".join(c for c in s if c not in ",.!?")'),
        ("squeeze", "squeeze_spaces", "every run of consecutive spaces replaced by a single space",
         lambda s: re.sub(" +", " ", s), '    while "  " in s:\n        s = s.replace("  ", " ")\n    return s\n'),
    )
    return tuple(_v(f, spec, name, "s: str", "str", f"Return `s` with {what}.", ref,
                    expr if expr.startswith("    ") else f"    return {expr}\n", g)
                 for spec, name, what, ref, expr in rows)


def _divisors(n: int) -> list[int]:
    return sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)})


def _number_theory() -> tuple[Variant, ...]:
    f = "number_theory"
    small, pos = (lambda r, s: (r.randint(0, 3 * s),)), (lambda r, s: (r.randint(1, 12 * s),))
    pair = lambda r, s: (r.randint(1, 12 * s), r.randint(1, 12 * s))  # noqa: E731
    return (
        _v(f, "sum_to", "sum_up_to", "n: int", "int", "Return 1 + 2 + ... + n for n >= 0 (0 when n is 0).",
           lambda n: n * (n + 1) // 2, "    return sum(range(n + 1))\n", small),
        _v(f, "squares_to", "sum_of_squares_up_to", "n: int", "int",
           "Return 1*1 + 2*2 + ... + n*n for n >= 0 (0 when n is 0).", lambda n: n * (n + 1) * (2 * n + 1) // 6,
           "    return sum(i * i for i in range(1, n + 1))\n", small),
        _v(f, "factorial", "factorial", "n: int", "int", "Return n! (1 * 2 * ... * n) for n >= 0; 0! is 1.",
           math.factorial, "    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n", small),
        _v(f, "num_divisors", "count_divisors", "n: int", "int",
           "Return how many positive integers divide the positive integer n exactly (1 and n included).",
           lambda n: len(_divisors(n)), "    return sum(1 for d in range(1, n + 1) if n % d == 0)\n", pos),
        _v(f, "proper_sum", "sum_proper_divisors", "n: int", "int",
           "Return the sum of the positive divisors of the positive integer n that are smaller than n (0 for 1).",
           lambda n: sum(_divisors(n)) - n, "    return sum(d for d in range(1, n) if n % d == 0)\n", pos),
        _v(f, "is_prime", "is_prime", "n: int", "bool",
           "Return True if n is a prime number, else False (n may be 0, 1 or negative).",
           lambda n: n > 1 and _divisors(n) == [1, n],
           "    if n < 2:\n        return False\n    d = 2\n    while d * d <= n:\n        if n % d == 0:\n"
           "            return False\n        d += 1\n    return True\n", lambda r, s: (r.randint(-3, 12 * s),)),
        _v(f, "gcd", "gcd", "a: int, b: int", "int", "Return the greatest common divisor of the positive integers a "
           "and b.", lambda a, b: max(set(_divisors(a)) & set(_divisors(b))),
           "    while b:\n        a, b = b, a % b\n    return a\n", pair),
        _v(f, "lcm", "lcm", "a: int, b: int", "int", "Return the least common multiple of the positive integers a "
           "and b.", lambda a, b: a * b // math.gcd(a, b),
           "    m = max(a, b)\n    while m % a or m % b:\n        m += max(a, b)\n    return m\n", pair),
    )


def _neighbours() -> tuple[Variant, ...]:
    f, g = "neighbours", (lambda r, s: (_ints(r, s),))
    few = "([] for fewer than two elements)"
    return (
        _v(f, "diffs", "differences", "nums: list[int]", "list[int]",
           f"Return the list of nums[i + 1] - nums[i] for each pair of neighbouring elements, in order {few}.",
           lambda nums: [b - a for a, b in zip(nums, nums[1:])],
           "    return [nums[i + 1] - nums[i] for i in range(len(nums) - 1)]\n", g),
        _v(f, "pair_sums", "neighbour_sums", "nums: list[int]", "list[int]",
           f"Return the list of nums[i] + nums[i + 1] for each pair of neighbouring elements, in order {few}.",
           lambda nums: [a + b for a, b in zip(nums, nums[1:])],
           "    return [nums[i] + nums[i + 1] for i in range(len(nums) - 1)]\n", g),
        _v(f, "increases", "count_increases", "nums: list[int]", "int",
           "Return how many elements of `nums` are strictly larger than the element just before them.",
           lambda nums: len([1 for a, b in zip(nums, nums[1:]) if b > a]),
           "    return sum(1 for i in range(1, len(nums)) if nums[i] > nums[i - 1])\n", g),
        _v(f, "sign_changes", "count_sign_changes", "nums: list[int]", "int",
           "Return how many pairs of neighbouring elements of `nums` have one strictly positive and the other "
           "strictly negative.", lambda nums: len([1 for a, b in zip(nums, nums[1:]) if a * b < 0]),
           "    return sum(1 for a, b in zip(nums, nums[1:]) if (a > 0 and b < 0) or (a < 0 and b > 0))\n", g),
        _v(f, "largest_step", "largest_step", "nums: list[int]", "int",
           "Return the largest absolute difference between two neighbouring elements of `nums`, or 0 for fewer "
           "than two elements.", lambda nums: max([abs(b - a) for a, b in zip(nums, nums[1:])] or [0]),
           "    return max((abs(nums[i + 1] - nums[i]) for i in range(len(nums) - 1)), default=0)\n", g),
        _v(f, "peaks", "count_peaks", "nums: list[int]", "int",
           "Return how many elements of `nums` are strictly larger than both of their neighbours (the first and "
           "the last element are never counted).",
           lambda nums: len([1 for a, b, c in zip(nums, nums[1:], nums[2:]) if b > a and b > c]),
           "    return sum(1 for i in range(1, len(nums) - 1) if nums[i - 1] < nums[i] > nums[i + 1])\n", g),
        _v(f, "sorted", "is_non_decreasing", "nums: list[int]", "bool",
           "Return True if every element of `nums` is at least the element before it, else False (True for fewer "
           "than two elements).", lambda nums: nums == sorted(nums),
           "    return all(nums[i - 1] <= nums[i] for i in range(1, len(nums)))\n",
           lambda r, s: (r.choice([_ints(r, s, -5, 5), sorted(_ints(r, s, -5, 5))]),)),
    )


def _positions() -> tuple[Variant, ...]:
    f, g = "positions", (lambda r, s: (_ints(r, s, -5, 5),))
    out = []
    for side, word, pick in (("max", "largest", max), ("min", "smallest", min)):
        out.append(_v(f, f"first|{side}", f"index_of_{side}", "nums: list[int]", "int",
                      f"Return the index at which the {word} value of `nums` first occurs, or -1 if `nums` is empty.",
                      lambda nums, pick=pick: nums.index(pick(nums)) if nums else -1,
                      f"    if not nums:\n        return -1\n    best = 0\n    for i, x in enumerate(nums):\n"
                      f"        if x {'>' if side == 'max' else '<'} nums[best]:\n            best = i\n"
                      "    return best\n", g))
        out.append(_v(f, f"last|{side}", f"last_index_of_{side}", "nums: list[int]", "int",
                      f"Return the index at which the {word} value of `nums` occurs for the last time, or -1 if "
                      "`nums` is empty.",
                      lambda nums, pick=pick: len(nums) - 1 - nums[::-1].index(pick(nums)) if nums else -1,
                      f"    if not nums:\n        return -1\n    m = {side}(nums)\n"
                      "    return max(i for i, x in enumerate(nums) if x == m)\n", g))
    out.append(_v(f, "first|negative", "first_negative_index", "nums: list[int]", "int",
                  "Return the index of the first negative number in `nums`, or -1 if there is none.",
                  lambda nums: next((i for i, x in enumerate(nums) if x < 0), -1),
                  "    for i, x in enumerate(nums):\n        if x < 0:\n            return i\n    return -1\n", g))
    out.append(_v(f, "last|even", "last_even_index", "nums: list[int]", "int",
                  "Return the index of the last even number in `nums`, or -1 if there is none.",
                  lambda nums: max([i for i, x in enumerate(nums) if x % 2 == 0] or [-1]),
                  "    for i in range(len(nums) - 1, -1, -1):\n        if nums[i] % 2 == 0:\n            return i\n"
                  "    return -1\n", lambda r, s: (_ints(r, s, -9, 9),)))
    out.append(_v(f, "fixed", "count_fixed_points", "nums: list[int]", "int",
                  "Return how many positions i of `nums` hold the value i (nums[i] == i).",
                  lambda nums: len([1 for i, x in enumerate(nums) if x == i]),
                  "    return sum(1 for i in range(len(nums)) if nums[i] == i)\n", lambda r, s: (_ints(r, s, 0, 6),)))
    return tuple(out)


def _two_lists() -> tuple[Variant, ...]:
    f, sig = "two_lists", "a: list[int], b: list[int]"
    g = lambda r, s: (_ints(r, s, -5, 5), _ints(r, s, -5, 5))  # noqa: E731
    both = "every position both lists have"
    return (
        _v(f, "add", "add_lists", sig, "list[int]",
           f"Return the list of a[i] + b[i] for {both} (as long as the shorter list).",
           lambda a, b: list(map(sum, zip(a, b))), "    return [a[i] + b[i] for i in range(min(len(a), len(b)))]\n", g),
        _v(f, "interleave", "interleave", sig, "list[int]",
           "Return a list taking elements alternately from `a` and `b` (a[0], b[0], a[1], b[1], ...); once one "
           "list runs out, the rest of the other follows in order.",
           lambda a, b: [x for p in zip(a, b) for x in p] + a[len(b):] + b[len(a):],
           "    out = []\n    for i in range(max(len(a), len(b))):\n        if i < len(a):\n            out.append(a[i])\n"
           "        if i < len(b):\n            out.append(b[i])\n    return out\n", g),
        _v(f, "common", "common_values", sig, "list[int]",
           "Return the values of `a` that also occur in `b`, each listed once, in order of first occurrence in `a`.",
           lambda a, b: list(dict.fromkeys(x for x in a if x in set(b))),
           "    out = []\n    for x in a:\n        if x in b and x not in out:\n            out.append(x)\n    return out\n", g),
        _v(f, "minus", "values_not_in", sig, "list[int]",
           "Return the elements of `a` whose value does not occur in `b`, in order (repeats kept).",
           lambda a, b: [x for x in a if x not in set(b)], "    return [x for x in a if x not in b]\n", g),
        _v(f, "dot", "dot_product", sig, "int", f"Return the sum of a[i] * b[i] over {both}.",
           lambda a, b: sum(x * y for x, y in zip(a, b)),
           "    return sum(a[i] * b[i] for i in range(min(len(a), len(b))))\n", g),
        _v(f, "matches", "count_matches", sig, "int", f"Return how many of {both} hold equal values (a[i] == b[i]).",
           lambda a, b: len([1 for x, y in zip(a, b) if x == y]),
           "    return sum(1 for x, y in zip(a, b) if x == y)\n", lambda r, s: (_ints(r, s, 0, 2), _ints(r, s, 0, 2))),
        _v(f, "merge", "merge_sorted", sig, "list[int]",
           "`a` and `b` are each sorted from smallest to largest; return all their elements in one list sorted "
           "from smallest to largest (repeats kept).", lambda a, b: sorted(a + b),
           "    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
           "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
           "            j += 1\n    return out + a[i:] + b[j:]\n",
           lambda r, s: (sorted(_ints(r, s, -5, 5)), sorted(_ints(r, s, -5, 5)))),
    )


def _grid_of(rng: random.Random, size: int) -> list[list[int]]:
    rows, cols = rng.randint(1, max(1, size // 2)), rng.randint(1, max(1, size // 2))
    return [[rng.randint(-9, 9) for _ in range(cols)] for _ in range(rows)]


def _border(grid: list[list[int]]) -> int:
    r, c = len(grid), len(grid[0])
    return sum(v for i, row in enumerate(grid) for j, v in enumerate(row) if i in (0, r - 1) or j in (0, c - 1))


def _grid() -> tuple[Variant, ...]:
    f, g, sig = "grid", (lambda r, s: (_grid_of(r, s),)), "grid: list[list[int]]"
    rect = "the rectangular `grid` (a non-empty list of non-empty rows, all of one length)"
    return (
        _v(f, "transpose", "transpose", sig, "list[list[int]]",
           f"Return the transpose of {rect}: row i of the result is column i of `grid`.",
           lambda grid: [list(c) for c in zip(*grid)],
           "    return [[row[j] for row in grid] for j in range(len(grid[0]))]\n", g),
        _v(f, "row_sums", "row_sums", sig, "list[int]", f"Return the list of the sums of the rows of {rect}.",
           lambda grid: list(map(sum, grid)), "    return [sum(row) for row in grid]\n", g),
        _v(f, "col_sums", "column_sums", sig, "list[int]", f"Return the list of the sums of the columns of {rect}.",
           lambda grid: list(map(sum, zip(*grid))),
           "    return [sum(row[j] for row in grid) for j in range(len(grid[0]))]\n", g),
        _v(f, "flatten", "flatten_grid", sig, "list[int]", f"Return the rows of {rect} concatenated into one list.",
           lambda grid: sum(grid, []), "    return [x for row in grid for x in row]\n", g),
        _v(f, "row_max", "row_maxima", sig, "list[int]", f"Return the list of the largest value of each row of {rect}.",
           lambda grid: [sorted(row)[-1] for row in grid], "    return [max(row) for row in grid]\n", g),
        _v(f, "rotate", "rotate_grid", sig, "list[list[int]]", f"Return {rect} rotated 90 degrees clockwise.",
           lambda grid: [list(c) for c in zip(*grid[::-1])],
           "    return [[grid[len(grid) - 1 - i][j] for i in range(len(grid))] for j in range(len(grid[0]))]\n", g),
        _v(f, "border", "border_sum", sig, "int",
           f"Return the sum of the values on the outer border of {rect}: its first and last rows and columns, "
           "each cell counted once.", _border,
           "    inner = sum(sum(row[1:-1]) for row in grid[1:-1])\n    return sum(map(sum, grid)) - inner\n", g),
    )


def _digits_in(n: int, base: int) -> str:
    return "0" if n == 0 else _digits_in(n // base, base).lstrip("0") + "0123456789"[n % base]


def _bases() -> tuple[Variant, ...]:
    f, nat = "bases", (lambda r, s: (r.randint(0, 4 ** s),))
    loop = ('    if n == 0:\n        return "0"\n    out = ""\n    while n:\n        out = str(n % {b}) + out\n'
            "        n //= {b}\n    return out\n")
    nn = "the non-negative integer n"
    return (
        _v(f, "to|2", "to_binary", "n: int", "str", f"Return the binary representation of {nn} as a string of 0s "
           "and 1s without prefix ('0' for 0).", lambda n: _digits_in(n, 2), loop.format(b=2), nat),
        _v(f, "to|3", "to_base3", "n: int", "str", f"Return the base-3 representation of {nn} as a string of the "
           "digits 0, 1 and 2 ('0' for 0).", lambda n: _digits_in(n, 3), loop.format(b=3), nat),
        _v(f, "to|8", "to_octal", "n: int", "str", f"Return the base-8 representation of {nn} as a string without "
           "prefix ('0' for 0).", lambda n: _digits_in(n, 8), '    return format(n, "o")\n', nat),
        _v(f, "ones", "count_one_bits", "n: int", "int", f"Return how many 1s the binary representation of {nn} has.",
           lambda n: _digits_in(n, 2).count("1"),
           "    count = 0\n    while n:\n        count += n & 1\n        n >>= 1\n    return count\n", nat),
        _v(f, "from|2", "from_binary", "s: str", "int",
           "Return the integer whose binary representation is `s`, a non-empty string of 0s and 1s (leading zeros "
           "allowed).", lambda s: sum(2 ** i for i, c in enumerate(reversed(s)) if c == "1"),
           "    out = 0\n    for c in s:\n        out = 2 * out + int(c)\n    return out\n",
           lambda r, s: ("".join(r.choice("01") for _ in range(r.randint(1, 2 * s))),)),
        _v(f, "pow2", "is_power_of_two", "n: int", "bool",
           "Return True if n is a power of two (1, 2, 4, 8, ...), else False (n may be 0 or negative).",
           lambda n: n > 0 and _digits_in(n, 2).count("1") == 1,
           "    if n < 1:\n        return False\n    while n % 2 == 0:\n        n //= 2\n    return n == 1\n",
           lambda r, s: (r.choice([2 ** r.randint(0, 2 * s), r.randint(-4, 4 ** s)]),)),
        _v(f, "trailing", "trailing_zero_bits", "n: int", "int",
           "Return how many 0s end the binary representation of the positive integer n.",
           lambda n: len(_digits_in(n, 2)) - len(_digits_in(n, 2).rstrip("0")),
           "    count = 0\n    while n % 2 == 0:\n        count += 1\n        n //= 2\n    return count\n",
           lambda r, s: (r.randint(1, 4 ** s) * r.choice([1, 2, 4, 8]),)),
    )


def _windows(nums: list[int], k: int) -> list[list[int]]:
    return [nums[i:i + k] for i in range(len(nums) - k + 1)]


def _windows_family() -> tuple[Variant, ...]:
    f, sig = "windows", "nums: list[int], k: int"
    g = lambda r, s: (_ints(r, s), r.randint(1, s + 1))  # noqa: E731
    win = "every window of k consecutive elements of `nums` (k >= 1)"
    none = "[] if `nums` has fewer than k elements"
    return (
        _v(f, "max_sum", "max_window_sum", sig, "int | None",
           f"Return the largest sum over {win}, or None if `nums` has fewer than k elements.",
           lambda nums, k: max(map(sum, _windows(nums, k)), default=None),
           "    if len(nums) < k:\n        return None\n    return max(sum(nums[i:i + k]) for i in range(len(nums) - k + 1))\n",
           g),
        _v(f, "min_sum", "min_window_sum", sig, "int | None",
           f"Return the smallest sum over {win}, or None if `nums` has fewer than k elements.",
           lambda nums, k: min(map(sum, _windows(nums, k)), default=None),
           "    if len(nums) < k:\n        return None\n    return min(sum(nums[i:i + k]) for i in range(len(nums) - k + 1))\n",
           g),
        _v(f, "averages", "moving_averages", sig, "list[float]",
           f"Return the list of the averages (floats) of {win}, in order ({none}).",
           lambda nums, k: [sum(w) / k for w in _windows(nums, k)],
           "    return [sum(nums[i:i + k]) / k for i in range(len(nums) - k + 1)]\n", g),
        _v(f, "maxima", "window_maxima", sig, "list[int]", f"Return the list of the largest value of {win}, in order "
           f"({none}).", lambda nums, k: [sorted(w)[-1] for w in _windows(nums, k)],
           "    return [max(nums[i:i + k]) for i in range(len(nums) - k + 1)]\n", g),
        _v(f, "positive", "count_positive_windows", sig, "int",
           f"Return how many of {win} have a sum greater than 0.",
           lambda nums, k: len([w for w in _windows(nums, k) if sum(w) > 0]),
           "    return sum(1 for i in range(len(nums) - k + 1) if sum(nums[i:i + k]) > 0)\n", g),
        _v(f, "every_kth", "every_kth", sig, "list[int]",
           "Return every k-th element of `nums` (k >= 1) starting with the first: nums[0], nums[k], nums[2k], ...",
           lambda nums, k: [x for i, x in enumerate(nums) if i % k == 0], "    return nums[::k]\n", g),
    )


MORE_TEMPLATES: tuple[Template, ...] = (
    Template("elementwise", 1, _elementwise()),
    Template("rewrite_string", 1, _rewrite_string()),
    Template("number_theory", 2, _number_theory()),
    Template("neighbours", 2, _neighbours()),
    Template("positions", 2, _positions()),
    Template("two_lists", 2, _two_lists()),
    Template("grid", 3, _grid()),
    Template("bases", 3, _bases()),
    Template("windows", 3, _windows_family()),
)
