"""Throughput of the `math` verifier vs plain math-verify on a realistic answer mix.

    .venv/bin/python benchmarks/math_verify_throughput.py [--n 10000] [--seed 0]

Grades the same (gold, completion) pairs with (a) math_verify.parse + math_verify.verify (its
default in-process, signal-based timeouts) and (b) honing's `math` verifier (fast paths, then
math-verify in a worker process). Prints pairs/s for each, the ratio and the disagreements.
Ends with `RATIO ours_vs_math_verify=<x>`.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import time
from fractions import Fraction


def make_pairs(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """(gold, completion, truth) triples: mostly plain numbers and simple fractions, some LaTeX, ~30%
    wrong. Most answers are boxed; some are written in prose ("The answer is $x$.") or plain."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        r = rng.random()
        wrong = rng.random() < 0.3
        if r < 0.50:  # integers, sometimes formatted
            g = rng.randint(-50, 5000)
            p = g + rng.choice([-1, 1, 10]) if wrong else g
            pred = rng.choice([str(p), str(p), f"{p:,}", f"{p}.", f"${p}$", f"x = {p}"])
            gold = str(g)
        elif r < 0.65:  # simple fractions
            a, b = rng.randint(1, 20), rng.randint(2, 12)
            f = Fraction(a, b) + (Fraction(1, b) if wrong else 0)
            gold = rng.choice([f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}"])
            pred = rng.choice([f"\\frac{{{f.numerator}}}{{{f.denominator}}}", f"{f.numerator}/{f.denominator}",
                               f"\\dfrac{{{f.numerator}}}{{{f.denominator}}}"])
        elif r < 0.75:  # decimals, percentages, units
            g = round(rng.uniform(0, 100), 2)
            p = round(g + (0.5 if wrong else 0), 2)
            gold = str(g)
            pred = rng.choice([str(p), f"{p}\\text{{ cm}}", f"{p:.2f}"])
        elif r < 0.90:  # LaTeX needing symbolic equivalence
            k = rng.randint(2, 9)
            gold, pred = rng.choice([
                (f"{k}\\sqrt{{2}}", f"\\sqrt{{{2 * k * k}}}"),
                (f"\\frac{{\\pi}}{{{k}}}", f"\\pi/{k}"),
                (f"x^2+{2 * k}x+{k * k}", f"(x+{k})^2"),
                (f"\\frac{{\\sqrt{{{k}}}}}{{2}}", f"\\frac{{1}}{{2}}\\sqrt{{{k}}}"),
                (f"\\{{1,{k}\\}}", f"\\{{{k},1\\}}"),
                (f"({k},\\infty)", f"({k}, \\infty)"),
            ])
            if wrong:
                changed = pred.replace(str(k), str(k + 1), 1)
                wrong, pred = changed != pred, changed
        elif r < 0.95:  # percentages, scientific notation
            k = rng.randint(1, 99)
            gold, pred = rng.choice([(f"{k}", f"{k}\\%"), (f"{k}000", f"{k}\\times 10^{{3}}"),
                                     (f"{k / 100}", f"{k}\\%")])
            if wrong:
                gold = str(k + 1)
        else:  # garbage / hedges
            k = rng.randint(1, 9)
            gold, pred = str(k), rng.choice(["", "I don't know", f"{k} or {k + 1}", "\\frac{", "x"])
            wrong = True
        form = rng.random()
        if form < 0.75:
            text = f"Reasoning... so the final answer is \\boxed{{{pred}}}."
        elif form < 0.95:
            text = f"Let $y$ be the unknown. Working it through, the answer is ${pred}$."
        else:
            text = f"We add them up and get {pred}"
        pairs.append((gold, text, not wrong))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--no-cache", action="store_true", help="disable the slow-path verdict cache")
    args = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    from math_verify import parse, verify

    from honing.rollout.types import Trajectory
    from honing.tasks.types import Task, VerifierSpec
    from honing.verify import VerifyContext, get_verifier

    if args.no_cache:
        import honing.verify.math as vm

        vm.SLOW_CACHE_SIZE = 0
    pairs = make_pairs(args.n, args.seed)

    ours_v, ctx = get_verifier("math"), VerifyContext()  # extractor "auto": the maths reading
    ours_v.verify(Task("w", "d", (), VerifierSpec("math"), {"answer": "x^2+2x+1"}),
                  Trajectory.from_text("w", "d", "\\boxed{(x+1)^2}"), ctx)  # start the worker (not timed)
    tasks = [Task(f"t{i}", "d", (), VerifierSpec("math"), {"answer": g}) for i, (g, _, _) in enumerate(pairs)]
    trajs = [Trajectory.from_text(t.id, "d", c) for t, (_, c, _) in zip(tasks, pairs)]
    # The two graders alternate over chunks so that load from other processes hits both alike.
    plain: list[bool] = []
    verdicts = []
    t_plain = t_ours = 0.0
    for lo in range(0, len(pairs), args.chunk):
        hi = lo + args.chunk
        t0 = time.perf_counter()
        plain += [bool(verify(parse(f"\\boxed{{{g}}}"), parse(c))) for g, c, _ in pairs[lo:hi]]
        t1 = time.perf_counter()
        verdicts += [ours_v.verify(t, tr, ctx) for t, tr in zip(tasks[lo:hi], trajs[lo:hi])]
        t_ours += time.perf_counter() - t1
        t_plain += t1 - t0
    ours = [v.passed for v in verdicts]

    n = len(pairs)
    infra = sum(v.infra_error for v in verdicts)
    fast = sum("fast)" in v.details for v in verdicts)
    disagree = [(g, c, a, b) for (g, c, _), a, b in zip(pairs, plain, ours) if a != b]
    truth = [t for _, _, t in pairs]
    mv_right_ours_wrong = sum(a == t != b for a, b, t in zip(plain, ours, truth))
    print(f"pairs: {n}  (ours: {fast} fast path, {n - fast - infra} math-verify, {infra} infra errors)")
    print(f"math_verify : {n / t_plain:10.0f} pairs/s  ({t_plain:.2f}s)  correct={sum(plain)}")
    print(f"ours (math) : {n / t_ours:10.0f} pairs/s  ({t_ours:.2f}s)  correct={sum(ours)}")
    print(f"right (against the generator's truth): math_verify {sum(a == t for a, t in zip(plain, truth))}/{n}, "
          f"ours {sum(b == t for b, t in zip(ours, truth))}/{n}")
    print(f"disagreements: {len(disagree)}  (math-verify right, ours wrong: {mv_right_ours_wrong})")
    shapes: dict[str, int] = {}  # one example per answer shape (digits replaced by 9)
    for g, c, a, b in disagree:
        key = re.sub(r"\d+", "9", f"{g}|{c}|{a}")
        shapes[key] = shapes.get(key, 0) + 1
        if shapes[key] > 1 or len(shapes) > 12:
            continue
        print(f"  gold={g!r:24} completion={c[-48:]!r:50} math_verify={a} ours={b}")
    print("disagreements by shape:", ", ".join(f"{k.split('|')[1][-30:]!r}x{v}" for k, v in shapes.items()))
    print(f"RATIO ours_vs_math_verify={t_plain / t_ours:.2f}")


if __name__ == "__main__":
    main()
