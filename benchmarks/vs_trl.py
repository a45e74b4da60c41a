"""honing vs TRL's GRPOTrainer on the same machine, run alternately step by step in one process.

Both frameworks train SmolLM2-135M-Instruct (two separate copies) on the same reasoning-gym
tasks in the same order (the quickstart recipe's basic_arithmetic), 4 prompts x 8 samples per
step, at most 64 new tokens, the same learning rate, AdamW betas, clip range, loss (token-mean
PPO-clip, TRL's default 'dapo'), group-normalised advantages and no KL (beta = 0: no reference
model in either). Each uses its best CPU settings: bf16 autocast where the CPU has bf16
(AMX / AVX512-BF16), otherwise fp32 (`--bf16 on|off` forces it: measure both on a new machine),
and gradient checkpointing off for both (TRL's default is on; `--gradient-checkpointing`).
honing also generates from a bf16 copy of the policy synced after each update
(`generation.weights=auto`) and runs each group's prompt once in the update with completions
packed behind it (`train.share_prompt`); TRL's nearest options are its generation path
(`--trl-generation static|continuous`). On the 2-core reference machine (3 steps each) TRL's
default took 47.6 s/step, the static cache 55.1 s/step, and transformers' continuous batching
failed on CPU ("'PagedAttentionCache' object has no attribute 'float'"), so the default stays.
The first step is trained but not timed (`--warmup-steps`).

TRL runs `trainer.train()` in a worker thread whose callback hands control back after every
optimizer step, so the two alternate: honing step 1, TRL step 1, honing step 2, ... Only one
computes at a time (all cores each). A step's time covers generation, grading and the update.

Printed: samples/s for both and their ratio; peak RSS sampled while each one's steps run (one
process, so it includes both resident models; the growth during a step is printed too); the
mean training reward per half of the run; held-out mean reward (greedy, honing's evaluator on
both final models), ending with

    RATIO honing_vs_trl_samples_per_s=<x> heldout_reward honing=<a> trl=<b>

Usage (quick end-to-end check, then the real measurement on a quiet machine):

    .venv/bin/python benchmarks/vs_trl.py --steps 2 --heldout 4 --max-new-tokens 16
    .venv/bin/python benchmarks/vs_trl.py --steps 30 seed=1
    .venv/bin/python benchmarks/vs_trl.py --steps 30 seed=1 --skip-trl generation.weights=shared  # ablation
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from typing import Any

import torch

from honing.config import load_config
from honing.engine import SamplingParams, TransformersEngine
from honing.engine.hf import bf16_supported, engine_weights_dtype
from honing.eval import evaluate
from honing.models import load_policy
from honing.schedule.loop import build_tasks, effective_train_config, seed_everything, verify_and_score
from honing.train.trainer import PolicyTrainer
from honing.verify.batch import grade_batch


class RssMonitor:
    """Polls /proc/self/statm every 10 ms; keeps the peak per active label and the growth per window."""

    def __init__(self) -> None:
        self.label: str | None = None
        self.peak: dict[str, float] = {}
        self.growth: dict[str, float] = {}
        self._start = 0.0
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss_mb(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page / 2**20

    def begin(self, label: str) -> None:
        self._start = self.rss_mb()
        self.label = label

    def end(self) -> None:
        self._sample()
        self.label = None

    def _sample(self) -> None:
        label = self.label
        if label is not None:
            rss = self.rss_mb()
            self.peak[label] = max(self.peak.get(label, 0.0), rss)
            self.growth[label] = max(self.growth.get(label, 0.0), rss - self._start)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._sample()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--config", default="quickstart")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="both recompute activations (less memory, slower; TRL's default is on, honing's off)")
    ap.add_argument("--warmup-steps", type=int, default=1, help="first steps trained but not timed (allocator warm-up)")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                    help="bf16 autocast for both (auto: where the CPU has bf16; measure both on a new machine)")
    ap.add_argument("--trl-generation", choices=["default", "static", "continuous"], default="default",
                    help="TRL's generation path: model.generate with a dynamic cache (default), a static cache "
                         "(cache_implementation='static'), or transformers continuous batching")
    ap.add_argument("--skip-trl", action="store_true",
                    help="honing alone (ablations of honing's own options, e.g. generation.weights=shared; "
                         "honing's run does not depend on TRL's, so its numbers pair with a full run's)")
    ap.add_argument("--skip-honing", action="store_true",
                    help="TRL alone on the same tasks in the same order (pairs with --skip-trl runs of the same seed)")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the numbers of the framework that ran alone (held-out per-task rewards, "
                         "train rewards, samples/s) as JSON")
    ap.add_argument("overrides", nargs="*", help="extra honing config overrides (e.g. train.micro_batch_tokens=4096)")
    args = ap.parse_intermixed_args()  # overrides may come before and after flags
    if args.steps < 1:
        ap.error(f"--steps must be at least 1 (got {args.steps})")
    if args.skip_trl and args.skip_honing:
        ap.error("--skip-trl and --skip-honing together leave nothing to run")

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg, _ = load_config(args.config, [
        f"tasks.prompts_per_step={args.prompts}", f"tasks.samples_per_prompt={args.samples}",
        f"generation.max_new_tokens={args.max_new_tokens}", f"train.learning_rate={args.lr}", "train.kl_coef=0",
        f"train.micro_batch_size={args.prompts * args.samples}", f"eval.heldout_tasks={args.heldout}",
        "generation.temperature=1.0", f"model.bf16_autocast={args.bf16 != 'off'}",
        f"train.gradient_checkpointing={args.gradient_checkpointing}", *args.overrides])
    setup = build_tasks(cfg)
    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and bf16_supported("cpu"))
    seed_everything(cfg.seed)
    step_tasks = [setup.sampler.next(args.prompts) for _ in range(args.steps)]  # the same tasks, same order
    flat_tasks = [t for ts in step_tasks for t in ts]
    print(f"threads {torch.get_num_threads()}  bf16 {bf16}  honing generation weights {cfg.generation.weights}  "
          f"share_prompt {cfg.train.share_prompt}  steps {args.steps}  "
          f"{args.prompts} prompts x {args.samples} samples  max_new_tokens {args.max_new_tokens}  lr {args.lr}")

    # --- honing ---------------------------------------------------------------------------------
    model_h, tok = load_policy(cfg.model.name, seed=cfg.seed)
    eos = [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int) and i >= 0]
    gen_dtype = engine_weights_dtype(cfg.generation.weights, cfg.model.bf16_autocast)
    engine_h = TransformersEngine(model_h, eos, tok.pad_token_id, cfg.model.bf16_autocast, cfg.generation.max_batch_size,
                                  gen_dtype)
    g = cfg.generation
    params = SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, args.samples)
    eval_params = SamplingParams(g.max_new_tokens, 0.0, 1.0, 0, 1)

    per_task: dict[str, dict[str, float]] = {}

    def heldout(engine: TransformersEngine, label: str = "") -> float:
        res = evaluate(engine, tok, setup.heldout, eval_params, setup.ctx, seed=cfg.seed + 7,
                       opts=setup.grading, roll_out=setup.roll_out)
        if label:
            per_task[label] = {str(k): float(v) for k, v in res.get("per_task_reward", {}).items()}
        return float(res["mean_reward"])

    t_set = time.perf_counter()
    base_reward = heldout(engine_h, "base")
    print(f"base model held-out reward {base_reward:.3f} ({time.perf_counter() - t_set:.0f} s)", flush=True)
    trainer_h = PolicyTrainer(model_h, tok.pad_token_id, effective_train_config(cfg), cfg.model.lora, cfg.model.bf16_autocast,
                              g.temperature, seed=cfg.seed)
    engine_h.set_model(trainer_h.model)

    def honing_step(step: int, tasks: list) -> tuple[float, float]:
        """One honing RL step (generate, grade, update, sync the engine); returns (seconds, mean reward)."""
        t0 = time.perf_counter()
        trajs = setup.roll_out(engine_h, tok, tasks, params, cfg.seed * 100_003 + step)
        trajs, stats = verify_and_score(trajs, tasks, setup, args.samples, cfg.train.scale_rewards, 1.0, cfg.train)
        trainer_h.step(trajs)
        engine_h.load_weights(None, version=step)
        return time.perf_counter() - t0, stats["reward"]

    if args.skip_trl:
        run_honing_only(args, step_tasks, honing_step, lambda: heldout(engine_h, "after"), base_reward,
                        lambda summary: write_json(args.json, {**summary, "per_task_reward": per_task,
                                                               "seed": cfg.seed, "overrides": args.overrides}))
        return

    # --- TRL ------------------------------------------------------------------------------------
    model_t, _ = load_policy(cfg.model.name, seed=cfg.seed)
    dataset = Dataset.from_list([{"prompt": [dict(m) for m in t.prompt], "task_index": i}
                                 for i, t in enumerate(flat_tasks)])
    trl_rewards: list[float] = []

    def reward_fn(prompts: list, completions: list, task_index: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        graded = grade_batch([flat_tasks[i] for i in task_index], texts, setup.ctx, setup.reward, setup.grading)
        values = [float(x.reward.value) for x in graded]
        trl_rewards.append(sum(values) / len(values))
        return values

    out_dir = tempfile.mkdtemp(prefix="vs_trl-")
    trl_args = GRPOConfig(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.prompts * args.samples,
        num_generations=args.samples, gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens,
        learning_rate=args.lr, adam_beta1=cfg.train.betas[0], adam_beta2=cfg.train.betas[1],
        weight_decay=cfg.train.weight_decay, max_grad_norm=cfg.train.max_grad_norm, lr_scheduler_type="constant",
        warmup_steps=0, beta=0.0, epsilon=cfg.train.clip_eps_low, epsilon_high=cfg.train.clip_eps_high,
        loss_type="dapo", scale_rewards="group", temperature=g.temperature, top_p=1.0, shuffle_dataset=False,
        use_cpu=True, bf16=bf16, logging_steps=1, report_to="none", save_strategy="no", seed=cfg.seed,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
        gradient_checkpointing=args.gradient_checkpointing,
        cache_implementation="static" if args.trl_generation == "static" else None,
        use_transformers_continuous_batching=args.trl_generation == "continuous")

    monitor = RssMonitor()
    turn_trl, turn_main = threading.Semaphore(0), threading.Semaphore(0)
    trl_times: list[float] = []
    trl_error: list[BaseException] = []

    class Alternate(TrainerCallback):
        """Each TRL optimizer step waits for its turn and hands control back when done."""

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            turn_main.release()  # ready (first call) / nothing else to do
            turn_trl.acquire()
            monitor.begin("trl")
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            trl_times.append(time.perf_counter() - self.t0)
            monitor.end()

    trainer_t = GRPOTrainer(model=model_t, reward_funcs=reward_fn, args=trl_args, train_dataset=dataset,
                            processing_class=tok, callbacks=[Alternate()])

    def run_trl() -> None:
        try:
            trainer_t.train()
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            trl_error.append(e)
        finally:
            turn_main.release()

    def wait_for_trl() -> None:
        while not turn_main.acquire(timeout=1.0):
            if not worker.is_alive():
                break
        if trl_error:
            raise RuntimeError("TRL failed") from trl_error[0]

    print("TRL trainer built; starting", flush=True)
    worker = threading.Thread(target=run_trl, daemon=True)
    worker.start()
    wait_for_trl()  # TRL has finished its set-up and waits at its first step

    if args.skip_honing:
        run_trl_only(args, turn_trl, wait_for_trl, trl_times, trl_rewards)
        worker.join(timeout=600)
        if trl_error:
            raise RuntimeError("TRL failed") from trl_error[0]
        after = heldout(TransformersEngine(trainer_t.model.to(torch.float32), eos, tok.pad_token_id,
                                           cfg.model.bf16_autocast, cfg.generation.max_batch_size, gen_dtype), "after")
        summary = alone_summary("TRL", args, trl_times, trl_rewards, base_reward, after)
        write_json(args.json, {**summary, "per_task_reward": per_task, "seed": cfg.seed, "framework": "trl"})
        return

    honing_times: list[float] = []
    honing_rewards: list[float] = []
    for step, tasks in enumerate(step_tasks, start=1):
        monitor.begin("honing")
        seconds, reward = honing_step(step, tasks)
        monitor.end()
        honing_times.append(seconds)
        honing_rewards.append(reward)
        turn_trl.release()  # TRL's step `step`
        wait_for_trl()
        print(f"step {step:3d}  honing {honing_times[-1]:6.2f} s reward {honing_rewards[-1]:.3f}   "
              f"trl {trl_times[-1] if len(trl_times) >= step else float('nan'):6.2f} s "
              f"reward {trl_rewards[-1] if trl_rewards else float('nan'):.3f}", flush=True)
    worker.join(timeout=600)
    if trl_error:
        raise RuntimeError("TRL failed") from trl_error[0]

    n = args.prompts * args.samples
    skip = args.warmup_steps if args.steps > args.warmup_steps else 0
    timed_h, timed_t = honing_times[skip:], trl_times[skip:]
    sps_h = n * len(timed_h) / sum(timed_h)
    sps_t = n * len(timed_t) / sum(timed_t)
    trl_model = trainer_t.model.to(torch.float32)
    after_h = heldout(engine_h)
    after_t = heldout(TransformersEngine(trl_model, eos, tok.pad_token_id, cfg.model.bf16_autocast,
                                         cfg.generation.max_batch_size, gen_dtype))

    def halves(xs: list[float]) -> str:
        first, second = half_means(xs)
        return f"{first:.3f} -> {second:.3f}"

    def row(label: str, a: str, b: str) -> None:
        print(f"{label:30s}{a:>16s}{b:>16s}")

    print()
    row("", "honing", "trl")
    row(f"samples/s (steps {skip + 1}-{args.steps})", f"{sps_h:.2f}", f"{sps_t:.2f}")
    row("s/step (timed mean)", f"{sum(timed_h) / len(timed_h):.2f}", f"{sum(timed_t) / len(timed_t):.2f}")
    row("peak RSS MB (process)", f"{monitor.peak.get('honing', 0):.0f}", f"{monitor.peak.get('trl', 0):.0f}")
    row("max RSS growth in a step MB", f"{monitor.growth.get('honing', 0):.0f}", f"{monitor.growth.get('trl', 0):.0f}")
    row("train reward 1st -> 2nd half", halves(honing_rewards), halves(trl_rewards))
    row("held-out reward", f"{after_h:.3f}", f"{after_t:.3f}")
    print(f"(base model held-out reward {base_reward:.3f}; TRL gradient_checkpointing="
          f"{trl_args.gradient_checkpointing}, honing train.gradient_checkpointing={cfg.train.gradient_checkpointing})")
    print(f"RATIO honing_vs_trl_samples_per_s={sps_h / sps_t:.2f} heldout_reward honing={after_h:.3f} trl={after_t:.3f}")


def half_means(xs: list[float]) -> tuple[float, float]:
    """Mean of the first and of the second half of a per-step series (the second is the first when too short)."""
    half = max(1, len(xs) // 2)
    first, second = xs[:half], xs[half:] or xs[:half]
    return sum(first) / len(first), sum(second) / len(second)


def write_json(path: str | None, summary: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)


def alone_summary(name: str, args: argparse.Namespace, times: list[float], rewards: list[float],
                  base_reward: float, after: float) -> dict:
    """Prints and returns one framework's numbers when it ran alone (--skip-trl / --skip-honing)."""
    skip = args.warmup_steps if args.steps > args.warmup_steps else 0
    timed = times[skip:]
    sps = args.prompts * args.samples * len(timed) / sum(timed)
    first, second = half_means(rewards)
    print(f"\n{name} alone: samples/s {sps:.2f}  train reward 1st -> 2nd half {first:.3f} -> {second:.3f}  "
          f"held-out {base_reward:.3f} -> {after:.3f}")
    print(f"{name.upper()}_ONLY heldout_reward={after:.3f} train_reward_2nd_half={second:.3f}")
    return {"heldout_before": base_reward, "heldout_after": after, "train_rewards": rewards, "samples_per_s": sps}


def run_honing_only(args: argparse.Namespace, step_tasks: list, honing_step: Any, heldout: Any,
                    base_reward: float, save: Any) -> None:
    """--skip-trl: the same honing steps as a full run, then the same summary for honing only."""
    times, rewards = [], []
    for step, tasks in enumerate(step_tasks, start=1):
        seconds, reward = honing_step(step, tasks)
        times.append(seconds)
        rewards.append(reward)
        print(f"step {step:3d}  honing {seconds:6.2f} s reward {reward:.3f}", flush=True)
    save(alone_summary("honing", args, times, rewards, base_reward, heldout()))


def run_trl_only(args: argparse.Namespace, turn_trl: threading.Semaphore, wait_for_trl: Any,
                 times: list[float], rewards: list[float]) -> None:
    """--skip-honing: TRL's steps one by one (the same hand-over as a full run, with no honing step between)."""
    for step in range(1, args.steps + 1):
        turn_trl.release()
        wait_for_trl()
        print(f"step {step:3d}  trl {times[-1] if len(times) >= step else float('nan'):6.2f} s "
              f"reward {rewards[-1] if rewards else float('nan'):.3f}", flush=True)


if __name__ == "__main__":
    main()
