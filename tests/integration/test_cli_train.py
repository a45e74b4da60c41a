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
