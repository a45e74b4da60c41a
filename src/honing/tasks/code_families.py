"""The first 16 `code:functions` templates (a tier 1..3 each), each a tuple of structures (`Variant`s)
with a reference implementation as source and as an independent function, plus the seeded argument
generators. honing.tasks.code splits the structures between train and held-out and builds the tasks.
"""

from __future__ import annotations

import hashlib
import math
import random
import string
from dataclasses import dataclass
from typing import Any, Callable


from honing.tasks.code_values import (  # noqa: F401
    _ints,
    _letters,
    _number,
    _multiples,
    _text,
    _mixed,
    _prose,
    _pal_letters,
    _exact_pal,
    _spaced_pal,
    _word_pal,
    _pairable,
    _brackets,
    _runs,
    _rle,
    _balanced,
    _max_depth,
    _min_additions,
    _longest,
    _longest_even,
    _fizz,
    _scan,
    _rotate,
    _median,
    _variance,
)

@dataclass(frozen=True)
class Variant:
    """One structure of a template: what makes two tasks the same problem. `key` names the
    template and the operation's parameters; the function name, signature and description follow
    from it. `body` is the reference implementation as source (the body under `signature`), `ref`
    the same function written independently (it computes the hidden expected values; a test checks
    that the two agree)."""

    key: str
    name: str
    params: str
    returns: str
    description: str
    ref: Callable[..., Any]
    body: str
    gen: Callable[[random.Random, int], tuple]

    @property
    def signature(self) -> str:
        return f"def {self.name}({self.params}) -> {self.returns}"

    @property
    def source(self) -> str:
        return f"{self.signature}:\n{self.body}"

    @property
    def structure(self) -> str:
        return structure_hash(self.key)


def structure_hash(key: str) -> str:
    return hashlib.sha256(f"code:functions/{key}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Template:
    """A family of structurally different problems of one tier (the unit of the `templates`
    parameter); its variants are split between train and held-out (`split_variants`)."""

    name: str
    tier: int
    variants: tuple[Variant, ...]


def _v(family: str, spec: str, name: str, params: str, returns: str, description: str, ref: Callable[..., Any],
       body: str, gen: Callable[[random.Random, int], tuple]) -> Variant:
    return Variant(f"{family}/{spec}", name, params, returns, description, ref, body, gen)


def _sum_evens() -> tuple[Variant, ...]:
    preds: list[tuple[str, str, str, str, Callable[[int], bool]]] = [  # spec, tag, what, test source, test
        ("even", "evens", "even", "x % 2 == 0", lambda x: x % 2 == 0),
        ("odd", "odds", "odd", "x % 2 != 0", lambda x: x % 2 == 1),
        ("pos", "positives", "positive", "x > 0", lambda x: x > 0),
        ("neg", "negatives", "negative", "x < 0", lambda x: x < 0),
    ]
    for k in (3, 4, 5, 6, 7):
        preds.append((f"mult{k}", f"multiples_of_{k}", f"multiples of {k} (negative multiples and 0 included)",
                      f"x % {k} == 0", lambda x, k=k: x % k == 0))
    out = []
    for spec, tag, noun, test, p in preds:
        k = int(spec[4:]) if spec.startswith("mult") else 0
        gen = (lambda r, s, k=k: (_multiples(r, s, k),)) if k else (lambda r, s: (_ints(r, s),))
        out.append(_v("sum_evens", f"sum|{spec}", f"sum_{tag}", "nums: list[int]", "int",
                      f"Return the sum of the numbers in `nums` that are {noun} (0 if there are none).",
                      lambda nums, p=p: sum(x for x in nums if p(x)),
                      f"    return sum(x for x in nums if {test})\n", gen))
        out.append(_v("sum_evens", f"count|{spec}", f"count_{tag}", "nums: list[int]", "int",
                      f"Return how many of the numbers in `nums` are {noun}.",
                      lambda nums, p=p: len([x for x in nums if p(x)]),
                      f"    return sum(1 for x in nums if {test})\n", gen))
    return tuple(out)


def _count_vowels() -> tuple[Variant, ...]:
    classes = [  # spec, name, phrase, test source, test
        ("vowels", "count_vowels", "vowels (a, e, i, o, u, either case)", 'c in "aeiouAEIOU"',
         lambda c: c.lower() in "aeiou"),
        ("consonants", "count_consonants", "consonants (letters other than a, e, i, o, u, either case)",
         'c.isalpha() and c.lower() not in "aeiou"', lambda c: c in string.ascii_letters and c not in "aeiouAEIOU"),
        ("upper", "count_uppercase", "uppercase letters", "c.isupper()", lambda c: "A" <= c <= "Z"),
        ("lower", "count_lowercase", "lowercase letters", "c.islower()", lambda c: "a" <= c <= "z"),
        ("letters", "count_letters", "letters", "c.isalpha()", lambda c: c in string.ascii_letters),
        ("spaces", "count_spaces", "spaces", 'c == " "', lambda c: c == " "),
        ("punct", "count_punctuation", "punctuation marks (any of , . ! ?)", 'c in ",.!?"', lambda c: c in ",.!?"),
    ]
    return tuple(_v("count_vowels", spec, name, "s: str", "int", f"Return how many characters of `s` are {phrase}.",
                    lambda s, p=p: len([c for c in s if p(c)]), f"    return sum(1 for c in s if {test})\n",
                    lambda r, s: (r.choice([_mixed(r, s), _prose(r, s)]),))
                 for spec, name, phrase, test, p in classes)


def _reverse_words() -> tuple[Variant, ...]:
    f, g, w = "reverse_words", (lambda r, s: (_text(r, s),)), "(words are separated by single spaces)"
    return (
        _v(f, "reverse_order", "reverse_words", "s: str", "str",
           "Return the words of `s` (separated by single spaces) in reverse order, joined by single spaces.",
           lambda s: " ".join(reversed(s.split(" "))) if s else "", '    return " ".join(s.split(" ")[::-1])\n', g),
        _v(f, "reverse_each", "reverse_each_word", "s: str", "str",
           f"Return `s` with the letters of each word {w} reversed, the words staying in their order.",
           lambda s: " ".join("".join(reversed(x)) for x in s.split(" ")),
           '    return " ".join(word[::-1] for word in s.split(" "))\n', g),
        _v(f, "capitalize", "capitalize_words", "s: str", "str",
           f"Return `s` with the first letter of every word {w} turned into uppercase.",
           lambda s: " ".join(x.capitalize() for x in s.split(" ")),
           '    return " ".join(word[:1].upper() + word[1:] for word in s.split(" "))\n', g),
        _v(f, "longest", "longest_word", "s: str", "str",
           f"Return the longest word of `s` {w}: the first one on ties, '' when `s` is empty.",
           lambda s: sorted(s.split(" "), key=lambda x: -len(x))[0],
           '    if not s:\n        return ""\n    return max(s.split(" "), key=len)\n', g),
        _v(f, "shortest", "shortest_word", "s: str", "str",
           f"Return the shortest word of `s` {w}: the first one on ties, '' when `s` is empty.",
           lambda s: sorted(s.split(" "), key=len)[0],
           '    if not s:\n        return ""\n    return min(s.split(" "), key=len)\n', g),
        _v(f, "lengths", "word_lengths", "s: str", "list[int]",
           f"Return the list of the lengths of the words of `s` {w}, in order ([] when `s` is empty).",
           lambda s: list(map(len, s.split())), '    return [len(word) for word in s.split(" ")] if s else []\n', g),
        _v(f, "acronym", "acronym", "s: str", "str",
           f"Return the first letter of every word of `s` {w} in uppercase, joined into one string "
           "('' when `s` is empty).",
           lambda s: "".join(x[0].upper() for x in s.split()),
           '    return "".join(word[0] for word in s.split()).upper()\n', g),
    )


def _digit_sum() -> tuple[Variant, ...]:
    f, a = "digit_sum", "the decimal digits of the absolute value of `n`"
    g = lambda r, s: (_number(r, s),)  # noqa: E731
    ds = lambda n: [int(c) for c in str(abs(n))]  # noqa: E731
    return (
        _v(f, "sum", "digit_sum", "n: int", "int", f"Return the sum of {a}.", lambda n: sum(ds(n)),
           "    return sum(int(c) for c in str(abs(n)))\n", g),
        _v(f, "product", "digit_product", "n: int", "int", f"Return the product of {a}.",
           lambda n: math.prod(ds(n)),
           "    out = 1\n    for c in str(abs(n)):\n        out *= int(c)\n    return out\n", g),
        _v(f, "count", "num_digits", "n: int", "int",
           "Return how many decimal digits the absolute value of `n` has (0 has one digit).", lambda n: len(ds(n)),
           "    return len(str(abs(n)))\n", g),
        _v(f, "count_even", "count_even_digits", "n: int", "int", f"Return how many of {a} are even (0 is even).",
           lambda n: len([d for d in ds(n) if d in (0, 2, 4, 6, 8)]),
           "    return sum(1 for c in str(abs(n)) if int(c) % 2 == 0)\n", g),
        _v(f, "count_odd", "count_odd_digits", "n: int", "int", f"Return how many of {a} are odd.",
           lambda n: len([d for d in ds(n) if d in (1, 3, 5, 7, 9)]),
           "    return sum(1 for c in str(abs(n)) if int(c) % 2 == 1)\n", g),
        _v(f, "max", "max_digit", "n: int", "int", f"Return the largest of {a}.", lambda n: sorted(ds(n))[-1],
           "    return max(int(c) for c in str(abs(n)))\n", g),
        _v(f, "min", "min_digit", "n: int", "int", f"Return the smallest of {a}.", lambda n: sorted(ds(n))[0],
           "    return min(int(c) for c in str(abs(n)))\n", g),
        _v(f, "reverse", "reverse_digits", "n: int", "int",
           "Return the integer whose decimal digits are those of `n` in reverse order, with the sign of `n` "
           "(zeros that end up in front are dropped).",
           lambda n: (1 if n >= 0 else -1) * int("".join(reversed(str(abs(n))))),
           "    r = int(str(abs(n))[::-1])\n    return -r if n < 0 else r\n", g),
    )


def _fizzbuzz() -> tuple[Variant, ...]:
    out = []
    for a, b, w1, w2 in ((3, 5, "Fizz", "Buzz"), (2, 3, "Foo", "Bar"), (3, 7, "Ping", "Pong"), (4, 5, "Tic", "Tac"),
                         (2, 5, "Zig", "Zag"), (5, 7, "Beep", "Boop"), (3, 4, "Hip", "Hop"), (2, 7, "Bing", "Bong")):
        body = (f"    out = []\n    for i in range(1, n + 1):\n        if i % {a * b} == 0:\n"
                f"            out.append({w1 + w2!r})\n        elif i % {a} == 0:\n            out.append({w1!r})\n"
                f"        elif i % {b} == 0:\n            out.append({w2!r})\n        else:\n"
                "            out.append(str(i))\n    return out\n")
        out.append(_v("fizzbuzz", f"{a},{b},{w1},{w2}", (w1 + w2).lower(), "n: int", "list[str]",
                      f"Return the list of strings for 1..n: '{w1}' for multiples of {a}, '{w2}' for multiples of "
                      f"{b}, '{w1}{w2}' for multiples of both, else the number itself as a string.",
                      lambda n, a=a, b=b, w1=w1, w2=w2: _fizz(n, a, b, w1, w2), body,
                      lambda r, s: (r.randint(0, 4 * s),)))
    return tuple(out)


def _running_max() -> tuple[Variant, ...]:
    f, g = "running_max", (lambda r, s: (_ints(r, s),))
    out = []
    for spec, word, op, src in (("max", "maximum", max, "max(out[-1], x)"), ("min", "minimum", min, "min(out[-1], x)"),
                                ("sum", "sum", lambda a, b: a + b, "out[-1] + x"),
                                ("product", "product", lambda a, b: a * b, "out[-1] * x")):
        body = f"    out = []\n    for x in nums:\n        out.append({src} if out else x)\n    return out\n"
        out.append(_v(f, f"prefix_{spec}", f"running_{spec}", "nums: list[int]", "list[int]",
                      f"Return a list whose i-th element is the {word} of nums[0..i].",
                      lambda nums, op=op: _scan(nums, op), body, g))
        if spec != "product":
            body = (f"    out = []\n    for x in reversed(nums):\n        out.append({src} if out else x)\n"
                    "    return out[::-1]\n")
            out.append(_v(f, f"suffix_{spec}", f"suffix_{spec}", "nums: list[int]", "list[int]",
                          f"Return a list whose i-th element is the {word} of the elements of `nums` from position i "
                          "to the end.", lambda nums, op=op: _scan(nums[::-1], op)[::-1], body, g))
    return tuple(out)


def _dedupe() -> tuple[Variant, ...]:
    f, g = "dedupe", (lambda r, s: (_ints(r, s, -4, 4),))
    return (
        _v(f, "keep_first", "dedupe", "nums: list[int]", "list[int]",
           "Return `nums` without repeated values, keeping the first occurrence of each, in order.",
           lambda nums: list(dict.fromkeys(nums)),
           "    out = []\n    for x in nums:\n        if x not in out:\n            out.append(x)\n    return out\n", g),
        _v(f, "keep_last", "dedupe_keep_last", "nums: list[int]", "list[int]",
           "Return `nums` without repeated values, keeping only the last occurrence of each value, in order.",
           lambda nums: list(dict.fromkeys(nums[::-1]))[::-1],
           "    return [x for i, x in enumerate(nums) if x not in nums[i + 1:]]\n", g),
        _v(f, "once", "singletons", "nums: list[int]", "list[int]",
           "Return the values that occur exactly once in `nums`, in their original order.",
           lambda nums: [x for x in nums if nums.count(x) == 1],
           "    counts = {}\n    for x in nums:\n        counts[x] = counts.get(x, 0) + 1\n"
           "    return [x for x in nums if counts[x] == 1]\n", g),
        _v(f, "repeated", "duplicates", "nums: list[int]", "list[int]",
           "Return the values that occur more than once in `nums`, each listed once, in order of first occurrence.",
           lambda nums: [x for x in dict.fromkeys(nums) if nums.count(x) > 1],
           "    out = []\n    for x in nums:\n        if nums.count(x) > 1 and x not in out:\n            out.append(x)\n"
           "    return out\n", g),
        _v(f, "collapse", "collapse_repeats", "nums: list[int]", "list[int]",
           "Return `nums` with every run of consecutive equal values collapsed into a single value.",
           lambda nums: [x for i, x in enumerate(nums) if i == 0 or nums[i - 1] != x],
           "    out = []\n    for x in nums:\n        if not out or out[-1] != x:\n            out.append(x)\n"
           "    return out\n", g),
        _v(f, "count", "count_distinct", "nums: list[int]", "int", "Return how many distinct values `nums` contains.",
           lambda nums: len(dict.fromkeys(nums)), "    return len(set(nums))\n", g),
    )


def _second_largest_family() -> tuple[Variant, ...]:
    f, g = "second_largest", (lambda r, s: (_ints(r, s, -5, 5),))
    out = []
    for rank, word, count in ((2, "second", "two"), (3, "third", "three")):
        for side, idx in (("largest", -rank), ("smallest", rank - 1)):
            out.append(_v(f, f"distinct|{side}|{rank}", f"{word}_{side}", "nums: list[int]", "int | None",
                          f"Return the {word} {side} distinct value in `nums`, or None if there are fewer than "
                          f"{count} distinct values.",
                          lambda nums, rank=rank, big=side == "largest": (
                              sorted(set(nums), reverse=big)[rank - 1] if len(set(nums)) >= rank else None),
                          f"    d = sorted(set(nums))\n    return d[{idx}] if len(d) >= {rank} else None\n", g))
    for side, idx, order in (("largest", -2, "largest to smallest"), ("smallest", 1, "smallest to largest")):
        out.append(_v(f, f"repeats|{side}|2", f"second_{side}_with_repeats", "nums: list[int]", "int | None",
                      f"Return the second element of `nums` once it is sorted from {order} (repeated values count "
                      "separately), or None if `nums` has fewer than two elements.",
                      lambda nums, idx=idx: sorted(nums)[idx] if len(nums) >= 2 else None,
                      f"    if len(nums) < 2:\n        return None\n    return sorted(nums)[{idx}]\n", g))
    return tuple(out)


def _rotate_family() -> tuple[Variant, ...]:
    f = "rotate"
    gl = lambda r, s: (_ints(r, s), r.randint(-2 * s, 2 * s))  # noqa: E731
    gk = lambda r, s: (r.randint(-2 * s, 2 * s), _ints(r, s))  # noqa: E731
    gs = lambda r, s: (_letters(r, r.randint(0, s)), r.randint(-2 * s, 2 * s))  # noqa: E731
    right = ("    if not {x}:\n        return {x}[:0]\n    k %= len({x})\n"
             "    return {x}[len({x}) - k:] + {x}[:len({x}) - k]\n")
    left = "    if not {x}:\n        return {x}[:0]\n    k %= len({x})\n    return {x}[k:] + {x}[:k]\n"
    tail = "(k may be negative or larger than the length)"
    return (
        _v(f, "list|right|nums,k", "rotate", "nums: list[int], k: int", "list[int]",
           f"Return `nums` rotated right by `k` positions: the last k elements move to the front {tail}.",
           lambda nums, k: _rotate(nums, k), right.format(x="nums"), gl),
        _v(f, "list|left|nums,k", "rotate_left", "nums: list[int], k: int", "list[int]",
           f"Return `nums` rotated left by `k` positions: the first k elements move to the end {tail}.",
           lambda nums, k: _rotate(nums, -k), left.format(x="nums"), gl),
        _v(f, "list|right|k,nums", "rotate_right_by", "k: int, nums: list[int]", "list[int]",
           f"Return the list `nums` rotated `k` places to the right, so its last k values come first {tail}.",
           lambda k, nums: _rotate(nums, k), right.format(x="nums"), gk),
        _v(f, "list|left|k,nums", "rotate_left_by", "k: int, nums: list[int]", "list[int]",
           f"Return the list `nums` rotated `k` places to the left, so its first k values go last {tail}.",
           lambda k, nums: _rotate(nums, -k), left.format(x="nums"), gk),
        _v(f, "str|right|s,k", "rotate_string", "s: str, k: int", "str",
           f"Return the string `s` rotated right by `k` characters: its last k characters move to the front {tail}.",
           lambda s, k: _rotate(s, k), right.format(x="s"), gs),
        _v(f, "str|left|s,k", "rotate_string_left", "s: str, k: int", "str",
           f"Return the string `s` rotated left by `k` characters: its first k characters move to the end {tail}.",
           lambda s, k: _rotate(s, -k), left.format(x="s"), gs),
    )


def _char_counts() -> tuple[Variant, ...]:
    f, g = "char_counts", (lambda r, s: (_letters(r, r.randint(0, 2 * s), "abcdefgh"),))
    return (
        _v(f, "counts", "char_counts", "s: str", "dict[str, int]",
           "Return a dict mapping each character of `s` to how many times it occurs.",
           lambda s: {c: s.count(c) for c in dict.fromkeys(s)},
           "    d = {}\n    for c in s:\n        d[c] = d.get(c, 0) + 1\n    return d\n", g),
        _v(f, "first_index", "first_positions", "s: str", "dict[str, int]",
           "Return a dict mapping each character of `s` to the index of its first occurrence.",
           lambda s: {c: s.index(c) for c in dict.fromkeys(s)},
           "    d = {}\n    for i, c in enumerate(s):\n        if c not in d:\n            d[c] = i\n    return d\n", g),
        _v(f, "last_index", "last_positions", "s: str", "dict[str, int]",
           "Return a dict mapping each character of `s` to the index of its last occurrence.",
           lambda s: {c: s.rindex(c) for c in dict.fromkeys(s)},
           "    d = {}\n    for i, c in enumerate(s):\n        d[c] = i\n    return d\n", g),
        _v(f, "most_common", "most_common_char", "s: str", "str",
           "Return the character that occurs most often in `s` (of those tied, the one that appears first in `s`), "
           "or '' if `s` is empty.",
           lambda s: min(s, key=lambda c: (-s.count(c), s.index(c))) if s else "",
           '    best = ""\n    for c in s:\n        if not best or s.count(c) > s.count(best):\n            best = c\n'
           "    return best\n", g),
        _v(f, "repeated", "repeated_chars", "s: str", "list[str]",
           "Return the sorted list of the characters that occur more than once in `s`.",
           lambda s: sorted(c for c in set(s) if s.count(c) > 1), "    return sorted({c for c in s if s.count(c) > 1})\n",
           g),
        _v(f, "first_unique", "first_unique_char", "s: str", "str | None",
           "Return the first character of `s` that occurs exactly once in `s`, or None if there is none.",
           lambda s: next((c for c in s if s.count(c) == 1), None),
           "    for c in s:\n        if s.count(c) == 1:\n            return c\n    return None\n", g),
    )


def _is_palindrome() -> tuple[Variant, ...]:
    f = "is_palindrome"
    return (
        _v(f, "letters|nocase", "is_palindrome", "s: str", "bool",
           "Return True if `s` reads the same forwards and backwards when only letters are kept and case is ignored.",
           lambda s: [c.lower() for c in s if c.isalpha()] == [c.lower() for c in s if c.isalpha()][::-1],
           "    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]\n",
           lambda r, s: (r.choice([_mixed(r, s), _pal_letters(r, s)]),)),
        _v(f, "exact", "is_exact_palindrome", "s: str", "bool",
           "Return True if `s` is exactly the same string when reversed (every character counts, case, spaces and "
           "punctuation included).",
           lambda s: all(s[i] == s[-1 - i] for i in range(len(s))), "    return s == s[::-1]\n",
           lambda r, s: (r.choice([_mixed(r, s), _exact_pal(r, s)]),)),
        _v(f, "nospace", "is_palindrome_without_spaces", "s: str", "bool",
           "Return True if `s` with its spaces removed reads the same forwards and backwards (case and every other "
           "character count).",
           lambda s: s.replace(" ", "") == "".join(reversed(s.replace(" ", ""))),
           '    t = "".join(c for c in s if c != " ")\n    return t == t[::-1]\n',
           lambda r, s: (r.choice([_mixed(r, s), _spaced_pal(r, s)]),)),
        _v(f, "anagram", "can_form_palindrome", "s: str", "bool",
           "Return True if the letters of `s` (case ignored, every other character left out) can be rearranged "
           "into a palindrome.",
           lambda s: len([c for c in set(s.lower()) if c.isalpha() and s.lower().count(c) % 2]) <= 1,
           "    counts = {}\n    for c in s.lower():\n        if c.isalpha():\n"
           "            counts[c] = counts.get(c, 0) + 1\n"
           "    return sum(v % 2 for v in counts.values()) <= 1\n",
           lambda r, s: (r.choice([_mixed(r, s), _pairable(r, s)]),)),
        _v(f, "words", "is_word_palindrome", "s: str", "bool",
           "Return True if the sequence of words of `s` (separated by single spaces) is the same in reverse order "
           "(words are compared exactly; the letters inside a word are not reversed).",
           lambda s: s.split(" ") == list(reversed(s.split(" "))),
           '    words = s.split(" ")\n    return words == words[::-1]\n',
           lambda r, s: (r.choice([_text(r, s), _word_pal(r, s)]),)),
    )


def _chunk() -> tuple[Variant, ...]:
    f, g = "chunk", (lambda r, s: (_ints(r, 2 * s), r.randint(1, max(1, s))))
    short = "([] if `nums` has fewer than `size` elements)"
    return (
        _v(f, "chunks|keep", "chunk", "nums: list[int], size: int", "list[list[int]]",
           "Split `nums` into consecutive lists of length `size` (the last may be shorter).",
           lambda nums, size: [nums[i:i + size] for i in range(0, len(nums), size)],
           "    return [nums[i:i + size] for i in range(0, len(nums), size)]\n", g),
        _v(f, "chunks|drop", "full_chunks", "nums: list[int], size: int", "list[list[int]]",
           "Split `nums` into consecutive lists of length `size`, leaving out a final group that would have fewer "
           "than `size` elements.",
           lambda nums, size: [nums[i:i + size] for i in range(0, len(nums) // size * size, size)],
           "    return [nums[i:i + size] for i in range(0, len(nums) - size + 1, size)]\n", g),
        _v(f, "chunks|sum", "chunk_sums", "nums: list[int], size: int", "list[int]",
           "Cut `nums` into consecutive groups of `size` elements (the last group may be shorter) and return the "
           "list of the groups' sums.",
           lambda nums, size: [sum(nums[i:i + size]) for i in range(0, len(nums), size)],
           "    return [sum(nums[i:i + size]) for i in range(0, len(nums), size)]\n", g),
        _v(f, "windows|keep", "windows", "nums: list[int], size: int", "list[list[int]]",
           f"Return every sliding window of `size` consecutive elements of `nums`, as lists, in order {short}.",
           lambda nums, size: [nums[i:i + size] for i in range(len(nums) - size + 1)],
           "    return [nums[i:i + size] for i in range(len(nums) - size + 1)]\n", g),
        _v(f, "windows|sum", "window_sums", "nums: list[int], size: int", "list[int]",
           f"Return the sum of each sliding window of `size` consecutive elements of `nums`, in order {short}.",
           lambda nums, size: [sum(nums[i:i + size]) for i in range(len(nums) - size + 1)],
           "    return [sum(nums[i:i + size]) for i in range(len(nums) - size + 1)]\n", g),
        _v(f, "windows|max", "window_max", "nums: list[int], size: int", "list[int]",
           f"Return the largest value of each sliding window of `size` consecutive elements of `nums`, in order "
           f"{short}.",
           lambda nums, size: [max(nums[i:i + size]) for i in range(len(nums) - size + 1)],
           "    return [max(nums[i:i + size]) for i in range(len(nums) - size + 1)]\n", g),
    )


def _run_length() -> tuple[Variant, ...]:
    f, g = "run_length", (lambda r, s: (_runs(r, s),))
    runs = "runs of equal consecutive characters"
    return (
        _v(f, "tuples", "run_length", "s: str", "list[tuple[str, int]]",
           "Return the run-length encoding of `s` as a list of (character, run length) tuples.", _rle,
           "    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n"
           "            out[-1] = (c, out[-1][1] + 1)\n"
           "        else:\n            out.append((c, 1))\n    return out\n", g),
        _v(f, "string|always", "rle_string", "s: str", "str",
           f"Encode the {runs} of `s` as one string in which each run is written as its character followed by its "
           "length ('xxxyz' gives 'x3y1z1').",
           lambda s: "".join(f"{c}{k}" for c, k in _rle(s)),
           '    out, i = "", 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n'
           "            j += 1\n        out += s[i] + str(j - i)\n        i = j\n    return out\n", g),
        _v(f, "string|compact", "rle_compact", "s: str", "str",
           f"Encode the {runs} of `s` as one string: each run becomes its character, followed by its length only "
           "when that length is more than one ('xxxyzz' gives 'x3yz2').",
           lambda s: "".join(c + (str(k) if k > 1 else "") for c, k in _rle(s)),
           '    out, i = "", 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n'
           '            j += 1\n        out += s[i] + (str(j - i) if j - i > 1 else "")\n        i = j\n    return out\n',
           g),
        _v(f, "decode", "rle_decode", "runs: list[tuple[str, int]]", "str",
           "Return the string described by `runs`, a list of (character, count) tuples: each character repeated "
           "count times, in order.", lambda runs: "".join(c * k for c, k in runs),
           '    return "".join(c * k for c, k in runs)\n', lambda r, s: (_rle(_runs(r, s)),)),
        _v(f, "longest", "longest_char_run", "s: str", "tuple[str, int] | None",
           f"Return the longest of the {runs} of `s` as a (character, length) tuple (the first one on ties), or "
           "None if `s` is empty.",
           lambda s: min(_rle(s), key=lambda t: -t[1]) if s else None,
           "    best, i = None, 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
           "            j += 1\n        if best is None or j - i > best[1]:\n            best = (s[i], j - i)\n"
           "        i = j\n    return best\n", g),
        _v(f, "lengths", "run_lengths", "s: str", "list[int]",
           f"Return the lengths of the {runs} of `s`, in order.", lambda s: [k for _, k in _rle(s)],
           "    out = []\n    for i, c in enumerate(s):\n        if i and s[i - 1] == c:\n            out[-1] += 1\n"
           "        else:\n            out.append(1)\n    return out\n", g),
    )


def _balanced_family() -> tuple[Variant, ...]:
    f = "balanced"

    def check(pairs: str) -> str:
        opens, closes = pairs[0::2], pairs[1::2]
        return (f"    stack = []\n    for c in s:\n        if c in {opens!r}:\n            stack.append(c)\n"
                f"        elif c in {closes!r}:\n"
                f"            if not stack or stack.pop() != {opens!r}[{closes!r}.index(c)]:\n"
                "                return False\n    return not stack\n")

    return (
        _v(f, "()[]{}", "balanced", "s: str", "bool",
           "Return True if the brackets ()[]{} in `s` are balanced and properly nested (other characters are ignored).",
           _balanced, check("()[]{}"), lambda r, s: (_brackets(r, s, "()[]{}", "()[]{}x"),)),
        _v(f, "()", "balanced_parens", "s: str", "bool",
           "Return True if the parentheses in `s` are balanced: every '(' is closed by a later ')' and no ')' comes "
           "without an open '(' (every other character, other brackets included, is ignored).",
           lambda s: _balanced(s, "()"), check("()"), lambda r, s: (_brackets(r, s, "()", "()[]x"),)),
        _v(f, "()[]", "balanced_round_square", "s: str", "bool",
           "Decide whether the round and square brackets of `s`, ( ) and [ ], are balanced and properly nested; "
           "return True or False (curly braces and every other character are ignored).",
           lambda s: _balanced(s, "()[]"), check("()[]"), lambda r, s: (_brackets(r, s, "()[]", "()[]{}x"),)),
        _v(f, "()<>", "balanced_angle", "s: str", "bool",
           "Return True if the parentheses ( ) and angle brackets < > of `s` are balanced and properly nested "
           "(other characters are ignored).",
           lambda s: _balanced(s, "()<>"), check("()<>"), lambda r, s: (_brackets(r, s, "()<>", "()<>[x"),)),
        _v(f, "depth", "max_depth", "s: str", "int",
           "`s` holds balanced parentheses mixed with other characters. Return the maximum nesting depth of its "
           "parentheses (0 when it has none, 2 for '(a(b))').",
           _max_depth, "    depth = best = 0\n    for c in s:\n        if c == '(':\n            depth += 1\n"
           "            best = max(best, depth)\n        elif c == ')':\n            depth -= 1\n    return best\n",
           lambda r, s: (_brackets(r, s, "()", "()x", random_share=0.0, near_miss=0.0),)),
        _v(f, "additions", "min_additions", "s: str", "int",
           "Return the smallest number of '(' or ')' characters to insert into `s` so that its parentheses become "
           "balanced (other characters are ignored).",
           _min_additions, "    opened = missing = 0\n    for c in s:\n        if c == '(':\n            opened += 1\n"
           "        elif c == ')':\n            if opened:\n                opened -= 1\n            else:\n"
           "                missing += 1\n    return opened + missing\n",
           lambda r, s: (_brackets(r, s, "()", "()x"),)),
    )


def _longest_run_family() -> tuple[Variant, ...]:
    f, g = "longest_increasing_run", (lambda r, s: (_ints(r, 2 * s, -5, 5),))
    loop = ("    best = cur = 0\n    for i, x in enumerate(nums):\n        cur = cur + 1 if i and {cond} else 1\n"
            "        best = max(best, cur)\n    return best\n")
    out = [
        _v(f, f"length|{spec}", name, "nums: list[int]", "int",
           f"Return the length of the longest run of consecutive {what} elements (0 for an empty list).",
           lambda nums, ok=ok: _longest(nums, ok)[1], loop.format(cond=cond), gen)
        for spec, name, what, ok, cond, gen in (
            ("inc", "longest_increasing_run", "strictly increasing", lambda a, b: b > a, "x > nums[i - 1]", g),
            ("dec", "longest_decreasing_run", "strictly decreasing", lambda a, b: b < a, "x < nums[i - 1]", g),
            ("nondec", "longest_nondecreasing_run", "non-decreasing (each at least the previous one)",
             lambda a, b: b >= a, "x >= nums[i - 1]", g),
            ("equal", "longest_constant_run", "equal", lambda a, b: a == b, "x == nums[i - 1]",
             lambda r, s: (_ints(r, 2 * s, -2, 2),)))
    ]
    out.append(_v(f, "length|even", "longest_even_run", "nums: list[int]", "int",
                  "Return the length of the longest stretch of consecutive even numbers in `nums` (0 if there is none).",
                  _longest_even,
                  "    best = cur = 0\n    for x in nums:\n        cur = cur + 1 if x % 2 == 0 else 0\n"
                  "        best = max(best, cur)\n    return best\n", g))
    out.append(_v(f, "slice|inc", "longest_increasing_slice", "nums: list[int]", "list[int]",
                  "Return the longest run of consecutive strictly increasing elements of `nums` as a list (the first "
                  "one on ties, [] for an empty list).",
                  lambda nums: (lambda at, n: nums[at:at + n])(*_longest(nums, lambda a, b: b > a)),
                  "    best, start = [], 0\n    for i in range(1, len(nums) + 1):\n"
                  "        if i == len(nums) or nums[i] <= nums[i - 1]:\n            if i - start > len(best):\n"
                  "                best = nums[start:i]\n            start = i\n    return best\n", g))
    return tuple(out)


def _mean_family() -> tuple[Variant, ...]:
    f, g = "mean", (lambda r, s: (_ints(r, s, -100, 100),))
    return (
        _v(f, "mean", "mean", "nums: list[int]", "float",
           "Return the arithmetic mean of `nums` as a float, or 0.0 for an empty list.",
           lambda nums: sum(nums) / len(nums) if nums else 0.0, "    return sum(nums) / len(nums) if nums else 0.0\n", g),
        _v(f, "median", "median", "nums: list[int]", "float",
           "Return the median of `nums` as a float (the mean of the two middle values when the length is even), "
           "or 0.0 for an empty list.", _median,
           "    if not nums:\n        return 0.0\n    d = sorted(nums)\n    m = len(d) // 2\n"
           "    return float(d[m]) if len(d) % 2 else (d[m - 1] + d[m]) / 2\n", g),
        _v(f, "variance", "variance", "nums: list[int]", "float",
           "Return the population variance of `nums` (the mean of the squared differences from the mean) as a "
           "float, or 0.0 for an empty list.", _variance,
           "    if not nums:\n        return 0.0\n    m = sum(nums) / len(nums)\n"
           "    return sum((x - m) ** 2 for x in nums) / len(nums)\n", g),
        _v(f, "abs", "mean_absolute", "nums: list[int]", "float",
           "Return the mean of the absolute values of `nums` as a float, or 0.0 for an empty list.",
           lambda nums: sum(map(abs, nums)) / len(nums) if nums else 0.0,
           "    return sum(abs(x) for x in nums) / len(nums) if nums else 0.0\n", g),
        _v(f, "midrange", "midrange", "nums: list[int]", "float",
           "Return the average of the largest and the smallest value of `nums` as a float, or 0.0 for an empty list.",
           lambda nums: (sorted(nums)[0] + sorted(nums)[-1]) / 2 if nums else 0.0,
           "    return (max(nums) + min(nums)) / 2 if nums else 0.0\n", g),
        _v(f, "trimmed", "trimmed_mean", "nums: list[int]", "float",
           "Return the mean of `nums` once one smallest and one largest value are removed, as a float, or 0.0 if "
           "`nums` has fewer than three elements.",
           lambda nums: sum(sorted(nums)[1:-1]) / (len(nums) - 2) if len(nums) >= 3 else 0.0,
           "    if len(nums) < 3:\n        return 0.0\n    d = sorted(nums)[1:-1]\n    return sum(d) / len(d)\n", g),
    )


TEMPLATES: tuple[Template, ...] = (
    Template("sum_evens", 1, _sum_evens()),
    Template("count_vowels", 1, _count_vowels()),
    Template("reverse_words", 1, _reverse_words()),
    Template("digit_sum", 1, _digit_sum()),
    Template("fizzbuzz", 1, _fizzbuzz()),
    Template("running_max", 2, _running_max()),
    Template("dedupe", 2, _dedupe()),
    Template("second_largest", 2, _second_largest_family()),
    Template("rotate", 2, _rotate_family()),
    Template("char_counts", 2, _char_counts()),
    Template("is_palindrome", 2, _is_palindrome()),
    Template("chunk", 2, _chunk()),
    Template("run_length", 3, _run_length()),
    Template("balanced", 3, _balanced_family()),
    Template("longest_increasing_run", 3, _longest_run_family()),
    Template("mean", 3, _mean_family()),
)
