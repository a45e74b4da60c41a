"""The SFT stage of a run (`sft.steps` > 0; `honing sft` runs it alone): collect graded demonstrations,
screen them against the held-out tasks, write them to `demos.jsonl`, and fine-tune the policy on the
kept ones with the loss on the trajectories' own loss masks.

Resumable: with `sft.checkpoint_every`, progress (weights, optimizer, step) goes to `sft-progress/`
every N steps and after the last one, and a killed run continues from there on `honing train
--resume` with the demonstrations it had collected (read back from demos.jsonl, ids and all), so the
batches and the result are the same; a run killed in the held-out evaluation after SFT resumes at
that evaluation. The held-out evaluation before SFT is kept there too (`before.json`), so a resume
does not decode it again (on a multi-turn domain that is a long evaluation). The progress is removed
once the SFT checkpoint (checkpoints/sft) is written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from honing.errors import HoningError
from honing.train.demos import DemoStats, collect, read_demos, write_demos
from honing.train.sft import loss_tokens, sft
from honing.train.trainer import set_activation_checkpointing

PROGRESS = "sft-progress"
DEMOS = "demos.jsonl"
BEFORE = "before.json"


def _save_progress(run_dir: Path, model: Any, step: int, extra: dict) -> None:
    d = run_dir / PROGRESS
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".state.pt.tmp-{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), **extra, "rng": torch.get_rng_state()}, tmp)
    os.replace(tmp, d / "state.pt")


def _load_progress(run_dir: Path) -> dict | None:
    f = run_dir / PROGRESS / "state.pt"
    return torch.load(f, weights_only=False) if f.exists() else None


def save_before(run_dir: Path, result: dict[str, Any], metrics: dict[str, float], keys: tuple[str, ...]) -> None:
    """Keep the held-out evaluation before SFT (its `keys` and step 0's metrics) for a resume."""
    d = run_dir / PROGRESS
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{BEFORE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"result": {k: result.get(k) for k in keys}, "metrics": metrics}))
    os.replace(tmp, d / BEFORE)


def load_before(run_dir: Path) -> tuple[dict[str, Any], dict[str, float]] | None:
    """The evaluation `save_before` kept, or None (none kept, or an unreadable file: evaluate again)."""
    f = run_dir / PROGRESS / BEFORE
    try:
        d = json.loads(f.read_text())
        return d["result"], d["metrics"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keeps_progress(run_dir: Path) -> tuple[bool, bool]:
    """What a resume of a run killed before step 0 committed keeps: (the progress folder, the
    demonstrations). The folder when it holds SFT progress or the before-evaluation; the
    demonstrations only with SFT progress (the batches were drawn from them)."""
    d = run_dir / PROGRESS
    state = (d / "state.pt").exists()
    return state or (d / BEFORE).exists(), state


def clear_progress(run_dir: Path) -> None:
    shutil.rmtree(run_dir / PROGRESS, ignore_errors=True)


def demonstrations_for(r: Any, progress_state: dict | None) -> list:
    """The run's demonstrations: collected now, or (resuming mid-SFT) read back from demos.jsonl."""
    path = r.dir / DEMOS
    if progress_state is not None and path.exists():
        return read_demos(path)
    with r.progress.phase(f"SFT demonstrations ({r.cfg.sft.source})"):
        demos = collect(r.cfg, r.setup, r.tok, r.engine)
    write_demos(path, demos)
    return demos


def run_sft_stage(r: Any, should_stop: Any = None) -> dict[str, float]:
    """Fine-tune `r.model` in place on the kept demonstrations. Returns the stage's metrics.
    `should_stop()` true after a step (a stop signal): that step's progress is saved and the
    stage returns early (the caller stops the run; `--resume` continues from there)."""
    cfg, s = r.cfg, r.cfg.sft
    state = _load_progress(r.dir)
    demos = demonstrations_for(r, state)
    stats = DemoStats.of(demos)
    r.progress.note(f"SFT demonstrations from {s.source}: {stats.line()} (details: {r.dir / DEMOS})")
    kept = [d for d in demos if d.kept]
    if not kept:
        first = next((d.reason for d in demos if d.reason), "")
        raise HoningError(f"sft.source={s.source}: no usable demonstration ({stats.line()}); first reason: "
                          f"{first[:200]}; see {r.dir / DEMOS}")
    model = r.model
    if s.lora:
        from honing.train.trainer import apply_lora

        model = apply_lora(model, cfg.model.lora)
    start, opt_state = 0, None
    if state is not None:
        model.load_state_dict(state["model"])
        start, opt_state = int(state["step"]), state["optimizer"]
        r.progress.note(f"SFT: resuming at step {start} of {s.steps}")
    bar = r.progress.bar("SFT warm start", s.steps, completed=start, every_s=10.0)
    if s.gradient_checkpointing:
        set_activation_checkpointing(model, True)
    losses = sft(model, kept, r.tok.pad_token_id, s.steps, s.learning_rate, s.batch_size, cfg.model.bf16_autocast,
                 cfg.seed, on_step=lambda i, loss: bar.advance(f"loss {loss:.3f}"), pack_tokens=s.pack_tokens,
                 micro_batch_tokens=s.micro_batch_tokens, chunk_tokens=cfg.train.logprob_chunk_tokens,
                 start_step=start, optimizer_state=opt_state, checkpoint_every=s.checkpoint_every,
                 on_checkpoint=lambda step, extra: _save_progress(r.dir, model, step, extra),
                 should_stop=should_stop)
    if s.gradient_checkpointing:
        set_activation_checkpointing(model, False)  # RL follows train.gradient_checkpointing
    if s.lora:  # the adapters folded into the weights: RL (and its KL reference) start from the SFT policy
        r.model = model.merge_and_unload().requires_grad_(True)  # peft froze the base; RL trains it
    m = {f"sft/demos_{k}": float(v) for k, v in stats.counts.items()}
    m.update({"sft/final_loss": losses[-1] if losses else float("nan"), "sft/demos_used": float(len(kept)),
              "sft/loss_tokens": float(sum(loss_tokens(d) for d in kept))})
    r.state.set_meta("sft", {"source": s.source, "counts": stats.counts, "losses": losses, "resumed_at": start})
    return m
