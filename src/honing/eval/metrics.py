"""Evaluation metrics as pure functions: pass@k, mean@n, maj@k, bootstrap confidence intervals.

Per task the inputs are n samples; `correct` is how many passed, `answers` the normalised final
answers (None when a sample had none). Dataset-level numbers are means over tasks.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import combinations
from typing import Any, Callable, Hashable, Sequence

import numpy as np

# A change is called significant only over at least this many independent units (structures, or tasks
# where there are none): a bootstrap over one task has a zero-width interval (honing.eval.compare).
MIN_UNITS = 5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the probability that a random k-subset of the n samples holds at least one of the c correct
    ones. The product form is numerically stable for large n.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_for(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n (and n itself): the points of a pass@k curve."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else ks + [n]


def pass_at_k_curve(ns: Sequence[int], cs: Sequence[int]) -> dict[int, float]:
    """Mean pass@k over tasks for every k on the curve of the smallest n."""
    n_min = min(ns)
    return {k: float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)])) for k in ks_for(n_min)}


def mean_at_n(n: int, c: int) -> float:
    """mean@n: the fraction of the n samples that passed (an unbiased pass@1)."""
    return c / n


def majority(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most common non-None answer; ties go to the answer seen first (deterministic)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(answers: Sequence[Hashable | None], gold_ok: Callable[[Hashable], bool], k: int,
             max_subsets: int = 200, seed: int = 0) -> float:
    """maj@k: the chance that the majority answer of k samples is correct, averaged over the
    k-subsets of the n samples (all of them when there are at most `max_subsets`, else a seeded
    random sample of subsets)."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n (n={n}, k={k})")
    if math.comb(n, k) <= max_subsets:
        subsets = list(combinations(range(n), k))
    else:
        rng = random.Random(seed)
        subsets = [tuple(rng.sample(range(n), k)) for _ in range(max_subsets)]
    hits = 0
    for s in subsets:
        m = majority([answers[i] for i in s])
        hits += m is not None and gold_ok(m)
    return hits / len(subsets)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0, clusters: Sequence[Hashable] | None = None) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over tasks (resampling tasks with replacement).

    `clusters` (one label per value): tasks that share a label are not independent (code:functions
    tasks of one structure get near-identical answers), so the resampling is two-stage: labels with
    replacement, then the tasks within each drawn label. Without it, every task is its own cluster."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return (float("nan"), float("nan"))
    if v.size == 1:
        return (float(v[0]), float(v[0]))
    rng = np.random.default_rng(seed)
    groups = _groups(v, clusters)
    if groups is None:
        means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    else:
        means = np.empty(n_boot)
        for b in range(n_boot):
            drawn = [groups[i] for i in rng.integers(0, len(groups), size=len(groups))]
            means[b] = np.concatenate([g[rng.integers(0, g.size, size=g.size)] for g in drawn]).mean()
    lo = (1.0 - level) / 2
    return (float(np.quantile(means, lo)), float(np.quantile(means, 1.0 - lo)))


def task_structure(task: Any) -> str | None:
    """The structure a task was generated from (`metadata.structure`: code:functions), or None. Tasks that
    share one get near-identical answers, so CIs over them resample structures (`clusters`)."""
    value = (getattr(task, "metadata", None) or {}).get("structure")
    return None if value is None else str(value)


def _groups(v: np.ndarray, clusters: Sequence[Hashable] | None) -> list[np.ndarray] | None:
    """`v` split by cluster label (None: no labels, or every label distinct: plain resampling)."""
    if clusters is None:
        return None
    if len(clusters) != v.size:
        raise ValueError(f"clusters: {len(clusters)} labels for {v.size} values")
    idx: dict[Hashable, list[int]] = {}
    for i, c in enumerate(clusters):
        idx.setdefault(c, []).append(i)
    return None if len(idx) == v.size else [v[ix] for ix in idx.values()]


def diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95, n_boot: int = 2000,
            seed: int = 0, clusters: Sequence[Hashable] | None = None) -> tuple[float, float, float]:
    """Paired bootstrap of mean(b) - mean(a) over the same tasks: (delta, lo, hi). An interval
    that excludes 0 is a significant change. `clusters`: as in `bootstrap_ci`."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired comparison needs the same tasks on both sides ({x.size} vs {y.size})")
    d = y - x
    lo, hi = bootstrap_ci(d, level, n_boot, seed, clusters)
    return float(d.mean()) if d.size else float("nan"), lo, hi


def heldout_deltas(stages: dict[str, dict | None]) -> dict[str, dict]:
    """A run's held-out stages ({"before": ..., "after_sft": ..., "after": ...}, each with
    `per_task_pass@1`) -> pass@1 with a bootstrap 95% CI per stage, and the paired CI of every
    later stage minus every earlier one over the tasks both share: {"pass@1": {stage: [mean, lo, hi]},
    "delta": {"after-before": [delta, lo, hi], ...}}. Stages without per-task results are skipped.
    Where the stages have `per_task_cluster` (task id -> structure), the CIs resample structures, then
    tasks within them (tasks of one structure are not independent). Where the stages also have `per_task_reward` (the mean score per task: partial credit, e.g. CAD's
    geometry layers), "mean_reward" and "reward_delta" hold the same for the reward. Where the stages
    record `per_task_domain` (task id -> domain) and it names more than one domain, "per_domain" holds
    the same dict for each domain's tasks alone (a mixed run: which domain moved, and by how much)."""
    clusters: dict[str, Hashable] = {}  # task id -> structure, where the evaluation recorded one
    domains: dict[str, str] = {}  # task id -> domain, where the evaluation recorded it
    for v in stages.values():
        clusters.update((v or {}).get("per_task_cluster") or {})
        domains.update((v or {}).get("per_task_domain") or {})
    out = _stage_cis(stages, "per_task_pass@1", "pass@1", "delta", clusters)
    rewards = _stage_cis(stages, "per_task_reward", "mean_reward", "reward_delta", clusters)
    if rewards["mean_reward"]:
        out.update(rewards)
    if len(set(domains.values())) > 1:
        out["per_domain"] = {}
        for d in sorted(set(domains.values())):
            ids = {t for t, x in domains.items() if x == d}
            out["per_domain"][d] = {"tasks": len(ids), "units": len({clusters.get(t, t) for t in ids}),
                                    **heldout_deltas({k: _only_tasks(v, ids) for k, v in stages.items()})}
    return out


def domain_rows(ci: dict) -> list[dict[str, Any]]:
    """One row per domain of `heldout_deltas(...)["per_domain"]`: its pass@1 [CI] at each stage, the paired
    change of the last stage against the first and against the one before it, and `regressed`: a change
    whose whole CI lies below zero over at least MIN_UNITS independent units (fewer cannot tell; as in
    `honing eval compare`)."""
    rows = []
    for d, c in (ci.get("per_domain") or {}).items():
        stages = list(c["pass@1"])
        last = stages[-1] if stages else None
        changes = {f"{last}-{s}": c["delta"].get(f"{last}-{s}") for s in ({stages[0], stages[-2]} if len(stages) > 1
                                                                          else set())}
        changes = {k: v for k, v in sorted(changes.items()) if v}
        rows.append({"domain": d, "tasks": c["tasks"], "units": c["units"], "pass@1": c["pass@1"], "changes": changes,
                     "regressed": c["units"] >= MIN_UNITS and any(v[2] < 0 for v in changes.values())})
    return rows


def _only_tasks(stage: dict | None, ids: set[str]) -> dict | None:
    """A held-out stage restricted to some tasks (one domain's): its per-task maps filtered, the domain
    map dropped (so the restricted stage does not split again)."""
    if not stage:
        return stage
    keep = ("per_task_pass@1", "per_task_reward", "per_task_cluster")
    return {k: {t: x for t, x in (stage.get(k) or {}).items() if t in ids} for k in keep if stage.get(k)}


def _stage_cis(stages: dict[str, dict | None], key: str, level: str, delta: str,
               clusters: dict[str, Hashable]) -> dict[str, dict]:
    names = [k for k, v in stages.items() if v and v.get(key)]
    out: dict[str, dict] = {level: {}, delta: {}}
    for k in names:
        vals = list(stages[k][key].values())
        lo, hi = bootstrap_ci(vals, clusters=[clusters.get(t, t) for t in stages[k][key]])
        out[level][k] = [round(sum(vals) / len(vals), 6), round(lo, 6), round(hi, 6)]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = stages[a][key], stages[b][key]
            shared = [t for t in pa if t in pb]
            if shared:
                d, lo, hi = diff_ci([pa[t] for t in shared], [pb[t] for t in shared],
                                    clusters=[clusters.get(t, t) for t in shared])
                out[delta][f"{b}-{a}"] = [round(d, 6), round(lo, 6), round(hi, 6)]
    return out


def episode_behaviour(samples: Sequence[dict]) -> dict[str, Any] | None:
    """What multi-turn episodes did (None when there are none): the share that made a valid tool call,
    that ran the tests, that saw a failing test run, and of those the share that passed in the end
    (a correction round that worked); mean tool calls and correction rounds per episode."""
    eps = [r for r in samples if r.get("episode") is not None and r["status"] != "infra_error"]
    if not eps:
        return None
    n = len(eps)
    st = [r["episode"] for r in eps]
    failed_once = [r for r in eps if r["episode"].get("failed_test_runs", 0) > 0]
    return {
        "episodes": n,
        "valid_tool_call": round(sum(x.get("tool_calls", 0) > x.get("failed_tool_calls", 0) for x in st) / n, 6),
        "ran_tests": round(sum(x.get("test_runs", 0) > 0 for x in st) / n, 6),
        "saw_failing_tests": round(len(failed_once) / n, 6),
        "passed_after_failing_tests": (round(sum(r["passed"] for r in failed_once) / len(failed_once), 6)
                                       if failed_once else None),
        "mean_tool_calls": round(sum(x.get("tool_calls", 0) for x in st) / n, 4),
        "mean_correction_rounds": round(sum(x.get("correction_rounds", 0) for x in st) / n, 4),
    }


def verdict_layers(samples: Sequence[dict]) -> dict[str, float] | None:
    """Mean of each verdict component over the graded samples (None when no sample has any): where a
    layered verifier's episodes fall short (CAD: build, valid, bbox, volume, iou, features). A layer a
    sample never reached (a script that did not build has no IoU) counts as 0."""
    graded = [r for r in samples if r.get("status") != "infra_error"]
    names = sorted({k for r in graded for k in (r.get("components") or {})})
    if not names:
        return None
    return {k: round(sum(float((r.get("components") or {}).get(k, 0.0)) for r in graded) / len(graded), 6)
            for k in names}


def describe_behaviour(b: dict[str, Any]) -> str:
    """One line from `episode_behaviour`'s shares: what the episodes did."""
    after = b.get("passed_after_failing_tests")
    return (f"valid tool call {b['valid_tool_call']:.2f}  ran tests {b['ran_tests']:.2f}  "
            f"saw failing tests {b['saw_failing_tests']:.2f}  passed after a failing run "
            f"{'-' if after is None else f'{after:.2f}'}  "
            f"actions/episode (calls, valid or not) {b['mean_tool_calls']:.1f}")
