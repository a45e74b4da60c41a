"""Multi-stage recipes (`stages:`): sft → rl, rl → rejection → rl, each stage a whole honing run.

A stage is the recipe with its own dotted changes (`set:`), started from the previous stage's final
weights (`model.name` = that stage's final checkpoint, an HF directory with LoRA merged). `kind: sft`
runs the SFT stage alone (`train.steps` = 0: e.g. `sft.source: rejection`, best-of-n of the policy the
previous RL stage left, verified); `kind: rl` runs GRPO alone (`sft.steps` = 0). Each stage writes its
own run directory, `<run>/stages/NN-<name>/`, with everything `honing train` writes there.

Why whole runs rather than phases inside one loop: every stage keeps the run directory's guarantees
(resume after kill -9, checkpoints, held-out evaluation before and after, the report) without a
second code path. Resume: a stage with a summary.json is done and skipped; a stage that has a
config.yaml but no summary is resumed where it stopped; later stages start fresh.
The cost: each stage evaluates its initial policy again (the previous stage's final evaluation, on
the same held-out tasks); greedy evaluation makes the two equal, which the summary table shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from honing.config import RunConfig, StageConfig, _explain, _set_dotted, dump_config
from honing.errors import ConfigError
from honing.eval.metrics import heldout_deltas

STAGES_DIR = "stages"


def stage_dir(run_dir: Path, i: int, stage: StageConfig) -> Path:
    return run_dir / STAGES_DIR / f"{i + 1:02d}-{stage.name}"


def stage_config(cfg: RunConfig, i: int, stage: StageConfig, model_dir: Path | None) -> RunConfig:
    """The recipe as stage i runs it: its `set:` applied, the other kind's steps off, and the previous
    stage's weights as the model. Errors name `stages[i]` and the key."""
    data: dict[str, Any] = cfg.model_dump(mode="json")
    data["stages"] = []
    where = f"stages[{i}] ({stage.name})"
    for key, value in stage.set.items():
        if key.split(".")[0] == "stages":
            raise ConfigError(f"{where}: set.{key}: a stage cannot change the stage list")
        _set_dotted(data, key.split("."), value)
    if stage.kind == "rl":
        data["sft"]["steps"] = 0
    else:
        data["train"]["steps"] = 0
    if model_dir is not None:
        data["model"]["name"] = str(model_dir)
    try:
        out = RunConfig.model_validate(data)
    except ValidationError as e:
        raise _explain(e, f"{where} set") from None
    steps = out.train.steps if stage.kind == "rl" else out.sft.steps
    if steps <= 0:
        key = "train.steps" if stage.kind == "rl" else "sft.steps"
        raise ConfigError(f"{where}: kind {stage.kind} needs {key} > 0 (in the recipe or the stage's set)")
    return out


def check_stages(cfg: RunConfig) -> None:
    """Every stage's config validates (before anything runs or is written)."""
    names = [s.name for s in cfg.stages]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"stages: names must be unique (repeated: {', '.join(dup)})")
    for i, st in enumerate(cfg.stages):
        stage_config(cfg, i, st, None)


def _row(stage: StageConfig, summary: dict[str, Any]) -> dict[str, Any]:
    b, a = summary.get("heldout_before") or {}, summary.get("heldout_after") or {}
    return {"stage": stage.name, "kind": stage.kind,
            "steps": summary.get("steps") if stage.kind == "rl" else len((summary.get("sft") or {}).get("losses") or []),
            "pass@1_before": b.get("pass@1"), "pass@1_after": a.get("pass@1"),
            "final_checkpoint": summary.get("final_checkpoint"), "wall_s": summary.get("wall_s")}


def run_stages(cfg: RunConfig, run_dir: Path, show_progress: bool = False, resume: bool = False,
               plain_progress: bool = False) -> dict[str, Any]:
    """Run the stages in order; returns (and writes to run_dir/summary.json) the per-stage summary.
    The first stage's held-out before and the last stage's after are the run's."""
    from honing.schedule.loop import train

    check_stages(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    model_dir: Path | None = None
    rows, summaries = [], []
    started_fresh = False
    for i, st in enumerate(cfg.stages):
        d = stage_dir(run_dir, i, st)
        scfg = stage_config(cfg, i, st, model_dir)
        done = d / "summary.json"
        if resume and not started_fresh and done.exists():
            summary = json.loads(done.read_text())
        else:
            again = resume and not started_fresh and (d / "config.yaml").exists()
            started_fresh = started_fresh or not again
            summary = train(scfg, d, show_progress=show_progress, resume=again, plain_progress=plain_progress)
        summaries.append(summary)
        rows.append(_row(st, summary))
        model_dir = Path(summary["final_checkpoint"])
    # pass@1 with CIs after every stage, and the paired CI of every stage against every earlier one
    ci = heldout_deltas({"before": summaries[0].get("heldout_before"),
                         **{st.name: s.get("heldout_after") for st, s in zip(cfg.stages, summaries)}})
    out = {"stages": rows, "heldout_ci": ci, "heldout_before": summaries[0].get("heldout_before"),
           "heldout_after": summaries[-1].get("heldout_after"),
           "final_checkpoint": summaries[-1]["final_checkpoint"],
           "wall_s": sum(float(s.get("wall_s") or 0.0) for s in summaries)}
    (run_dir / "summary.json").write_text(json.dumps(out, indent=1))
    return out


def stage_table(summary: dict[str, Any]) -> list[str]:
    """The per-stage lines `honing train` prints for a staged recipe: pass@1 after each stage with its
    95% CI, and the paired CI of each stage against the one before it."""
    ci = summary.get("heldout_ci") or {"pass@1": {}, "delta": {}}
    lines = [f"{'stage':<16}{'kind':<6}{'steps':>6}   pass@1 [95% CI]         vs previous stage (paired)"]
    prev = "before"
    for name, kind, steps in [("before", "", None)] + [(r["stage"], r["kind"], r["steps"]) for r in summary["stages"]]:
        m = ci["pass@1"].get(name)
        cell = f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]" if m else "-"
        d = ci["delta"].get(f"{name}-{prev}") if name != prev else None
        dcell = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else ""
        lines.append(f"{name:<16}{kind:<6}{'' if steps is None else steps:>6}   {cell:<24}{dcell}")
        prev = name
    return lines
