"""Resuming a run: which checkpoint to go back to, whether it is intact, and loading it.

A checkpoint is trusted only if its manifest lists every file with a matching sha256. A damaged
one is never used silently: the error names it and offers the newest intact one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from honing.schedule.runlog import file_sha256
from honing.schedule.state import RunState, StateError

INITIAL = "initial"  # the step-0 "checkpoint": the starting policy (after SFT, if any)


def checkpoint_problem(path: Path) -> str | None:
    """None if the checkpoint at `path` is intact, else what is wrong with it."""
    man = path / "manifest.json"
    if not path.is_dir():
        return f"{path} is missing"
    try:
        files = json.loads(man.read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"{man} is unreadable ({type(e).__name__})"
    for rel, digest in files.items():
        f = path / rel
        if not f.is_file():
            return f"{f} is missing"
        if file_sha256(f) != digest:
            return f"{f} does not match its sha256 in the manifest (truncated or corrupted)"
    return None


def good_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Intact step checkpoints on disk, newest first (for messages when the state is unusable)."""
    out = []
    for p in (run_dir / "checkpoints").glob("*"):
        man = p / "manifest.json"
        if p.is_dir() and man.is_file() and checkpoint_problem(p) is None:
            out.append((int(json.loads(man.read_text()).get("step", -1)), p))
    return sorted(out, key=lambda x: x[0], reverse=True)


def open_state(run_dir: Path) -> RunState:
    """The run's state for a resume, or a clear error that offers the last good checkpoint."""
    try:
        return RunState(run_dir / "state.sqlite")
    except StateError as e:
        good = good_checkpoints(run_dir)
        hint = (f"; the last good checkpoint is {good[0][1]} (step {good[0][0]}): start a new run from its weights "
                f"with `honing train model.name={good[0][1]}`") if good else "; no intact checkpoint was found"
        raise StateError(f"cannot resume {run_dir}: {e}{hint}") from None


def choose_step(state: RunState, run_dir: Path, from_step: int | None) -> dict:
    """The committed checkpoint step to resume from: the newest (or `from_step`), verified."""
    rows = state.checkpoint_steps()
    if from_step is not None:
        rows = [r for r in rows if r["step"] <= from_step]
        if not rows or rows[0]["step"] != from_step:
            have = ", ".join(str(r["step"]) for r in state.checkpoint_steps()) or "none"
            raise StateError(f"--from-step {from_step}: no committed checkpoint at that step (have: {have})")
    if not rows:
        raise StateError(f"{run_dir}: no committed step to resume from")
    row = rows[0]
    if row["checkpoint"] != INITIAL:
        problem = checkpoint_problem(Path(row["checkpoint"]))
        if problem:
            older = [r for r in rows[1:] if r["checkpoint"] == INITIAL or checkpoint_problem(Path(r["checkpoint"])) is None]
            hint = (f"; the last good checkpoint is step {older[0]['step']}: resume from it with "
                    f"`honing train --resume {run_dir} --from-step {older[0]['step']}`") if older else \
                "; no older intact checkpoint is left"
            raise StateError(f"cannot resume {run_dir}: checkpoint of step {row['step']} is damaged: {problem}{hint}")
    return row


def load_weights_into(trainer: Any, ckpt: Path) -> None:
    """Put a checkpoint's weights into the trainer's model (the adapter for LoRA runs)."""
    from safetensors.torch import load_file

    if trainer.lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(trainer.model, load_file(ckpt / "adapter" / "adapter_model.safetensors"))
        return
    load_model_weights(trainer.model, ckpt)


def load_model_weights(model: Any, ckpt: Path) -> None:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        sd.update(load_file(f))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise StateError(f"{ckpt}: weights do not fit the model (missing {sorted(set(missing) - tied)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")


def load_trainer_state(trainer: Any, ckpt: Path) -> None:
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    trainer.load_state(state)
