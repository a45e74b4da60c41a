"""`honing train` through the real console script, and the LoRA path end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from honing.config import load_config
from honing.schedule.loop import train

HONING = Path(sys.executable).parent / "honing"
QUICK = ["train.steps=2", "sft.steps=0", "eval.heldout_tasks=4", "tasks.prompts_per_step=2",
         "tasks.samples_per_prompt=4"]


@pytest.mark.slow
def test_cli_train_prints_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "HONING_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(HONING), "train", "--config", "smoke", "--out", str(out), *QUICK],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pass@1" in proc.stdout and "->" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    assert f"{summary['heldout_after']['pass@1']:.3f}" in proc.stdout


@pytest.mark.slow
def test_lora_run_saves_adapter_and_merged_model(tmp_path: Path) -> None:
    cfg, _ = load_config("smoke", [*QUICK, "model.lora.enabled=true", "model.lora.r=4", "train.learning_rate=1e-2"])
    run_dir = tmp_path / "lora"
    summary = train(cfg, run_dir, show_progress=False)
    final = run_dir / "checkpoints" / "final"
    assert (final / "adapter" / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(final)  # merged: plain transformers, no peft
    assert not any("lora" in name for name, _ in model.named_parameters())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("train/active_seqs", 0) > 0 for r in rows), "no LoRA update happened"
    assert summary["steps"] == 2


@pytest.mark.slow
def test_mixed_domains_with_layered_reward_and_sandboxed_code(tmp_path: Path) -> None:
    """Arithmetic and code tasks in one run: code is graded in the bwrap sandbox, the reward is
    the configured layers minus the overlong penalty, and each layer is logged per domain."""
    from honing.sandbox.bwrap import find_bwrap

    try:
        find_bwrap()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"bwrap unavailable: {e}")
    cfg, _ = load_config("smoke", [
        *QUICK, "eval.heldout_tasks=0", "generation.max_new_tokens=12",
        "tasks.sources=[{name: 'gym:basic_arithmetic', params: {min_digits: 1, max_digits: 1}},"
        " {name: 'code:functions', params: {tiers: [1]}}]",
        "reward.layers=[{name: format, weight: 0.1, component: format}, {name: execution, weight: 0.9}]",
        "reward.penalties=[{name: long, kind: overlong, buffer_tokens: 4}]",
        "sandbox.max_concurrency=2",
    ])
    run_dir = tmp_path / "mixed"
    train(cfg, run_dir, show_progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward" in r]
    assert len(steps) == 2 and all(r["rollout/infra_errors"] == 0 and r["rollout/drops"] == 0 for r in steps)
    keys = set().union(*steps)
    domains = {k.split("/")[1] for k in keys if k.startswith("reward/")}
    assert domains, keys
    for d in domains:
        assert {f"reward/{d}/format", f"reward/{d}/execution", f"reward/{d}/penalty/long",
                f"reward/{d}/total"} <= keys, sorted(keys)
    assert "code" in domains or "code:functions" in domains or any("code" in d for d in domains), domains


@pytest.mark.slow
def test_multiturn_repair_tasks_train_and_evaluate_in_the_loop(tmp_path: Path) -> None:
    """Repair tasks (multi-turn, tools in a sandbox session) mixed with single-turn arithmetic:
    both are rolled out, graded and evaluated in one run."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    cfg, _ = load_config("smoke", [
        *QUICK, "eval.heldout_tasks=4", "generation.max_new_tokens=16", "tasks.samples_per_prompt=2",
        "tasks.sources=[{name: repair, params: {levels: [1]}}, {name: 'gym:basic_arithmetic'}]",
        "rollout.max_turns=2", "rollout.context_tokens=4096",
    ])
    run_dir = tmp_path / "repair"
    summary = train(cfg, run_dir, show_progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward" in r]
    assert len(steps) == 2 and all(r["rollout/infra_errors"] == 0 and r["rollout/drops"] == 0 for r in steps)
    assert any("reward/repair/total" in r for r in steps)
    assert "repair" in summary["heldout_after"]["per_domain_pass@1"]
    assert summary["heldout_after"]["infra_errors"] == 0
    # held-out per domain with CIs: every evaluated task in exactly one domain's block
    per_domain = summary["heldout_ci"]["per_domain"]
    assert set(per_domain) == set(summary["heldout_after"]["per_domain_pass@1"]) and len(per_domain) == 2
    assert sum(c["tasks"] for c in per_domain.values()) == summary["heldout_after"]["n_tasks"]
    assert all("after-before" in c["delta"] for c in per_domain.values())


def test_informative_groups_drops_groups_without_signal() -> None:
    from honing.rollout.types import Trajectory
    from honing.schedule.loop import informative_groups

    def tr(r: float) -> Trajectory:
        t = Trajectory("t", "d", (1,), (2,), (0.0,), "", "stop", 0)
        t.reward = r
        return t

    trajs = [tr(r) for r in (1, 1, 1, 0, 1, 0, 0, 0, 0.5, 0.5)]  # groups of 2
    kept, dropped = informative_groups(trajs, 2)
    assert [t.reward for t in kept] == [1, 0, 1, 0] and dropped == 3


@pytest.mark.slow
def test_dynamic_sampling_refills_the_step_with_informative_groups(tmp_path: Path) -> None:
    cfg, _ = load_config("smoke", [*QUICK, "eval.heldout_tasks=0", "train.dynamic_sampling=true", "sft.steps=100",
                                   "train.dynamic_sampling_max_rounds=4", "tasks.prompts_per_step=4"])
    run_dir = tmp_path / "dyn"
    train(cfg, run_dir, show_progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "sched/refill_rounds" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["sched/refill_rounds"] <= 4 and r["train/groups"] <= 4
        # every group trained on has reward variance, so every trained sequence has an advantage
        assert r["train/active_seqs"] == r["train/groups"] * 4
        # a short step was refilled (or ran out of rounds)
        assert r["train/groups"] == 4 or r["sched/refill_rounds"] == 4
    assert sum(r["train/groups"] for r in steps) > 0  # after SFT some groups do have signal
    assert sum(r["sched/dropped_no_signal"] for r in steps) > 0


def test_startup_contamination_guard_warns_or_fails(tmp_path: Path) -> None:
    """1-digit addition with exclude_heldout_questions=false trains on the held-out questions
    themselves: the start-up guard must say so, and refuse to start when told to fail."""
    from honing.errors import ConfigError
    from honing.schedule.loop import build_tasks, check_heldout_overlap

    cfg, _ = load_config("smoke", ["eval.heldout_tasks=16"])
    assert "contaminat" in (check_heldout_overlap(cfg, build_tasks(cfg)) or "")
    cfg, _ = load_config("smoke", ["eval.heldout_tasks=16", "eval.contamination.mode=fail"])
    with pytest.raises(ConfigError):
        check_heldout_overlap(cfg, build_tasks(cfg))
    cfg, _ = load_config("smoke", ["eval.heldout_tasks=16", "tasks.exclude_heldout_questions=true"])
    assert check_heldout_overlap(cfg, build_tasks(cfg)) is None


@pytest.mark.slow
def test_run_survives_a_sandbox_that_fails_and_hangs(tmp_path: Path) -> None:
    """Fault injection in the loop: a sandbox that fails 10% of calls and hangs 2% past the job
    deadline. The run completes, failed jobs are retried, nothing it trained on carries an
    infrastructure error, and per step the jobs add up to groups trained on plus jobs dropped."""
    import shutil

    from honing.schedule.trajstore import read_shard

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    cfg, _ = load_config("smoke", [
        *QUICK, "train.steps=3", "eval.heldout_tasks=0", "generation.max_new_tokens=12", "tasks.prompts_per_step=8",
        "tasks.sources=[{name: 'code:functions', params: {tiers: [1]}}]",
        "sandbox.backend=faulty:bwrap:fail=0.1,hang=0.02,hang_s=6,seed=3",
        "schedule.orchestration.job_deadline_s=3", "schedule.orchestration.backoff_s=0.01",
        "schedule.orchestration.max_retries=4", "verify.max_infra_error_frac=0.5",
    ])
    run_dir = tmp_path / "faulty"
    train(cfg, run_dir, show_progress=False)
    steps = [r for r in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines())
             if "train/reward" in r]
    assert len(steps) == 3
    assert sum(r["rollout/infra_errors"] for r in steps) > 0 and sum(r["rollout/retries"] for r in steps) > 0
    for r in steps:
        assert r["rollout/jobs"] == r["train/groups"] + r["rollout/drops"] == 8
        assert r["rollout/attempts"] == r["rollout/jobs"] + r["rollout/retries"]
    for shard in (run_dir / "trajectories").glob("*.parquet"):
        for t in read_shard(shard):
            assert t.verdict is not None and not t.verdict.infra_error, t.verdict
