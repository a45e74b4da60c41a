"""Learning check: every advantage estimator and policy loss improves held-out reward on the
smoke task (tiny in-code model, 1-digit addition). SFT warm start once, then a short RL run per
variant from the same SFT weights (~15 s each on one core)."""

from __future__ import annotations

import copy

import pytest
import torch

from honing.config import RunConfig, TrainConfig, load_config
from honing.engine import SamplingParams, TransformersEngine
from honing.eval import evaluate
from honing.models import load_policy
from honing.schedule.loop import Setup, build_tasks, seed_everything, verify_and_score
from honing.schedule.sampler import TaskSampler
from honing.train.sft import demonstrations, sft
from honing.train.trainer import PolicyTrainer

STEPS = 120
BASE = {"learning_rate": 3e-4, "micro_batch_size": 64}
VARIANTS = {
    "grpo": {},
    "dapo_clip_higher": {"clip_eps_high": 0.28, "mini_batches": 2},  # two updates per batch: the clip acts
    "dr_grpo": {"advantage_estimator": "dr_grpo", "loss_aggregation": "seq_sum_norm", "loss_norm_tokens": 6},
    "rloo": {"advantage_estimator": "rloo"},
    "reinforce_pp": {"advantage_estimator": "reinforce_pp"},
    "gspo": {"policy_loss": "gspo", "loss_aggregation": "seq_mean_token_mean"},
    "cispo": {"policy_loss": "cispo"},
    "seq_mean_token_mean": {"loss_aggregation": "seq_mean_token_mean"},
    "epochs_minibatches_tis": {"ppo_epochs": 2, "mini_batches": 1, "tis_cap": 2.0, "micro_batch_tokens": 512},
    "kl_k3_loss": {"kl_coef": 0.01, "kl_estimator": "k3"},
    "kl_in_reward": {"kl_coef": 0.01, "kl_in_reward": True, "advantage_estimator": "reinforce_pp"},
}


@pytest.fixture(scope="module")
def warm() -> tuple:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg, _ = load_config("smoke", ["tasks.prompts_per_step=8"])
    setup = build_tasks(cfg)
    seed_everything(0)
    model, tok = load_policy(cfg.model.name, seed=0)
    eos = tok.eos_token_id
    tasks = TaskSampler(setup.sources, [1.0], cfg.tasks.train_seed + 1, setup.exclude).next(cfg.sft.batch_size * 8)
    demos = demonstrations(tok, tasks, cfg.sft.response_template, eos)
    sft(model, demos, tok.pad_token_id, cfg.sft.steps, cfg.sft.learning_rate, cfg.sft.batch_size, False, 0)
    yield cfg, setup, model, tok
    torch.set_num_threads(old)


def _heldout(engine: TransformersEngine, tok, setup: Setup) -> float:  # noqa: ANN001
    res = evaluate(engine, tok, setup.heldout, SamplingParams(6, 0.0, 1.0, 0, 1), setup.ctx, seed=7,
                   opts=setup.grading, roll_out=setup.roll_out)
    return float(res["mean_reward"])


def _rl(cfg: RunConfig, setup: Setup, model, tok, train: TrainConfig) -> tuple[float, float, list[float]]:  # noqa: ANN001
    seed_everything(0)
    engine = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, False, 128)
    before = _heldout(engine, tok, setup)
    trainer = PolicyTrainer(model, tok.pad_token_id, train, cfg.model.lora, False, cfg.generation.temperature)
    engine.set_model(trainer.model)
    sampler = TaskSampler(setup.sources, [1.0], cfg.tasks.train_seed, setup.exclude)
    g = cfg.generation
    params = SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, cfg.tasks.samples_per_prompt)
    rewards = []
    for step in range(1, STEPS + 1):
        tasks = sampler.next(cfg.tasks.prompts_per_step)
        trajs = setup.roll_out(engine, tok, tasks, params, step)
        trajs, _ = verify_and_score(trajs, tasks, setup, cfg.tasks.samples_per_prompt, True, 1.0, train)
        rewards.append(sum(t.reward for t in trajs) / len(trajs))
        trainer.step(trajs)
    return before, _heldout(engine, tok, setup), rewards


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_improves_heldout_reward(warm, variant: str) -> None:  # noqa: ANN001
    cfg, setup, sft_model, tok = warm
    train = TrainConfig(**{**BASE, **VARIANTS[variant]})
    before, after, rewards = _rl(cfg, setup, copy.deepcopy(sft_model), tok, train)
    third = STEPS // 3
    first, last = sum(rewards[:third]) / third, sum(rewards[-third:]) / third
    print(f"{variant}: held-out mean reward {before:.3f} -> {after:.3f}; train reward {first:.3f} -> {last:.3f}")
    # The SFT start leaves RL room: 0.25 on the machine these tests were first tuned on, 0.59 on an AVX2-only
    # AMD EPYC (2026-12-02): float rounding differs between CPUs and the tiny model's training is chaotic,
    # so the thresholds must hold on both, not only one.
    assert before < 0.65
    # Learning, shown by either of two signals, each against its own noise, and neither falling:
    # - the train reward (temperature 1) of the last third of the steps (40 x 64 samples, s.e. of the
    #   difference ~0.013) over the first third by +0.02: +0.025..+0.045 for every variant on the AVX2 EPYC,
    #   where the SFT start (0.59) leaves the held-out little room;
    # - or the held-out (greedy, 64 tasks) mean reward up by +0.1: on CI's machine (SFT start 0.25, 2026-12-03)
    #   gspo and seq_mean_token_mean went 0.250 -> 0.552 held-out while their train reward rose only +0.012.
    # A trainer that does nothing leaves greedy held-out exactly where it was and the train reward at ~0
    # (lr=0: fails); one with the gradient's sign flipped makes both fall.
    rise, lift = last - first, after - before
    assert rise >= 0.02 or (lift >= 0.1 and rise >= -0.01), (variant, first, last, before, after)
    assert after >= before - 1 / 64, (variant, before, after)
