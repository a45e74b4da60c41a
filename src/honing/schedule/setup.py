"""What a run is built from, once, at start-up (fails fast on bad input), and how a batch of
trajectories is graded and scored. The loop (loop.py) and benchmarks use these."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from honing.config import RunConfig
from honing.engine import SamplingParams
from honing.errors import HoningError
from honing.rollout import Trajectory
from honing.rollout.mixed import rollout_tasks
from honing.schedule.sampler import TaskSampler, check_seed_ranges, heldout_tasks
from honing.tasks import Task, make_source
from honing.tasks.types import tag_repeated
from honing.train import compute_advantages, grpo_advantages
from honing.verify import VerifyContext
from honing.verify.batch import BatchOptions, grade_trajectories
from honing.verify.reward import RewardConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Setup:
    """Everything a run needs, built once from the config (fails fast on bad input)."""

    sources: list
    heldout: list[Task]
    sampler: TaskSampler
    ctx: VerifyContext
    exclude: set[str]
    reward: RewardConfig
    grading: BatchOptions
    sandbox: Any  # for code-running verifiers and multi-turn episodes (None when nothing needs one)
    multiturn: Any  # MultiTurnConfig

    def roll_out(self, engine: Any, tok: Any, tasks: Sequence[Task], params: SamplingParams,
                 seed: int) -> list[Trajectory]:
        return rollout_tasks(engine, tok, tasks, params, seed, self.sandbox, self.multiturn)


def make_sandbox(cfg: RunConfig, verifiers: Sequence[Any], multiturn: bool) -> Any:
    """The sandbox for verifiers that run code and for multi-turn episodes (None when nothing needs one)."""
    if not multiturn and not any(getattr(v, "needs_sandbox", False) for v in verifiers):
        return None
    from honing.sandbox import Sandbox

    return Sandbox(cfg.sandbox.backend, max_concurrency=cfg.sandbox.max_concurrency or None)


def build_tasks(cfg: RunConfig) -> Setup:
    t = cfg.tasks
    check_seed_ranges(t.train_seed, t.heldout_seed)
    sources = tag_repeated([s.name for s in t.sources],
                           [make_source(s.name, s.params, s.verifier, t.prompt_template, t.system_prompt)
                            for s in t.sources])
    held = heldout_tasks(sources, cfg.eval.heldout_tasks, t.heldout_seed)
    exclude = {h.question for h in held} if t.exclude_heldout_questions else set()
    sampler = TaskSampler(sources, [s.weight for s in t.sources], t.train_seed, exclude,
                          levels=[s.level for s in t.sources], cfg=cfg.schedule)
    from honing.verify import get_verifier

    # unknown names fail now, not at step 1 (a user source's tasks may name their own verifiers)
    verifiers = [get_verifier(s.verifier) for s in sources if getattr(s, "verifier", None)]
    verifiers += [get_verifier(x.verifier) for x in cfg.reward.layers if x.verifier]
    probe = [next(iter(s.tasks("train", t.train_seed)), None) for s in sources]  # multi-turn sources?
    verifiers += [get_verifier(x.verifier.name) for x in probe if x is not None]
    sandbox = make_sandbox(cfg, verifiers, any(x is not None and x.environment for x in probe))
    ctx = VerifyContext(cfg.verify.extractor, cfg.verify.format_weight, {"sandbox": sandbox} if sandbox else {})
    v = cfg.verify
    grading = BatchOptions(v.concurrency, v.timeout_s, v.max_completion_bytes, cfg.generation.max_new_tokens)
    return Setup(sources, held, sampler, ctx, exclude, cfg.reward, grading, sandbox, multiturn_config(cfg))


def multiturn_config(cfg: RunConfig) -> Any:
    from honing.rollout.multiturn import MultiTurnConfig

    r = cfg.rollout
    return MultiTurnConfig(max_turns=r.max_turns, max_total_tokens=r.max_total_tokens, wall_time_s=r.wall_time_s,
                           max_parse_errors=r.max_parse_errors, context_tokens=r.context_tokens,
                           truncation=r.truncation, keep_last_observations=r.keep_last_observations,
                           mask_stale_turns=r.mask_stale_turns, max_observation_chars=r.max_observation_chars,
                           prefix_cache_tokens=r.prefix_cache_tokens)


def layer_means(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Mean of each reward layer per domain ('reward/<domain>/<layer>') and of the reward itself."""
    acc: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        acc[f"reward/{t.domain}/total"].append(t.reward)
        for name, value in t.reward_layers.items():
            acc[f"reward/{t.domain}/{name}"].append(value)
    return {k: sum(v) / len(v) for k, v in sorted(acc.items())}


def verify_and_score(trajs: list[Trajectory], tasks: Sequence[Task], setup: Setup, group_size: int,
                     scale: bool, max_infra_frac: float = 1.0,
                     train_cfg: Any = None) -> tuple[list[Trajectory], dict[str, float]]:
    """Grade every trajectory concurrently, compose the layered reward, drop groups with an
    infrastructure error (never score them 0), and set group-normalised advantages."""
    grade_trajectories([tasks[t.group] for t in trajs], trajs, setup.ctx, setup.reward, setup.grading)
    n_infra = sum(t.status == "infra_error" for t in trajs)
    if trajs and n_infra / len(trajs) > max_infra_frac:
        first = next(t.verdict.details for t in trajs if t.status == "infra_error")
        raise HoningError(f"{n_infra}/{len(trajs)} samples were infrastructure errors this step "
                          f"(verify.max_infra_error_frac={max_infra_frac}); first: {first}")
    bad_groups = {t.group for t in trajs if t.status == "infra_error"}
    kept = [t for t in trajs if t.group not in bad_groups]
    if kept:
        rewards_t = torch.tensor([t.reward for t in kept])  # train.advantage_estimator (GRPO without a train config)
        adv = compute_advantages(rewards_t, group_size, train_cfg) if train_cfg else grpo_advantages(rewards_t, group_size, scale=scale)
        for t, a in zip(kept, adv.tolist()):
            t.advantage = a
    groups = [kept[i:i + group_size] for i in range(0, len(kept), group_size)]
    return kept, {
        **batch_scores(kept, groups),
        "infra_errors": float(n_infra),
        "dropped_groups": float(len(bad_groups)),
        **layer_means(kept),
    }


def batch_scores(trajs: Sequence[Trajectory], groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """What a step trained on: mean reward and pass rate, groups solved by none / all samples,
    completion length, the truncated fraction, and `neg_logprob`: the mean -log p of the sampled
    completion tokens (loss-masked), a Monte-Carlo estimate of the sampling distribution's per-token
    entropy (E_x~p[-log p(x)] = H(p)) that costs nothing: the engine already returned the log-probs."""
    n = max(len(trajs), 1)
    nll = [(-lp, m) for t in trajs for lp, m in zip(t.logprobs, t.loss_mask)]
    return {"reward": sum(t.reward for t in trajs) / n,
            "pass_rate": sum(bool(t.verdict and t.verdict.passed) for t in trajs) / n,
            "solve_none_frac": sum(all(x.reward == 0 for x in g) for g in groups) / max(len(groups), 1),
            "solve_all_frac": sum(all(x.verdict.passed for x in g) for g in groups) / max(len(groups), 1),
            "completion_len": sum(len(t.completion_ids) for t in trajs) / n,
            "truncated_frac": sum(t.finish_reason == "length" for t in trajs) / n,
            "neg_logprob": sum(x * m for x, m in nll) / max(sum(m for _, m in nll), 1)}


def informative_groups(trajs: list[Trajectory], group_size: int) -> tuple[list[Trajectory], int]:
    """DAPO dynamic sampling's filter: keep the groups whose rewards differ (the others carry no
    signal). Returns (kept trajectories, number of groups dropped)."""
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    keep = [g for g in groups if len({t.reward for t in g}) > 1]
    return [t for g in keep for t in g], len(groups) - len(keep)


def check_heldout_overlap(cfg: RunConfig, setup: Setup) -> str | None:
    """The start-up contamination guard: training sources vs the held-out tasks (warn or fail)."""
    c = cfg.eval.contamination
    if c.mode == "off" or not setup.heldout:
        return None
    from honing.eval.contamination import check_contamination, heldout_guard

    rep = check_contamination(setup.sources, setup.heldout, threshold=c.threshold, n_train=c.train_tasks,
                              exclude_exact=cfg.tasks.exclude_heldout_questions)
    msg = heldout_guard(rep, max_fraction=c.max_fraction, fail=c.mode == "fail")
    if msg:
        import sys

        print(f"honing: warning: held-out contamination: {msg} (eval.contamination.mode=fail makes this an error)",
              file=sys.stderr)
    return msg
