"""`honing eval compare`: paired per-domain deltas, significance flags, the CLI table and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from honing.eval.compare import compare
from honing.eval.metrics import pass_at_k

HONING = Path(sys.executable).parent / "honing"


def fake_eval(correct: dict[str, list[int]], n: int = 4, suite: str = "s") -> dict:
    tasks = [{"id": f"{d}/{i}", "domain": d, "n": n, "correct": c, "pass@1": c / n,
              f"pass@{n}": pass_at_k(n, c, n), f"maj@{n}": float(c > n / 2)}
             for d, cs in correct.items() for i, c in enumerate(cs)]
    return {"tasks": tasks, "domains": {d: {} for d in correct},
            "meta": {"suite": suite, "suite_version": 1, "samples_per_task": n}}


def test_regression_flagged_improvement_flagged_noise_not() -> None:
    a = fake_eval({"math": [4] * 30, "code": [1, 2] * 15, "same": [2, 3] * 15})
    b = fake_eval({"math": [0] * 30, "code": [4, 4] * 15, "same": [3, 2] * 15})
    c = compare(a, b)
    assert ("math", "pass@1") in c["regressions"] and ("code", "pass@1") in c["improvements"]
    assert not any(d == "same" for d, _ in c["regressions"] + c["improvements"])
    m = c["domains"]["math"]["pass@1"]
    assert m["delta"] == -1.0 and m["hi"] < 0 and m["significant"]
    same = c["domains"]["same"]["pass@1"]
    assert same["delta"] == 0.0 and same["lo"] < 0 < same["hi"]
    assert c["domains"]["all"]["n_tasks"] == 90


def test_pairs_only_shared_tasks_and_warns() -> None:
    a = fake_eval({"math": [4, 4, 4]})
    b = fake_eval({"math": [4, 4]}, suite="other")
    c = compare(a, b)
    assert c["shared_tasks"] == 2 and c["domains"]["math"]["pass@1"]["n"] == 2
    assert any("one side only" in w for w in c["warnings"]) and any("different suites" in w for w in c["warnings"])


def test_cli_compare_prints_table_and_fails_on_regression(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(fake_eval({"math": [4] * 20, "code": [2] * 20})))
    b.write_text(json.dumps(fake_eval({"math": [1] * 20, "code": [2] * 20})))
    env = {**os.environ, "NO_COLOR": "1"}
    p = subprocess.run([str(HONING), "eval", "compare", str(a), str(b)], capture_output=True, text=True, env=env)
    assert p.returncode == 1, p.stderr
    assert "REGRESSION" in p.stdout and "math" in p.stdout and "-0.750" in p.stdout
    p = subprocess.run([str(HONING), "eval", "--compare", str(a), str(a)], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "REGRESSION" not in p.stdout
    p = subprocess.run([str(HONING), "eval", "compare", str(a), str(tmp_path / "nope.json")], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 2 and "evaluation file not found" in p.stderr


def test_tasks_of_one_structure_are_resampled_together() -> None:
    """24 tasks from 6 structures; 2 structures (8 tasks) go from pass to fail. Per task that looks
    significant; structure by structure it is 2 of 6 and the interval reaches 0."""
    a = fake_eval({"code": [4] * 24})
    b = fake_eval({"code": [0] * 8 + [4] * 16})
    plain = compare(a, b)["domains"]["code"]["pass@1"]
    for side in (a, b):
        for i, row in enumerate(side["tasks"]):
            row["structure"] = f"s{i // 4}"
    clustered = compare(a, b)["domains"]["code"]["pass@1"]
    assert plain["delta"] == clustered["delta"] == -1 / 3
    assert plain["hi"] < 0 and plain["significant"]
    assert clustered["lo"] < plain["lo"] and clustered["hi"] == 0.0 and not clustered["significant"]


def test_mean_reward_is_compared_where_pass_at_k_cannot_move() -> None:
    """A partial-credit domain (CAD) where no sample passes on either side: pass@1 and pass@k show no
    change, the mean reward does, with its own paired CI; a drop in it is a regression like any other."""
    a, b = fake_eval({"cad": [0] * 24}), fake_eval({"cad": [0] * 24})
    for i, (ra, rb) in enumerate(zip(a["tasks"], b["tasks"])):
        ra["mean_reward"], rb["mean_reward"] = 0.05 * (i % 3), 0.3 + 0.05 * (i % 3)
    up = compare(a, b)
    assert up["domains"]["cad"]["pass@1"]["delta"] == 0.0 and not up["domains"]["cad"]["pass@1"]["significant"]
    r = up["domains"]["cad"]["mean_reward"]
    assert abs(r["delta"] - 0.3) < 1e-9 and 0 < r["lo"] <= r["hi"] and ("cad", "mean_reward") in up["improvements"]
    down = compare(b, a)
    assert ("cad", "mean_reward") in down["regressions"]
    no_reward = compare(fake_eval({"math": [2] * 10}), fake_eval({"math": [2] * 10}))
    assert "mean_reward" not in no_reward["domains"]["math"]  # old evaluation files without it still compare


def test_a_domain_of_too_few_tasks_is_never_called_significant() -> None:
    """One task (or four) that drops from 4/4 to 0/4 has a zero-width (or crude) bootstrap interval:
    shown with its delta and named in a warning, never a regression; at MIN_UNITS tasks it is one."""
    from honing.eval.compare import MIN_UNITS

    small = compare(fake_eval({"solo": [4], "few": [4] * (MIN_UNITS - 1)}),
                    fake_eval({"solo": [0], "few": [0] * (MIN_UNITS - 1)}))
    for d in ("solo", "few"):
        cell = small["domains"][d]["pass@1"]
        assert cell["delta"] == -1.0 and cell["hi"] < 0 and not cell["significant"]
        assert small["domains"][d]["too_few"] and any(w.startswith(f"{d}:") for w in small["warnings"])
    assert small["regressions"] == []
    enough = compare(fake_eval({"d": [4] * MIN_UNITS}), fake_eval({"d": [0] * MIN_UNITS}))
    assert ("d", "pass@1") in enough["regressions"] and not enough["domains"]["d"]["too_few"]
