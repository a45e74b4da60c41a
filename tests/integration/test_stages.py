"""A staged recipe (`stages:`): sft -> rl -> rejection -> rl on the tiny model, each stage a whole run
started from the previous stage's final weights; resume skips finished stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from honing.config import load_config
from honing.errors import ConfigError
from honing.schedule.stages import check_stages, stage_table
from honing.train.demos import read_demos

STAGES = [
    "stages=[{name: warm, kind: sft},"
    " {name: rl1, kind: rl, set: {train.steps: 12}},"
    " {name: rft, kind: sft, set: {sft.source: rejection, sft.steps: 8, sft.tasks: 24, sft.samples: 4}},"
    " {name: rl2, kind: rl, set: {train.steps: 4}}]",
    "tasks.prompts_per_step=8", "eval.heldout_tasks=16", "sft.steps=120",
]


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from honing import api

    run_dir = tmp_path_factory.mktemp("staged") / "run"
    cfg, _ = load_config("smoke", STAGES)
    summary = api.train(cfg, out=run_dir)
    return cfg, run_dir, summary


def _dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "stages").iterdir())


@pytest.mark.slow
def test_each_stage_starts_from_the_previous_weights(staged: tuple) -> None:
    cfg, run_dir, s = staged
    dirs = _dirs(run_dir)
    assert [d.name for d in dirs] == ["01-warm", "02-rl1", "03-rft", "04-rl2"]
    assert [r["kind"] for r in s["stages"]] == ["sft", "rl", "sft", "rl"]
    assert [r["steps"] for r in s["stages"]] == [120, 12, 8, 4]
    prev = None
    for d, row in zip(dirs, s["stages"]):
        c, _ = load_config(d / "config.yaml")
        assert c.stages == []
        assert c.model.name == (cfg.model.name if prev is None else prev)
        prev = row["final_checkpoint"]
        assert Path(prev).is_relative_to(d)
    # the rejection stage's weights differ from what the RL stage left (it trained), and RL's from SFT's
    w = [load_file(str(Path(r["final_checkpoint"]) / "model.safetensors")) for r in s["stages"]]
    for a, b in zip(w, w[1:]):
        assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_rejection_stage_keeps_only_verified_samples_of_the_rl_policy(staged: tuple) -> None:
    _, run_dir, _ = staged
    demos = read_demos(run_dir / "stages" / "03-rft" / "demos.jsonl")
    assert demos and {d.source for d in demos} == {"rejection"}
    kept = [d for d in demos if d.kept]
    assert kept, "no rejection sample passed"
    assert all(d.passed is True for d in kept)


@pytest.mark.slow
def test_stage_evaluations_chain_and_table(staged: tuple) -> None:
    _, run_dir, s = staged
    per_stage = [json.loads((d / "summary.json").read_text()) for d in _dirs(run_dir)]
    for a, b in zip(per_stage, per_stage[1:]):  # greedy: a stage's start is the previous stage's end
        assert b["heldout_before"]["pass@1"] == pytest.approx(a["heldout_after"]["pass@1"])
    assert s["heldout_before"] == per_stage[0]["heldout_before"]
    assert s["heldout_after"] == per_stage[-1]["heldout_after"]
    assert set(s["heldout_ci"]["pass@1"]) == {"before", "warm", "rl1", "rft", "rl2"}
    assert "rl2-rft" in s["heldout_ci"]["delta"] and "rl2-before" in s["heldout_ci"]["delta"]
    table = stage_table(s)
    assert len(table) == 6 and table[-1].startswith("rl2")


@pytest.mark.slow
def test_resume_skips_finished_stages_and_reruns_the_rest(staged: tuple) -> None:
    from honing import api

    cfg, run_dir, s = staged
    dirs = _dirs(run_dir)
    stamps = [(d / "summary.json").stat().st_mtime_ns for d in dirs]
    (dirs[-1] / "summary.json").unlink()  # the last stage "did not finish"
    again = api.train(load_config(run_dir / "config.yaml")[0], out=run_dir, resume=True)
    assert [(d / "summary.json").stat().st_mtime_ns for d in dirs[:-1]] == stamps[:-1]
    assert (dirs[-1] / "summary.json").exists()
    assert again["stages"][:-1] == s["stages"][:-1]


def test_bad_stage_names_the_stage_and_key() -> None:
    bad = "stages=[{name: a, kind: rl}, {name: b, kind: sft, set: {sft.sourse: rejection}}]"
    cfg, _ = load_config("smoke", [bad])
    with pytest.raises(ConfigError, match=r"stages\[1\] \(b\).*sourse"):
        check_stages(cfg)
    cfg, _ = load_config("smoke", ["stages=[{name: a, kind: rl}, {name: a, kind: rl}]"])
    with pytest.raises(ConfigError, match="repeated: a"):
        check_stages(cfg)
    cfg, _ = load_config("smoke", ["stages=[{name: r, kind: sft, set: {sft.steps: 0}}]"])
    with pytest.raises(ConfigError, match=r"stages\[0\] \(r\): kind sft needs sft.steps > 0"):
        check_stages(cfg)
