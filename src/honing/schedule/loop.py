"""The synchronous training loop. One step reads top to bottom:

    sample tasks -> roll out -> verify -> advantages -> update -> sync weights -> log / checkpoint

Held-out evaluation runs at the start, every `eval.every_steps`, and at the end.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from honing.config import RunConfig, dump_config
from honing.engine import SamplingParams, TransformersEngine
from honing.eval import evaluate
from honing.models import load_policy
from honing.rollout import Trajectory
from honing.rollout.mixed import rollout_tasks
from honing.schedule.progress import Progress
from honing.schedule.runlog import RunLog, atomic_write_text, prune_checkpoints, save_checkpoint
from honing.schedule.sampler import TaskSampler, check_seed_ranges, heldout_tasks
from honing.tasks import Task, make_source
from honing.train import PolicyTrainer, check_train_config, compute_advantages, grpo_advantages
from honing.train.sft import demonstrations, sft
from honing.verify import Verdict, VerifyContext
from honing.verify.batch import BatchOptions, grade_batch
from honing.verify.reward import RewardConfig
from honing.errors import HoningError


def default_run_dir(cfg: RunConfig, recipe: str) -> Path:
    name = cfg.name or f"{recipe}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.out_dir) / name


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
    sources = [make_source(s.name, s.params, s.verifier, t.prompt_template, t.system_prompt) for s in t.sources]
    held = heldout_tasks(sources, cfg.eval.heldout_tasks, t.heldout_seed)
    exclude = {h.question for h in held} if t.exclude_heldout_questions else set()
    sampler = TaskSampler(sources, [s.weight for s in t.sources], t.train_seed, exclude)
    from honing.verify import get_verifier

    verifiers = [get_verifier(s.verifier) for s in sources]  # unknown names fail now, not at step 1
    verifiers += [get_verifier(x.verifier) for x in cfg.reward.layers if x.verifier]
    probe = [next(iter(s.tasks("train", t.train_seed)), None) for s in sources]  # multi-turn sources?
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
                           mask_stale_turns=r.mask_stale_turns, max_observation_chars=r.max_observation_chars)


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
    graded = grade_batch([tasks[t.group] for t in trajs], trajs, setup.ctx, setup.reward, setup.grading)
    for t, g in zip(trajs, graded):
        t.verdict, t.reward, t.reward_layers = g.verdict, g.reward.value, dict(g.reward.layers)
        if t.stop_reason == "infra_error":  # the episode's sandbox broke: not the policy's doing
            t.verdict, t.reward = Verdict.infra(f"episode stopped by an infrastructure error: {t.verdict.details}"), 0.0
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
    rewards = [t.reward for t in kept] or [0.0]
    groups = [kept[i:i + group_size] for i in range(0, len(kept), group_size)]
    return kept, {
        "reward": sum(rewards) / len(rewards),
        "pass_rate": sum(bool(t.verdict and t.verdict.passed) for t in kept) / max(len(kept), 1),
        "solve_none_frac": sum(all(x.reward == 0 for x in g) for g in groups) / max(len(groups), 1),
        "solve_all_frac": sum(all(x.verdict.passed for x in g) for g in groups) / max(len(groups), 1),
        "completion_len": sum(len(t.completion_ids) for t in kept) / max(len(kept), 1),
        "truncated_frac": sum(t.finish_reason == "length" for t in kept) / max(len(kept), 1),
        "infra_errors": float(n_infra),
        "dropped_groups": float(len(bad_groups)),
        **layer_means(kept),
    }


def informative_groups(trajs: list[Trajectory], group_size: int) -> tuple[list[Trajectory], int]:
    """DAPO dynamic sampling's filter: keep the groups whose rewards differ (the others carry no
    signal). Returns (kept trajectories, number of groups dropped)."""
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    keep = [g for g in groups if len({t.reward for t in g}) > 1]
    return [t for g in keep for t in g], len(groups) - len(keep)


def sample_and_score(cfg: RunConfig, setup: Setup, engine: Any, tok: Any, params: SamplingParams,
                     step: int) -> tuple[list[Trajectory], dict[str, float]]:
    """sample tasks -> roll out -> verify -> advantages; with dynamic sampling, groups without
    signal are dropped and refilled from new tasks for up to `dynamic_sampling_max_rounds` rounds."""
    n, k = cfg.tasks.prompts_per_step, cfg.tasks.samples_per_prompt
    kept: list[Trajectory] = []
    stats: dict[str, float] = {}
    dropped = rounds = 0
    gen_s = verify_s = 0.0
    while True:
        tasks = setup.sampler.next(n if not kept else n - len(kept) // k)
        t0 = time.perf_counter()
        trajs = setup.roll_out(engine, tok, tasks, params, cfg.seed * 100_003 + step + 7919 * rounds)
        t1 = time.perf_counter()
        got, st = verify_and_score(trajs, tasks, setup, k, cfg.train.scale_rewards, cfg.verify.max_infra_error_frac,
                                   cfg.train)
        gen_s, verify_s = gen_s + t1 - t0, verify_s + time.perf_counter() - t1
        stats = st if not rounds else stats
        stats.update({"time/gen_s": gen_s, "time/verify_s": verify_s})
        if not cfg.train.dynamic_sampling:
            return got, stats
        got, d = informative_groups(got, k)
        dropped += d
        kept += got
        rounds += 1
        if len(kept) // k >= n or rounds > cfg.train.dynamic_sampling_max_rounds:
            break
    if kept:  # advantages over the final batch (batch-level estimators see all of it)
        adv = compute_advantages(torch.tensor([t.reward for t in kept]), k, cfg.train)
        for t, a in zip(kept, adv.tolist()):
            t.advantage = a
    stats.update(dynamic_dropped_groups=float(dropped), dynamic_rounds=float(rounds),
                 dynamic_kept_groups=float(len(kept) // k))
    return kept, stats


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


def train(cfg: RunConfig, run_dir: Path, show_progress: bool = True) -> dict[str, Any]:
    """Run the whole job; returns the summary (also written to run_dir/summary.json)."""
    t_start = time.time()
    check_train_config(cfg.train, cfg.tasks.samples_per_prompt)
    setup = build_tasks(cfg)
    contamination = check_heldout_overlap(cfg, setup)
    seed_everything(cfg.seed)
    model, tok = load_policy(cfg.model.name, seed=cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", dump_config(cfg))
    log = RunLog(run_dir)
    eos_ids = [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int)
               and i >= 0 and i != tok.unk_token_id]
    engine = TransformersEngine(model, eos_ids, tok.pad_token_id, cfg.model.bf16_autocast,
                                cfg.generation.max_batch_size)
    g = cfg.generation
    train_params = SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, cfg.tasks.samples_per_prompt)
    eval_params = SamplingParams(g.max_new_tokens, cfg.eval.temperature, g.top_p, g.top_k, cfg.eval.samples_per_task)
    progress = Progress(enabled=show_progress)

    def run_eval(step: int, label: str) -> dict:
        with progress.phase(f"held-out eval ({label})"):
            res = evaluate(engine, tok, setup.heldout, eval_params, setup.ctx, seed=cfg.seed + 7, opts=setup.grading,
                           roll_out=setup.roll_out)
        per_domain = {f"heldout/{d}/pass@1": v for d, v in res.get("per_domain_pass@1", {}).items()}
        log.log(step, {**{f"heldout/{k}": v for k, v in res.items() if isinstance(v, (int, float))}, **per_domain})
        progress.note(f"held-out {label}: pass@1 {res['pass@1']:.3f}  mean reward {res['mean_reward']:.3f}")
        return res

    with progress:
        before = run_eval(0, "before")
        if cfg.sft.steps:
            demo_tasks = TaskSampler(setup.sources, [s.weight for s in cfg.tasks.sources], cfg.tasks.train_seed + 1,
                                     setup.exclude).next(cfg.sft.batch_size * 8)
            demos = demonstrations(tok, demo_tasks, cfg.sft.response_template, eos_ids[0])
            bar = progress.bar("SFT warm start", cfg.sft.steps)
            losses = sft(model, demos, tok.pad_token_id, cfg.sft.steps, cfg.sft.learning_rate, cfg.sft.batch_size,
                         cfg.model.bf16_autocast, cfg.seed, on_step=lambda s, l: bar.advance(f"loss {l:.3f}"))
            log.log(0, {"sft/final_loss": losses[-1]})
            after_sft = run_eval(0, "after SFT")
        else:
            after_sft = None

        trainer = PolicyTrainer(model, tok.pad_token_id, cfg.train, cfg.model.lora, cfg.model.bf16_autocast,
                                g.temperature, seed=cfg.seed)
        engine.set_model(trainer.model)  # LoRA wraps the module; generate with the adapted policy
        bar = progress.bar("RL", cfg.train.steps)
        samples_total, rl_time = 0, 0.0
        ckpt_root = run_dir / "checkpoints"
        for step in range(1, cfg.train.steps + 1):
            t0 = time.perf_counter()
            trajs, stats = sample_and_score(cfg, setup, engine, tok, train_params, step)  # sample, roll out,
                                                                                            # verify, advantages
            upd = trainer.step(trajs)                                                    # update policy
            engine.load_weights(None, version=step)                                      # sync weights
            dt = time.perf_counter() - t0
            samples_total += len(trajs)
            rl_time += dt
            named = {k if k.startswith(("reward/", "time/")) else f"train/{k}": v for k, v in stats.items()}
            log.log(step, {**named, **{f"train/{k}": v for k, v in upd.items()},
                           "time/step_s": dt, "time/samples_per_s": len(trajs) / dt})
            bar.advance(f"reward {stats['reward']:.2f}  pass {stats['pass_rate']:.2f}  {dt:.1f}s/step")
            if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < cfg.train.steps:
                run_eval(step, f"step {step}")
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                with progress.phase(f"checkpoint step {step}"):
                    _checkpoint(ckpt_root / f"step-{step}", trainer, tok, step)
                    prune_checkpoints(ckpt_root, cfg.checkpoint.keep_last)
        after = run_eval(cfg.train.steps, "after")
        with progress.phase("final checkpoint"):
            final = _checkpoint(ckpt_root / "final", trainer, tok, cfg.train.steps)

    log.close()
    keep = ("pass@1", "mean_reward", "n_tasks", "infra_errors", "per_domain_pass@1")
    summary = {
        "heldout_before": {k: before[k] for k in keep},
        "heldout_after": {k: after[k] for k in keep},
        "heldout_after_sft": {k: after_sft[k] for k in keep} if after_sft else None,
        "steps": cfg.train.steps,
        "wall_s": round(time.time() - t_start, 2),
        "samples_per_s": samples_total / rl_time if rl_time else 0.0,
        "final_checkpoint": str(final),
        "contamination_warning": contamination,
        "examples_after": after["examples"],
    }
    import json

    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _checkpoint(path: Path, trainer: PolicyTrainer, tok: Any, step: int) -> Path:
    exported = trainer.export_model()
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(path, exported, tok, trainer.state(), step,
                           adapter_model=trainer.model if trainer.lora else None)
