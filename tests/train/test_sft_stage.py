"""The SFT stage as a run (`honing sft` = the stage alone): a killed stage resumes exactly from its
saved progress; LoRA SFT is merged into the weights that RL and the checkpoint start from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from honing import api
import honing.train.sft as sft_mod

QUICK = ["train.steps=0", "sft.steps=9", "sft.batch_size=8", "sft.tasks=32", "eval.heldout_tasks=4",
         "sft.checkpoint_every=3"]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "sft" / "model.safetensors")


def _at_sft_step(monkeypatch: pytest.MonkeyPatch, n: int, action) -> None:  # noqa: ANN001
    """Run `action()` when SFT step `n` (1-based) starts, by wrapping the batch-loss function."""
    real, calls = sft_mod._batch_losses, {"n": 0}

    def wrapped(*args, **kw):  # noqa: ANN002, ANN003
        calls["n"] += 1
        if calls["n"] == n:
            action()
        return real(*args, **kw)

    monkeypatch.setattr(sft_mod, "_batch_losses", wrapped)


def _kill() -> None:
    raise KeyboardInterrupt("killed")


def test_killed_sft_stage_resumes_to_the_same_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    api.train("smoke", QUICK, out=a)
    real = sft_mod._batch_losses
    _at_sft_step(monkeypatch, 8, _kill)
    with pytest.raises(KeyboardInterrupt):
        api.train("smoke", QUICK, out=b)
    assert torch.load(b / "sft-progress" / "state.pt", weights_only=False)["step"] == 6
    monkeypatch.setattr(sft_mod, "_batch_losses", real)
    summary = api.train(b / "config.yaml", out=b, resume=True)
    assert summary["sft"]["resumed_at"] == 6 and len(summary["sft"]["losses"]) == 3
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not (b / "sft-progress").exists()
    demos = [json.loads(x) for x in (b / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 32 and all(d["status"] == "kept" and d["source"] == "reference" for d in demos)


def test_a_stop_signal_in_the_sft_stage_saves_progress_and_resume_matches(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    from honing.schedule.loop import StoppedEarly

    quick = [q for q in QUICK if not q.startswith("sft.checkpoint_every")]  # no periodic progress: the stop saves it
    a, b = tmp_path / "a", tmp_path / "b"
    api.train("smoke", quick, out=a)
    real = sft_mod._batch_losses
    # the run's own handler: finish this step, save, stop
    _at_sft_step(monkeypatch, 5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(StoppedEarly, match="SIGTERM in the SFT stage"):
        api.train("smoke", quick, out=b)
    assert torch.load(b / "sft-progress" / "state.pt", weights_only=False)["step"] == 5
    assert not (b / "checkpoints" / "sft").exists()
    monkeypatch.setattr(sft_mod, "_batch_losses", real)
    summary = api.train(b / "config.yaml", out=b, resume=True)
    assert summary["sft"]["resumed_at"] == 5 and len(summary["sft"]["losses"]) == 4
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_lora_sft_is_merged_into_the_checkpoint(tmp_path: Path) -> None:
    from honing.models import load_policy

    api.train("smoke", [*QUICK[:-1], "sft.lora=true", "sft.learning_rate=1e-2"], out=tmp_path / "r")
    w = _weights(tmp_path / "r")
    assert not any("lora" in k for k in w)  # a plain model: the adapters are folded in
    base, _ = load_policy("tiny-random")
    moved = [k for k, v in base.state_dict().items() if k in w and not torch.equal(v, w[k])]
    assert moved and all(any(t in k for t in ("q_proj", "v_proj", "k_proj", "o_proj", "proj")) for k in moved)


def test_killed_in_the_evaluation_after_sft_resumes_at_that_evaluation(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from honing.schedule import loop

    real = loop.Run.evaluate
    labels: list[str] = []
    first: dict = {}

    def dies_after_sft(self, step, label):  # noqa: ANN001
        labels.append(label)
        if label == "after SFT":
            raise KeyboardInterrupt("killed")
        res = real(self, step, label)
        first[label] = res[0]
        return res

    def counted(self, step, label):  # noqa: ANN001
        labels.append(label)
        return real(self, step, label)

    monkeypatch.setattr(loop.Run, "evaluate", dies_after_sft)
    with pytest.raises(KeyboardInterrupt):
        api.train("smoke", QUICK, out=tmp_path / "r")
    assert (tmp_path / "r" / "sft-progress" / "before.json").is_file()
    monkeypatch.setattr(loop.Run, "evaluate", counted)
    labels.clear()
    summary = api.train(tmp_path / "r" / "config.yaml", out=tmp_path / "r", resume=True)
    assert summary["sft"]["resumed_at"] == 9 and summary["sft"]["losses"] == []  # no SFT step run twice
    assert labels == ["after SFT"]  # the evaluation before SFT is not decoded again
    b = summary["heldout_before"]
    assert b["pass@1"] == first["before"]["pass@1"] and b["per_task_pass@1"] == first["before"]["per_task_pass@1"]
    assert summary["heldout_after_sft"] is not None and (tmp_path / "r" / "checkpoints" / "sft").is_dir()
    assert not (tmp_path / "r" / "sft-progress").exists()
    fresh = api.train("smoke", QUICK, out=tmp_path / "r")  # a fresh run in the same folder evaluates anew
    assert labels[-2:] == ["before", "after SFT"] and fresh["heldout_before"]["pass@1"] == b["pass@1"]
