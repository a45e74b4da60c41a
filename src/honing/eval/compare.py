"""Compare two evaluations of the same suite: per-domain deltas with paired bootstrap CIs.

Pairing is over the task ids both evaluations graded (a task only one side has is left out and
counted). A domain whose interval for B - A lies wholly below 0 is a significant regression;
wholly above 0, a significant improvement. Metrics compared per task: pass@1, pass@k (k = the
smaller sample count of the two), maj@k where both sides have it, and the mean reward (the one that
moves on a partial-credit domain such as CAD while pass@k is still 0). Tasks that share a structure
(code:functions, CAD) are resampled together: structures first, then tasks within them.

A change is called significant only over at least MIN_UNITS independent units (structures, or
tasks where there are none): a bootstrap over one task has a zero-width interval, so a domain of
one task would flag any difference as a regression. Such a domain still shows its delta and is
named in the warnings.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

from honing.eval.metrics import MIN_UNITS, diff_ci, pass_at_k


def _per_task(result: dict, k: int) -> dict[str, dict[str, Any]]:
    out = {}
    for r in result["tasks"]:
        if not r.get("n"):
            continue
        row = {"domain": r["domain"], "pass@1": r["correct"] / r["n"],
               f"pass@{k}": pass_at_k(r["n"], r["correct"], k) if r["n"] >= k else None,
               f"maj@{k}": r.get(f"maj@{k}"), "mean_reward": r.get("mean_reward"),
               "cluster": r.get("structure", r["id"])}
        out[r["id"]] = row
    return out


def _k(result: dict) -> int:
    return int(result.get("meta", {}).get("samples_per_task") or min((r["n"] for r in result["tasks"] if r["n"]),
                                                                     default=1))


def _metrics(k: int) -> list[str]:
    return ["pass@1"] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else []) + ["mean_reward"]


def compare(a: dict, b: dict, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """{"domains": {d: {metric: {"a", "b", "delta", "lo", "hi", "significant"}}}, "regressions": [(d, metric)],
    "improvements": [...], "warnings": [...], "k": k}."""
    k = min(_k(a), _k(b))
    ta, tb = _per_task(a, k), _per_task(b, k)
    shared = [i for i in ta if i in tb]
    warnings = []
    ma, mb = a.get("meta", {}), b.get("meta", {})
    if (ma.get("suite"), ma.get("suite_version")) != (mb.get("suite"), mb.get("suite_version")):
        warnings.append(f"different suites: {ma.get('suite')}@v{ma.get('suite_version')} vs "
                        f"{mb.get('suite')}@v{mb.get('suite_version')}")
    only = len(ta) + len(tb) - 2 * len(shared)
    if only:
        warnings.append(f"{only} task(s) graded on one side only are left out of the comparison")
    if not shared:
        warnings.append("no shared tasks: nothing to compare")
    by_dom: dict[str, list[str]] = defaultdict(list)
    for i in shared:
        by_dom[ta[i]["domain"]].append(i)
    metrics = _metrics(k)
    domains: dict[str, dict[str, Any]] = {}
    regressions, improvements = [], []
    for d in sorted(by_dom) + (["all"] if len(by_dom) > 1 else []):
        ids = shared if d == "all" else by_dom[d]
        units = len({ta[i]["cluster"] for i in ids})
        domains[d] = {"n_tasks": len(ids), "units": units, "too_few": units < MIN_UNITS}
        if units < MIN_UNITS:
            warnings.append(f"{d}: {units} independent task(s) (fewer than {MIN_UNITS}): its deltas are shown "
                            "but never called significant")
        for m in metrics:
            pairs = [(ta[i][m], tb[i][m], ta[i]["cluster"]) for i in ids
                     if ta[i][m] is not None and tb[i][m] is not None]
            if not pairs:
                continue
            xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
            delta, lo, hi = diff_ci(xa, xb, level=level, seed=seed, clusters=[p[2] for p in pairs])
            sig = (lo > 0 or hi < 0) and units >= MIN_UNITS
            domains[d][m] = {"a": sum(xa) / len(xa), "b": sum(xb) / len(xb), "delta": delta, "lo": lo, "hi": hi,
                             "significant": sig, "n": len(pairs)}
            if sig and d != "all":
                (regressions if hi < 0 else improvements).append((d, m))
    return {"k": k, "level": level, "domains": domains, "regressions": regressions, "improvements": improvements,
            "warnings": warnings, "shared_tasks": len(shared)}


def compare_table(cmp: dict, name_a: str = "A", name_b: str = "B") -> Any:
    from rich.table import Table

    k = cmp["k"]
    t = Table(title=f"{name_b} vs {name_a}: delta (B - A) with {cmp['level']:.0%} paired bootstrap CI "
                    f"over {cmp['shared_tasks']} shared tasks", title_justify="left")
    t.add_column("domain", no_wrap=True)
    t.add_column("tasks", justify="right")
    metrics = [m for m in _metrics(k) if any(m in row for row in cmp["domains"].values())]
    for m in metrics:  # two lines a cell: A→B, then the delta and its CI; the verdict column is never cut
        t.add_column("reward" if m == "mean_reward" else m, justify="right")
    t.add_column("", no_wrap=True, min_width=len("REGRESSION"))
    for d, row in cmp["domains"].items():
        cells, flag = [], ""
        for m in metrics:
            c: Optional[dict] = row.get(m)
            if c is None:
                cells.append("-")
                continue
            mark = ""
            if c["significant"]:
                mark = " ▼" if c["hi"] < 0 else " ▲"
                if c["hi"] < 0 and d != "all":
                    flag = "[bold red]REGRESSION[/bold red]"
                elif not flag and d != "all":
                    flag = "[green]improved[/green]"
            cells.append(f"{c['a']:.3f}→{c['b']:.3f}\n{c['delta']:+.3f} [{c['lo']:+.2f}, {c['hi']:+.2f}]{mark}")
        t.add_row(d, str(row["n_tasks"]), *cells, flag)
    return t
