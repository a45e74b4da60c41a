"""`eval.reuse_before`: a run reuses the held-out evaluation of its initial policy from an earlier run
only when the weights, the tasks, the settings and the code all match (eval/before_cache.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from honing import api
from honing.eval import before_cache
from honing.models import load_policy
from honing.schedule import loop

RUN = ["train.steps=0", "sft.steps=0", "eval.heldout_tasks=8", "eval.reuse_before=true"]


@pytest.fixture
def labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The labels of the held-out evaluations the runs decode, with a private $HONING_HOME."""
    monkeypatch.setenv("HONING_HOME", str(tmp_path / "home"))
    real, seen = loop.Run.evaluate, []

    def counted(self, step, label):  # noqa: ANN001
        seen.append(label)
        return real(self, step, label)

    monkeypatch.setattr(loop.Run, "evaluate", counted)
    return seen


def test_the_same_run_again_reuses_the_evaluation_before(tmp_path: Path, labels: list[str]) -> None:
    a = api.train("smoke", RUN, out=tmp_path / "a")
    assert labels == ["before", "after"] and a["heldout_before"]["reused_from"] is None
    assert len(list((tmp_path / "home" / "evals").glob("before-*.json"))) == 1
    labels.clear()
    b = api.train("smoke", RUN, out=tmp_path / "b")
    assert labels == ["after"]  # nothing decoded before training
    assert b["heldout_before"]["reused_from"] == str(tmp_path / "a")
    for k in ("pass@1", "mean_reward", "per_task_pass@1", "per_task_reward", "n_tasks"):
        assert b["heldout_before"][k] == a["heldout_before"][k], k
    assert b["heldout_ci"]["delta"] is not None  # the paired CI still has both sides, task by task


@pytest.mark.parametrize("change", ["generation.max_new_tokens=5", "eval.heldout_tasks=6", "seed=3",
                                    "model.name=tiny-random:1", "eval.temperature=0.5"])
def test_a_change_that_could_change_the_result_evaluates_again(tmp_path: Path, labels: list[str], change: str) -> None:
    api.train("smoke", RUN, out=tmp_path / "a")
    labels.clear()
    b = api.train("smoke", [*RUN, change], out=tmp_path / "b")
    assert labels == ["before", "after"] and b["heldout_before"]["reused_from"] is None, change
    # ... while settings that only affect training share the stored evaluation
    labels.clear()
    api.train("smoke", [*RUN, change, "train.learning_rate=0.5", "eval.every_steps=3"], out=tmp_path / "c")
    assert labels == ["after"], change


def test_the_key_covers_every_weight_and_the_code(tmp_path: Path) -> None:
    model, _ = load_policy("tiny-random")
    d0 = before_cache.weights_digest(model)
    with torch.no_grad():
        next(iter(model.parameters())).view(-1)[7] += 1e-3
    assert before_cache.weights_digest(model) != d0
    f = tmp_path / "mine.py"
    f.write_text("X = 1\n")
    c0 = before_cache.code_digest([f])
    f.write_text("X = 2\n")
    assert before_cache.code_digest([f]) != c0
    assert Path(before_cache.__file__).resolve() in before_cache.code_files([])


def test_a_damaged_or_foreign_entry_is_not_reused(tmp_path: Path, labels: list[str]) -> None:
    api.train("smoke", RUN, out=tmp_path / "a")
    (entry,) = (tmp_path / "home" / "evals").glob("before-*.json")
    entry.write_text(entry.read_text()[:-20])  # cut short
    labels.clear()
    api.train("smoke", RUN, out=tmp_path / "b")
    assert labels == ["before", "after"]  # evaluated again, and stored again
    text = entry.read_text()
    entry.write_text(text.replace('"key": "', '"key": "0', 1))  # an entry for another key at this path
    labels.clear()
    api.train("smoke", RUN, out=tmp_path / "c")
    assert labels == ["before", "after"]
