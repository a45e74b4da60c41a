"""Seeded argument generators and small reference helpers of the `code:functions` families
(honing.tasks.code_families): lists, words, palindromes, bracket strings, runs."""

from __future__ import annotations

import random
import string
from typing import Any, Callable

def _ints(rng: random.Random, size: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, size))]


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(max(1, n)))


def _letters(rng: random.Random, n: int, pool: str = string.ascii_lowercase) -> str:
    return "".join(rng.choice(pool) for _ in range(n))


def _number(rng: random.Random, size: int) -> int:
    """An integer of up to about `size` digits (the digit count itself uniform)."""
    top = 10 ** rng.randint(1, size)
    return rng.randint(-top, top)


def _multiples(rng: random.Random, size: int, k: int) -> list[int]:
    """Like _ints, with about half the numbers multiples of k."""
    return [rng.choice([rng.randint(-20, 20), k * rng.randint(-3, 3)]) for _ in range(rng.randint(0, size))]


def _text(rng: random.Random, size: int) -> str:
    return " ".join(_word(rng, rng.randint(1, 6)) for _ in range(rng.randint(0, size)))


def _mixed(rng: random.Random, size: int) -> str:
    pool = string.ascii_letters + "  ,.!?"
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, size * 3)))


def _prose(rng: random.Random, size: int) -> str:
    """Words of mixed-case letters, some followed by punctuation, separated by spaces."""
    return " ".join(_letters(rng, rng.randint(1, 5), string.ascii_letters) + rng.choice(["", "", ",", ".", "!", "?"])
                    for _ in range(rng.randint(0, size)))


def _mirror(rng: random.Random, half: str) -> str:
    return half + rng.choice(["", rng.choice(half or "a")]) + half[::-1]


def _pal_letters(rng: random.Random, size: int) -> str:
    """Letters that are a palindrome ignoring case, with spaces and punctuation sprinkled in."""
    core = _mirror(rng, _letters(rng, rng.randint(1, size), "abcdeAB"))
    out = []
    for c in core:
        out.append(c.upper() if rng.random() < 0.3 else c.lower())
        if rng.random() < 0.3:
            out.append(rng.choice(" ,.!?"))
    return "".join(out)


def _exact_pal(rng: random.Random, size: int, pool: str = "abAB ,.") -> str:
    s = _mirror(rng, _letters(rng, rng.randint(0, size), pool))
    if s and rng.random() < 0.3:  # a near miss: one character's case flipped
        i = rng.randrange(len(s))
        s = s[:i] + s[i].swapcase() + s[i + 1:]
    return s


def _spaced_pal(rng: random.Random, size: int) -> str:
    s = _exact_pal(rng, size, "abcAB,.")
    return "".join(c + (" " if rng.random() < 0.3 else "") for c in s)


def _word_pal(rng: random.Random, size: int) -> str:
    vocab = ["a", "b", "ab", "ba", "cat", "tac", "dog"]
    half = [rng.choice(vocab) for _ in range(rng.randint(0, max(1, size // 2)))]
    words = half + ([rng.choice(vocab)] if rng.random() < 0.5 else []) + half[::-1]
    if words and rng.random() < 0.3:
        words[rng.randrange(len(words))] = rng.choice(vocab)
    return " ".join(words)


def _pairable(rng: random.Random, size: int) -> str:
    """Letters that can (often) be rearranged into a palindrome, shuffled, with other characters."""
    chars = [c for c in _letters(rng, rng.randint(0, size), "abcAB") for _ in range(2)]
    if rng.random() < 0.5:
        chars.append(rng.choice("abc"))
    if rng.random() < 0.3:
        chars.append(rng.choice("ab"))
    chars += [rng.choice(" ,!") for _ in range(rng.randint(0, 2))]
    rng.shuffle(chars)
    return "".join(chars)


def _nested(rng: random.Random, n: int, pairs: str) -> str:
    """A balanced string of about `n` bracket pairs drawn from `pairs` ("()[]" ...)."""
    if n <= 0:
        return ""
    k = rng.randrange(0, len(pairs), 2)
    inner = rng.randint(0, n - 1)
    return pairs[k] + _nested(rng, inner, pairs) + pairs[k + 1] + _nested(rng, n - 1 - inner, pairs)


def _brackets(rng: random.Random, size: int, pairs: str, pool: str, random_share: float = 0.5,
              near_miss: float = 0.33) -> str:
    """Random strings over `pool` (`random_share` of them), else balanced strings over `pairs` with
    other characters of `pool` sprinkled in (`near_miss` of those with one character changed)."""
    if rng.random() < random_share:
        return "".join(rng.choice(pool) for _ in range(rng.randint(0, 2 * size)))
    s = list(_nested(rng, rng.randint(0, size), pairs))
    others = [c for c in pool if c not in pairs]
    for _ in range(rng.randint(0, 3) if others else 0):
        s.insert(rng.randint(0, len(s)), rng.choice(others))
    if s and rng.random() < near_miss:
        s[rng.randrange(len(s))] = rng.choice(pool)
    return "".join(s)


def _runs(rng: random.Random, size: int) -> str:
    return "".join(rng.choice("abc") * rng.randint(1, 3) for _ in range(rng.randint(0, size)))


def _rle(s: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for ch in s:
        if out and out[-1][0] == ch:
            out[-1] = (ch, out[-1][1] + 1)
        else:
            out.append((ch, 1))
    return out


def _balanced(s: str, pairs: str = "()[]{}") -> bool:
    close = {pairs[i + 1]: pairs[i] for i in range(0, len(pairs), 2)}
    stack: list[str] = []
    for ch in s:
        if ch in close.values():
            stack.append(ch)
        elif ch in close:
            if not stack or stack.pop() != close[ch]:
                return False
    return not stack


def _max_depth(s: str) -> int:
    best = cur = 0
    for ch in s:
        cur += (ch == "(") - (ch == ")")
        best = max(best, cur)
    return best


def _min_additions(s: str) -> int:
    opened = missing = 0
    for ch in s:
        if ch == "(":
            opened += 1
        elif ch == ")":
            if opened:
                opened -= 1
            else:
                missing += 1
    return opened + missing


def _longest(nums: list[int], ok: Callable[[int, int], bool]) -> tuple[int, int]:
    """(start, length) of the first longest run in which ok(previous, current) holds between neighbours."""
    best, best_at, cur, at = 0, 0, 0, 0
    for i, x in enumerate(nums):
        if i and ok(nums[i - 1], x):
            cur += 1
        else:
            cur, at = 1, i
        if cur > best:
            best, best_at = cur, at
    return best_at, best


def _longest_even(nums: list[int]) -> int:
    best = cur = 0
    for x in nums:
        cur = cur + 1 if x % 2 == 0 else 0
        best = max(best, cur)
    return best


def _fizz(n: int, a: int = 3, b: int = 5, w1: str = "Fizz", w2: str = "Buzz") -> list[str]:
    return [w1 + w2 if i % a == 0 and i % b == 0 else w1 if i % a == 0 else w2 if i % b == 0 else str(i)
            for i in range(1, n + 1)]


def _scan(nums: list[int], op: Callable[[int, int], int]) -> list[int]:
    out: list[int] = []
    for x in nums:
        out.append(x if not out else op(out[-1], x))
    return out


def _rotate(seq: Any, k: int) -> Any:
    """`seq` rotated right by k (left for negative k)."""
    if not seq:
        return seq[:0]
    k %= len(seq)
    return seq[len(seq) - k:] + seq[:len(seq) - k]


def _median(nums: list[int]) -> float:
    d, m = sorted(nums), len(nums) // 2
    return 0.0 if not d else float(d[m]) if len(d) % 2 else (d[m - 1] + d[m]) / 2


def _variance(nums: list[int]) -> float:
    if not nums:
        return 0.0
    mu = sum(nums) / len(nums)
    return sum((x - mu) ** 2 for x in nums) / len(nums)
