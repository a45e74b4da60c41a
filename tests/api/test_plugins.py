"""Every place a recipe names a part takes user code by reference: advantage estimators,
environment kinds, judge chat models, tools (verifiers and sources: tests/api/test_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from honing.config import TrainConfig
from honing.errors import ConfigError, HoningError
from honing.train.advantages import check_train_config, compute_advantages

CODE = '''
import torch

def centred(rewards, group_size):
    g = rewards.view(-1, group_size)
    return (g - g.mean(dim=1, keepdim=True)).view(-1)

def wrong_shape(rewards, group_size):
    return rewards[:1]

class EchoChat:
    def chat(self, messages, **kw):
        return "VERDICT: PASS"

def make_env(task):
    return ("env for", task)
'''


@pytest.fixture
def mod(tmp_path: Path) -> Path:
    p = tmp_path / "mine.py"
    p.write_text(CODE)
    return p


def test_user_advantage_estimator(mod: Path) -> None:
    cfg = TrainConfig(advantage_estimator=f"{mod}:centred")
    check_train_config(cfg, 4)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(compute_advantages(r, 4, cfg), torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    with pytest.raises(ConfigError, match="wrong_shape' returned"):
        check_train_config(TrainConfig(advantage_estimator=f"{mod}:wrong_shape"), 4)
    with pytest.raises(ConfigError, match="closest: centred"):
        check_train_config(TrainConfig(advantage_estimator=f"{mod}:centre"), 4)
    with pytest.raises(Exception, match="did you mean 'rloo'"):
        TrainConfig(advantage_estimator="rlooo")


def test_environment_kind_and_judge_and_tool_by_reference(mod: Path) -> None:
    from honing.engine.chat import make_chat
    from honing.rollout.env import make_environment
    from honing.rollout.tools import get_tools
    from honing.tasks import Task, VerifierSpec

    task = Task("t", "d", ({"role": "user", "content": "q"},), VerifierSpec("exact"), environment={"kind": f"{mod}:make_env"})
    assert make_environment(task) == ("env for", task)
    assert make_chat(f"{mod}:EchoChat").chat([{"role": "user", "content": "x"}]) == "VERDICT: PASS"
    with pytest.raises(HoningError, match="no attribute 'nosuch'"):
        make_chat(f"{mod}:nosuch")
    with pytest.raises(ValueError, match="unknown tool"):
        get_tools(["read_file", "no_such_tool"])
