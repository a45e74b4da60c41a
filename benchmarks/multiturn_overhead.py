"""Multi-turn harness overhead: what a turn costs besides generation, on the easiest repair level.

A batch of --n concurrent episodes (16 different level-1 repair tasks, one sandbox session each)
runs twice through `honing.rollout.multiturn.run_episodes`:

  (a) reference: a scripted engine replays each task's hidden reference solution (run_tests,
      apply_patch, run_tests, submit), so every turn does real tool work in the sandbox and
      generation costs ~nothing: the wall time is the harness;
  (b) model: the real policy (--model, default smollm2-135m-instruct; `tiny-random` has a
      512-token context, too small for a repair prompt) generates --gen-turns turns of
      --max-new-tokens tokens, so generation time per turn is measured on the same batch.

Per turn it reports generation, sandbox/tool (`env.step`), snapshot, token assembly and other
harness work (observation templating + encoding inside `Episode.act`, and the loop's own
bookkeeping: stop checks, id assembly, decoding), verification (the `repair` verifier on
the final workspaces, via grade_batch), and episode setup (session open + workspace write).
Both per episode-turn (summed over episodes) and per batch turn (wall clock, 16 at once).

    python benchmarks/multiturn_overhead.py --n 16

The last lines are `RATIO sandbox_vs_generation=<x>` (sandbox wall per batch turn in (a) over
generation wall per batch turn in (b)) and `overhead_per_turn_ms=<y>` (wall per batch turn of
everything except generation in (a), verification and setup amortised over the turns).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from honing.engine import SamplingParams
from honing.rollout.env import make_environment
from honing.rollout.multiturn import (
    ChatFormat,
    Episode,
    MultiTurnConfig,
    ScriptedEngine,
    run_episodes,
)
from honing.rollout.show import RoutedEngine, reference_script
from honing.sandbox import Sandbox
from honing.tasks.repair import RepairSource
from honing.verify import VerifyContext
from honing.verify.batch import BatchOptions, grade_batch


@dataclass
class Clock:
    """Per engine call (= batch turn): generation wall; per act: (call, start, end, env, snap)."""

    gen: list[float] = field(default_factory=list)
    acts: list[tuple[int, float, float, float, float]] = field(default_factory=list)


class TimedEngine:
    def __init__(self, inner: Any, clock: Clock) -> None:
        self.inner, self.clock, self.version = inner, clock, 0

    def generate(self, prompts: Any, params: Any, seed: int | None = None) -> Any:
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params, seed)
        self.clock.gen.append(time.perf_counter() - t0)
        return out


class TimedEpisode(Episode):
    clock: Clock

    def act(self, sample: Any, text: str, gen_s: float) -> None:
        t0 = time.perf_counter()
        super().act(sample, text, gen_s)
        t1 = time.perf_counter()
        tm = self.turns[-1].timings
        self.clock.acts.append((len(self.clock.gen) - 1, t0, t1, tm["env_s"], tm["snapshot_s"]))


def run_batch(label: str, tasks: list[Any], tok: Any, engine_for: Any, sandbox: Sandbox, cfg: MultiTurnConfig,
              params: SamplingParams, workers: int) -> dict[str, float]:
    clock = Clock()
    fmt = ChatFormat(tok)
    t0 = time.perf_counter()
    eps: list[TimedEpisode] = []
    try:
        for task in tasks:
            session = sandbox.open(cfg.profile)
            e = TimedEpisode(task, session, make_environment(task), fmt, cfg)
            e.clock = clock
            eps.append(e)
        setup_s = time.perf_counter() - t0
        engine = TimedEngine(engine_for(eps), clock)
        t1 = time.perf_counter()
        run_episodes(engine, tok, eps, params, cfg, seed=0, max_workers=workers)
        loop_s = time.perf_counter() - t1
        trajs = [e.to_trajectory(0) for e in eps]
    finally:
        for e in eps:
            e.session.close()
    t2 = time.perf_counter()
    graded = grade_batch(tasks, trajs, VerifyContext(extra={"sandbox": sandbox}), opts=BatchOptions(concurrency=workers))
    verify_wall = time.perf_counter() - t2
    steps = len(clock.gen)
    ep_turns = len(clock.acts)
    act_wall = sum(max(a[2] for a in clock.acts if a[0] == s) - min(a[1] for a in clock.acts if a[0] == s)
                   for s in range(steps))
    gen_wall = sum(clock.gen)
    env = sum(a[3] for a in clock.acts)
    snap = sum(a[4] for a in clock.acts)
    assembly = sum(a[2] - a[1] - a[3] - a[4] for a in clock.acts)
    loop_other = loop_s - gen_wall - act_wall
    return {
        "label": label, "episodes": len(tasks), "batch_turns": steps, "episode_turns": ep_turns,
        "passed": sum(bool(g.verdict.passed) for g in graded), "infra": sum(bool(g.verdict.infra_error) for g in graded),
        "parse_errors": sum(t.parse_error for e in eps for t in e.turns),
        # per episode-turn (sums over episodes), seconds
        "gen_et": gen_wall / max(ep_turns, 1), "env_et": env / max(ep_turns, 1), "snap_et": snap / max(ep_turns, 1),
        "asm_et": (assembly + loop_other) / max(ep_turns, 1),
        "verify_ep": sum(g.verdict.cost_s for g in graded) / len(tasks), "setup_ep": setup_s / len(tasks),
        # per batch turn (wall clock), seconds
        "gen_bt": gen_wall / max(steps, 1), "act_bt": act_wall / max(steps, 1), "other_bt": loop_other / max(steps, 1),
        "verify_wall": verify_wall, "setup_wall": setup_s, "loop_wall": loop_s,
        "overhead_bt": (loop_s - gen_wall + verify_wall + setup_s) / max(steps, 1),
        "sandbox_bt": act_wall / max(steps, 1) * (env + snap) / max(env + snap + assembly, 1e-12),
    }


def table(rows: list[dict[str, float]]) -> None:
    ms = lambda x: f"{x * 1000:9.1f}"
    print(f"{'per episode-turn (ms)':<36}" + "".join(f"{r['label']:>14}" for r in rows))
    for key, name in (("gen_et", "generation (batch wall / episodes)"), ("env_et", "sandbox / tool (env.step)"),
                      ("snap_et", "snapshot"), ("asm_et", "token assembly + other harness"),
                      ("verify_ep", "verification (per episode)"), ("setup_ep", "setup (per episode)")):
        print(f"{name:<36}" + "".join(f"{ms(r[key]):>14}" for r in rows))
    print(f"{'per batch turn, wall (ms)':<36}" + "".join(f"{r['label']:>14}" for r in rows))
    for key, name in (("gen_bt", "generation"), ("act_bt", "act phase (sandbox+snap+asm)"),
                      ("sandbox_bt", "  of which sandbox+snapshot"), ("other_bt", "loop bookkeeping"),
                      ("overhead_bt", "overhead (all but generation)")):
        print(f"{name:<36}" + "".join(f"{ms(r[key]):>14}" for r in rows))
    for key in ("episodes", "batch_turns", "episode_turns", "passed", "infra", "parse_errors"):
        print(f"{key:<36}" + "".join(f"{r[key]:>14}" for r in rows))
    print(f"{'verification wall for the batch (s)':<36}" + "".join(f"{r['verify_wall']:>14.2f}" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16, help="concurrent episodes (different level-1 tasks)")
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--gen-turns", type=int, default=2, help="turns for the model run")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="parallel actions (0: the sandbox's max_concurrency)")
    ap.add_argument("--skip-model", action="store_true", help="only the reference run")
    a = ap.parse_args()

    src = RepairSource({"levels": [a.level]})
    it = src.tasks("train", 0)
    tasks = [next(it) for _ in range(a.n)]
    sandbox = Sandbox("bwrap")
    workers = a.workers or sandbox.max_concurrency
    print(f"multiturn overhead: {a.n} concurrent level-{a.level} repair episodes, {workers} parallel actions, "
          f"{os.cpu_count()} CPUs, model {a.model}", file=sys.stderr)
    from honing.models import load_tokenizer
    from honing.rollout.show import model_engine

    rows = []
    try:
        tok = load_tokenizer(a.model) if a.skip_model else None
        engine = None
        if not a.skip_model:
            engine, tok = model_engine(a.model, 0)
        ref_cfg = MultiTurnConfig(max_turns=8, context_tokens=1 << 20, max_total_tokens=1 << 22)

        def scripted(eps: list[Episode]) -> Any:
            return RoutedEngine([(tuple(e.prompt_ids), ScriptedEngine(tok, reference_script(e.task))) for e in eps])

        rows.append(run_batch("reference", tasks, tok, scripted, sandbox, ref_cfg,
                              SamplingParams(max_new_tokens=1 << 14, n=1), workers))
        if not a.skip_model:
            cfg = MultiTurnConfig(max_turns=a.gen_turns, max_parse_errors=a.gen_turns + 1)
            rows.append(run_batch("model", tasks, tok, lambda _eps: engine, sandbox, cfg,
                                  SamplingParams(max_new_tokens=a.max_new_tokens, temperature=1.0, n=1), workers))
    finally:
        sandbox.close()
    table(rows)
    ref = rows[0]
    gen_bt = rows[1]["gen_bt"] if len(rows) > 1 else float("nan")
    print(f"RATIO sandbox_vs_generation={ref['sandbox_bt'] / gen_bt:.4f}")
    print(f"overhead_per_turn_ms={ref['overhead_bt'] * 1000:.1f}")


if __name__ == "__main__":
    main()
