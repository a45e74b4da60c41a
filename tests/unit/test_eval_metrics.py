"""pass@k against brute-force enumeration, maj@k, bootstrap CIs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from honing.eval.metrics import (bootstrap_ci, diff_ci, ks_for, maj_at_k, majority, mean_at_n, pass_at_k,
                                 pass_at_k_curve)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n_and_matches_the_binomial_form() -> None:
    n, c, k = 1000, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(8, 2, 1) == mean_at_n(8, 2)


def test_pass_at_k_rejects_impossible_inputs() -> None:
    for bad in [(4, 5, 1), (4, 2, 0), (4, 2, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


def test_curve_points_and_monotone() -> None:
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6] and ks_for(1) == [1]
    curve = pass_at_k_curve([8, 8, 8], [0, 1, 4])
    assert list(curve) == [1, 2, 4, 8]
    assert curve[1] == pytest.approx((0 + 1 / 8 + 4 / 8) / 3)
    assert all(a <= b for a, b in zip(curve.values(), list(curve.values())[1:]))
    assert curve[8] == pytest.approx(2 / 3)


def test_majority_and_maj_at_k() -> None:
    assert majority(["3", None, "4", "4", "3"]) == "3"  # tie: first seen
    assert majority([None, None]) is None
    answers = ["5", "5", "6", None]
    ok = lambda a: a == "5"  # noqa: E731
    brute = [majority([answers[i] for i in s]) == "5" for s in itertools.combinations(range(4), 3)]
    assert maj_at_k(answers, ok, 3) == pytest.approx(sum(brute) / len(brute))
    assert maj_at_k(answers, ok, 4) == 1.0
    assert maj_at_k(answers, ok, 1) == pytest.approx(2 / 4)
    # many subsets: sampled with a seed, deterministic
    many = ["1"] * 10 + ["2"] * 10
    assert maj_at_k(many, lambda a: a == "1", 9, max_subsets=50, seed=3) == maj_at_k(
        many, lambda a: a == "1", 9, max_subsets=50, seed=3)


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_more_tasks() -> None:
    rng = np.random.default_rng(0)
    small = rng.random(20)
    big = rng.random(2000)
    lo, hi = bootstrap_ci(small)
    assert lo <= small.mean() <= hi
    lo2, hi2 = bootstrap_ci(big)
    assert hi2 - lo2 < hi - lo
    assert bootstrap_ci([0.5]) == (0.5, 0.5)
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_paired_difference_flags_a_real_regression_only() -> None:
    a = [1.0] * 40 + [0.0] * 10
    b = [0.0] * 20 + [1.0] * 20 + [0.0] * 10   # 20 tasks lost
    d, lo, hi = diff_ci(a, b)
    assert d == pytest.approx(-0.4) and hi < 0
    d, lo, hi = diff_ci(a, a)
    assert d == 0 and lo <= 0 <= hi
    with pytest.raises(ValueError, match="same tasks"):
        diff_ci([1.0], [1.0, 0.0])


def test_heldout_deltas_pairs_stages_over_shared_tasks() -> None:
    from honing.eval.metrics import diff_ci, heldout_deltas

    before = {"per_task_pass@1": {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}}
    sft = {"per_task_pass@1": {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0}}
    after = {"per_task_pass@1": {"a": 1.0, "b": 1.0, "c": 1.0}}  # task d missing: pairs use a, b, c
    out = heldout_deltas({"before": before, "after_sft": sft, "after": after, "skipped": None})
    assert out["pass@1"]["before"][0] == 0.25 and out["pass@1"]["after_sft"][0] == 0.75
    assert set(out["delta"]) == {"after_sft-before", "after-before", "after-after_sft"}
    d, lo, hi = diff_ci([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
    assert out["delta"]["after-after_sft"] == [round(d, 6), round(lo, 6), round(hi, 6)]
    assert out["delta"]["after_sft-before"][0] == 0.5
    assert heldout_deltas({"before": {"pass@1": 0.1}}) == {"pass@1": {}, "delta": {}}


def test_heldout_deltas_also_pair_the_mean_reward_where_stages_have_it() -> None:
    """Partial credit (CAD's geometry layers) moves while pass@1 stays 0: the reward gets its own paired CI."""
    from honing.eval.metrics import bootstrap_ci, diff_ci, heldout_deltas

    zeros = {t: 0.0 for t in "abcd"}
    before = {"per_task_pass@1": zeros, "per_task_reward": zeros}
    after = {"per_task_pass@1": zeros, "per_task_reward": {"a": 0.3, "b": 0.2, "c": 0.4, "d": 0.1}}
    out = heldout_deltas({"before": before, "after": after})
    assert out["delta"]["after-before"] == [0.0, 0.0, 0.0]
    lo, hi = bootstrap_ci([0.3, 0.2, 0.4, 0.1])
    assert out["mean_reward"]["after"] == [0.25, round(lo, 6), round(hi, 6)]
    d, lo, hi = diff_ci([0.0] * 4, [0.3, 0.2, 0.4, 0.1])
    assert out["reward_delta"]["after-before"] == [0.25, round(lo, 6), round(hi, 6)] and lo > 0
    # a stage from before per-task rewards were kept (an old run's summary) has pass@1 only
    old = heldout_deltas({"before": {"per_task_pass@1": zeros}, "after": {"per_task_pass@1": zeros}})
    assert set(old) == {"pass@1", "delta"}


def test_end_of_run_lines_show_reward_cis_only_when_present() -> None:
    from honing.cli import _ci_lines

    ci = {"pass@1": {"before": [0.0, 0.0, 0.0]}, "delta": {"after-before": [0.0, 0.0, 0.0]}}
    assert [ln.split()[0] for ln in _ci_lines(ci)] == ["pass@1", "paired"]
    ci.update({"mean_reward": {"after": [0.25, 0.15, 0.35]}, "reward_delta": {"after-before": [0.25, 0.1, 0.4]}})
    lines = _ci_lines(ci)
    assert lines[2] == "reward 95% CI   after 0.250 [0.150, 0.350]"
    assert lines[3] == "reward delta    after-before +0.250 [+0.100, +0.400]"


def test_end_of_run_lines_show_what_multi_turn_episodes_did_at_each_evaluation() -> None:
    from honing.cli import _behaviour_lines

    def beh(valid: float, ran: float, after: float | None) -> dict:
        return {"per_domain_behaviour": {"repair": {"valid_tool_call": valid, "ran_tests": ran,
                                                    "passed_after_failing_tests": after}, "finance": None}}

    summary = {"heldout_before": beh(0.0, 0.0, None), "heldout_after_sft": beh(1.0, 0.9, 0.2),
               "heldout_after": beh(1.0, 0.95, 0.25)}
    assert _behaviour_lines(summary) == [
        "repair episodes valid tool call 0.00 -> 1.00 -> 1.00  ran tests 0.00 -> 0.90 -> 0.95  "
        "passed after a failing test run - -> 0.20 -> 0.25"]
    assert _behaviour_lines({"heldout_before": {"pass@1": 0.5}, "heldout_after": {"pass@1": 0.6}}) == []


def naive_cluster_ci(values: list[float], labels: list[str], n_boot: int = 4000, seed: int = 1) -> tuple[float, float]:
    """Two-stage cluster bootstrap written out with plain loops: clusters with replacement, then
    members within each drawn cluster; the statistic is the mean over all drawn members."""
    rng = np.random.default_rng(seed)
    groups: dict[str, list[float]] = {}
    for v, c in zip(values, labels):
        groups.setdefault(c, []).append(v)
    keys = list(groups)
    means = []
    for _ in range(n_boot):
        drawn: list[float] = []
        for _ in keys:
            g = groups[keys[int(rng.integers(len(keys)))]]
            drawn += [g[int(rng.integers(len(g)))] for _ in g]
        means.append(sum(drawn) / len(drawn))
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def test_clustered_ci_matches_a_naive_two_stage_bootstrap_and_is_wider_for_correlated_tasks() -> None:
    """8 structures x 4 tasks whose answers agree within a structure: the tasks carry 8 draws' worth
    of information, not 32, and the clustered interval says so."""
    rng = np.random.default_rng(5)
    per_structure = rng.random(8) < 0.5
    vals = [float(x) for x in np.repeat(per_structure, 4)]
    labels = [f"s{i // 4}" for i in range(32)]
    lo, hi = bootstrap_ci(vals, n_boot=4000, clusters=labels)
    nlo, nhi = naive_cluster_ci(vals, labels)
    assert lo == pytest.approx(nlo, abs=0.04) and hi == pytest.approx(nhi, abs=0.04)
    plo, phi = bootstrap_ci(vals, n_boot=4000)
    assert (hi - lo) > 1.6 * (phi - plo)  # ~sqrt(4) wider
    # every label distinct: exactly the plain bootstrap
    assert bootstrap_ci(vals, clusters=[str(i) for i in range(32)]) == bootstrap_ci(vals)
    with pytest.raises(ValueError, match="3 labels for 32 values"):
        bootstrap_ci(vals, clusters=["a", "b", "c"])


def test_heldout_deltas_cluster_by_recorded_structure() -> None:
    from honing.eval.metrics import heldout_deltas

    ids = [f"t{i}" for i in range(32)]
    before = {"per_task_pass@1": {t: 1.0 for t in ids}}
    after = {"per_task_pass@1": {t: 0.0 if i < 8 else 1.0 for i, t in enumerate(ids)}}  # 2 structures of 8 fail
    plain = heldout_deltas({"before": before, "after": after})["delta"]["after-before"]
    labels = {t: f"s{i // 4}" for i, t in enumerate(ids)}
    clustered = heldout_deltas({"before": dict(before, per_task_cluster=labels), "after": after})["delta"]["after-before"]
    assert plain[0] == clustered[0] == -0.25
    assert plain[2] < 0 and clustered[1] < plain[1]  # the same drop, a wider interval


def _two_domain_stages() -> dict:
    """before/after over 8 finance tasks (after: all fail that passed) and 8 code tasks (after: all pass)."""
    fin, code = [f"f{i}" for i in range(8)], [f"c{i}" for i in range(8)]
    dom = {**{t: "finance" for t in fin}, **{t: "code" for t in code}}
    before = {"per_task_pass@1": {**{t: 1.0 for t in fin}, **{t: 0.0 for t in code}}, "per_task_domain": dom}
    after = {"per_task_pass@1": {**{t: 0.0 for t in fin[:6]}, **{t: 1.0 for t in fin[6:]},
                                 **{t: 1.0 for t in code}}, "per_task_domain": dom}
    return {"before": before, "after": after}


def test_heldout_deltas_split_by_domain_equal_each_domain_evaluated_alone() -> None:
    from honing.eval.metrics import heldout_deltas

    stages = _two_domain_stages()
    out = heldout_deltas(stages)
    assert out["pass@1"]["before"][0] == 0.5 and out["pass@1"]["after"][0] == 0.625  # overall unchanged
    assert set(out["per_domain"]) == {"code", "finance"}
    for d, c in out["per_domain"].items():
        alone = {k: {"per_task_pass@1": {t: x for t, x in v["per_task_pass@1"].items() if v["per_task_domain"][t] == d}}
                 for k, v in stages.items()}
        assert {k: c[k] for k in ("pass@1", "delta")} == heldout_deltas(alone)
        assert c["tasks"] == c["units"] == 8
    assert out["per_domain"]["finance"]["delta"]["after-before"][0] == -0.75
    # one domain: nothing to split
    one = {k: dict(v, per_task_domain={t: "finance" for t in v["per_task_domain"]}) for k, v in stages.items()}
    assert "per_domain" not in heldout_deltas(one)


def test_domain_rows_flag_a_regression_only_over_enough_units() -> None:
    from honing.cli import _domain_lines
    from honing.eval.metrics import MIN_UNITS, domain_rows, heldout_deltas

    rows = {r["domain"]: r for r in domain_rows(heldout_deltas(_two_domain_stages()))}
    assert rows["finance"]["regressed"] and not rows["code"]["regressed"]
    assert list(rows["finance"]["changes"]) == ["after-before"]
    lines = _domain_lines(heldout_deltas(_two_domain_stages()))
    assert len(lines) == 3 and "REGRESSED" in next(ln for ln in lines if "finance" in ln)
    assert "REGRESSED" not in next(ln for ln in lines if "code" in ln)
    # the same drop on tasks of too few structures is shown, not called a regression
    stages = _two_domain_stages()
    stages["before"]["per_task_cluster"] = {f"f{i}": f"s{i % (MIN_UNITS - 1)}" for i in range(8)}
    rows = {r["domain"]: r for r in domain_rows(heldout_deltas(stages))}
    assert rows["finance"]["units"] == MIN_UNITS - 1 and not rows["finance"]["regressed"]
    assert rows["finance"]["changes"]["after-before"][0] == -0.75
    assert domain_rows(heldout_deltas({"before": {"per_task_pass@1": {"a": 1.0}}})) == [] and _domain_lines({}) == []


def test_domain_rows_change_against_first_and_previous_stage() -> None:
    from honing.eval.metrics import domain_rows, heldout_deltas

    stages = _two_domain_stages()
    stages = {"before": stages["before"], "after_sft": stages["after"], "after": stages["after"]}
    rows = domain_rows(heldout_deltas(stages))
    assert all(list(r["changes"]) == ["after-after_sft", "after-before"] for r in rows)
    assert all(list(r["pass@1"]) == ["before", "after_sft", "after"] for r in rows)
