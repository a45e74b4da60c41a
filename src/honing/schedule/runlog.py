"""Run directory writing: metrics.jsonl, reporters (TensorBoard, wandb, MLflow), atomic checkpoints, summary."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import torch


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunLog:
    """metrics.jsonl plus the reporters `report_to` names (TensorBoard by default; see reporters.py)."""

    def __init__(self, run_dir: Path, purge_step: int | None = None, report_to: Iterable[str] = ("tensorboard",),
                 config: dict | None = None, name: str | None = None, resume: bool = False) -> None:
        from honing.schedule.reporters import Reporters

        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.reporters = Reporters(list(report_to), run_dir, name or run_dir.name, config or {}, purge_step, resume)
        self.metrics = open(self.dir / "metrics.jsonl", "a")
        atexit.register(self._abandoned)  # after the reporters' own hooks, so it runs before them

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        self.reporters.log(step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def close(self, status: str = "finished") -> None:
        """status: finished, stopped (a clean stop on request) or failed."""
        atexit.unregister(self._abandoned)
        self.metrics.close()
        self.reporters.close(status)

    def _abandoned(self) -> None:  # the process is exiting without close(): an error or a second Ctrl-C
        self.reporters.close("failed")


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
