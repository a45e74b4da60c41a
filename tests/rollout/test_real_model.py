"""A real policy through the loop: tiny-random via TransformersEngine for a few turns. The model
writes nonsense, so this checks the harness, not the model: token/mask/log-prob consistency,
and that the stored sampling log-probs of every (non-stale) generated token equal the
trainer's log-probs recomputed on the assembled sequence (which holds only if each reply's
context is exactly the prefix of the stored sequence)."""

from __future__ import annotations

import torch

from honing.engine.hf import TransformersEngine
from honing.engine.types import SamplingParams
from honing.models import load_policy
from honing.rollout.env import ToolEnvironment
from honing.rollout.multiturn import MultiTurnConfig, multiturn_rollout
from honing.rollout.tools import get_tools
from honing.tasks.types import Task, VerifierSpec
from honing.train.logprobs import completion_logprobs

from .conftest import needs_bwrap


@needs_bwrap
def test_tiny_model_episodes_have_consistent_tokens_masks_and_logprobs(sandbox):
    model, tok = load_policy("tiny-random", seed=3)
    engine = TransformersEngine(model, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    task = Task(id="smoke", domain="test", prompt=({"role": "user", "content": "Fix a.py."},),
                verifier=VerifierSpec("repair"), environment={"files": {"a.py": "x = 1\n"}})
    tools = get_tools(["read_file", "submit"])
    env = lambda _t: ToolEnvironment(tools, instructions='Reply <tool_call>{"name": ...}</tool_call>.')  # noqa: E731
    cfg = MultiTurnConfig(max_turns=3, max_parse_errors=10, context_tokens=512, max_observation_chars=400,
                          profile="shell")
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=2)
    trajs = multiturn_rollout(engine, tok, [task], params, sandbox, cfg, seed=5, make_env=env)
    assert len(trajs) == 2 and all(len(t.turns) == 3 for t in trajs)
    assert all(t.stop_reason == "max_turns" for t in trajs)
    assert trajs[0].completion_ids != trajs[1].completion_ids  # two samples of the group differ
    for tr in trajs:
        flat = [i for t in tr.turns for i in (*t.action_ids, *t.observation_ids)]
        assert list(tr.completion_ids) == flat and len(tr.loss_mask) == len(flat) == len(tr.logprobs)
        assert len(tr.prompt_ids) + len(flat) <= cfg.context_tokens + params.max_new_tokens
        assert all(t.parse_error for t in tr.turns) and tr.stats["parse_errors"] == 3
        with torch.no_grad():
            lp, _ = completion_logprobs(model, [tr.prompt_ids], [tr.completion_ids], tok.pad_token_id)
        mask = torch.tensor(tr.loss_mask, dtype=torch.bool)
        stored = torch.tensor(tr.logprobs)
        assert mask.sum() > 0
        assert torch.allclose(lp[0][mask], stored[mask], atol=2e-4), (lp[0][mask] - stored[mask]).abs().max()
        is_obs = torch.tensor([k for t in tr.turns for k in [False] * len(t.action_ids) + [True] * len(t.observation_ids)])
        assert (stored[is_obs] == 0).all() and not mask[is_obs].any()
        # replies sampled before a context truncation keep their log-probs but are masked out
        stale = max((x["at_turn"] for x in tr.truncations), default=0)
        assert mask.sum() == sum(len(t.action_ids) for t in tr.turns if t.index >= stale)
    assert any(t.truncated_context for t in trajs)  # 512 tokens of context: the budget policy ran


@needs_bwrap
def test_trainer_step_on_multiturn_trajectories_trains_only_generated_tokens(sandbox):
    """The loop's update on multi-turn samples: only mask-1 tokens count, and the trainer's
    log-probs before the update equal the engine's sampling log-probs on exactly those tokens."""
    from honing.config import LoraConfig, TrainConfig
    from honing.train.trainer import PolicyTrainer

    model, tok = load_policy("tiny-random", seed=4)
    engine = TransformersEngine(model, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    task = Task(id="t", domain="test", prompt=({"role": "user", "content": "Fix a.py."},),
                verifier=VerifierSpec("repair"), environment={"files": {"a.py": "x = 1\n"}})
    env = lambda _t: ToolEnvironment(get_tools(["read_file", "submit"]), instructions="Use tools.")  # noqa: E731
    cfg = MultiTurnConfig(max_turns=2, max_parse_errors=10, context_tokens=2048, profile="shell")
    trajs = multiturn_rollout(engine, tok, [task], SamplingParams(max_new_tokens=12, n=2), sandbox, cfg, seed=1,
                              make_env=env)
    for t, a in zip(trajs, (1.0, -1.0)):
        t.advantage = a
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(learning_rate=1e-3, micro_batch_size=1),
                            LoraConfig(), False, 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    stats = trainer.step(trajs)
    assert stats["tokens"] == sum(sum(t.loss_mask) for t in trajs) < sum(len(t.completion_ids) for t in trajs)
    assert stats["logprob_mismatch"] < 1e-3 and stats["active_seqs"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
