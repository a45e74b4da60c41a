"""Run directory writing: metrics.jsonl, TensorBoard events, atomic checkpoints, summary."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunLog:
    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(self.dir / "metrics.jsonl", "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb: Any = SummaryWriter(str(self.dir / "tb"), purge_step=purge_step)
        except ImportError:  # tensorboard is a declared dependency; keep going without it
            self.tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        self.metrics.close()
        if self.tb is not None:
            self.tb.close()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(ckpt_dir: Path, model: Any, tokenizer: Any, trainer_state: dict, step: int,
                    adapter_model: Any = None) -> Path:
    """HF-loadable safetensors dir (+ adapter/ for LoRA, + trainer_state.pt), written to a temp
    dir and renamed into place; manifest.json holds each file's sha256."""
    from honing.models import quiet_progress

    tmp = ckpt_dir.with_name(f".{ckpt_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_progress():  # our progress display owns the terminal
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if adapter_model is not None:
        adapter_model.save_pretrained(tmp / "adapter")
    rng = {"torch": torch.get_rng_state()}
    torch.save({**trainer_state, "rng": rng, "global_step": step}, tmp / "trainer_state.pt")
    files = {str(p.relative_to(tmp)): file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "manifest.json").write_text(json.dumps({"step": step, "files": files}, indent=1))
    if ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    os.replace(tmp, ckpt_dir)
    return ckpt_dir


def prune_checkpoints(ckpt_root: Path, keep_last: int) -> None:
    steps = sorted((int(p.name.split("-")[1]), p) for p in ckpt_root.glob("step-*") if p.name.split("-")[1].isdigit())
    for _, p in steps[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
