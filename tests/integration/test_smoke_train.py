"""The closed loop end to end on the tiny in-code model: it must actually learn."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from honing.config import load_config
from honing.schedule.loop import train


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    cfg, _ = load_config("smoke")
    summary = train(cfg, run_dir, show_progress=False)
    return cfg, run_dir, summary


@pytest.mark.slow
def test_heldout_reward_rises(smoke_run: tuple) -> None:
    _, _, s = smoke_run
    before, after_sft, after = s["heldout_before"], s["heldout_after_sft"], s["heldout_after"]
    assert before["mean_reward"] < 0.3 and before["pass@1"] < 0.3
    assert after["mean_reward"] > 0.7 and after["pass@1"] > 0.7, s
    # RL, not only the SFT warm start, moved the model (after SFT 0.25 on the machine this was first tuned on,
    # 0.59 on an AVX2-only EPYC, where RL took it to 0.72: tiny-model training is chaotic under float rounding).
    assert after["pass@1"] >= after_sft["pass@1"] + 0.1, s


@pytest.mark.slow
def test_run_directory_contents(smoke_run: tuple) -> None:
    cfg, run_dir, s = smoke_run
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints/final/model.safetensors",
                 "checkpoints/final/trainer_state.pt", "checkpoints/final/manifest.json"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward" in r]
    assert [r["step"] for r in steps] == list(range(1, cfg.train.steps + 1))
    for key in ("train/loss", "train/grad_norm", "train/logprob_mismatch", "train/clip_frac", "time/step_s"):
        assert all(key in r for r in steps), key
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["steps"] == cfg.train.steps
    for k in ("heldout_before", "heldout_after"):
        assert set(on_disk[k]) >= {"pass@1", "mean_reward"}
    assert on_disk["wall_s"] > 0 and on_disk["samples_per_s"] > 0
    assert not list(run_dir.rglob(".*.tmp-*")), "temporary files left behind"


@pytest.mark.slow
def test_checkpoint_loads_with_plain_transformers(smoke_run: tuple) -> None:
    _, run_dir, _ = smoke_run
    ckpt = run_dir / "checkpoints" / "final"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok.apply_chat_template([{"role": "user", "content": "Calculate 2 + 3."}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert state["global_step"] == state["step"] > 0 and "optimizer" in state
