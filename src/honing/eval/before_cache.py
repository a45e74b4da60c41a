"""Reuse the held-out evaluation of the initial policy across runs (`eval.reuse_before`).

Every run evaluates its starting weights on the held-out tasks first, and for the same base model,
tasks and settings the answer is the same every time: on a multi-turn domain that is the longest
evaluation of the run (repair: 17 min on 2 cores for a model that never calls a tool). With
`eval.reuse_before: true` a run looks the evaluation up under `$HONING_HOME/evals/` and decodes it
only when nothing matches, then stores it for the next run.

A stored evaluation is reused only when its key matches exactly. The key is a digest of:
- the weights, hashed tensor by tensor (a local checkpoint path that was overwritten does not match);
- the held-out tasks, each serialized whole (prompt, hidden tests, verifier spec);
- every setting that changes what the evaluation decodes or how it is graded: the seed, `model`,
  `generation`, `verify`, `reward`, `rollout`, `sandbox`, `eval` (not `every_steps` or `reuse_before`),
  `plugins` and `run.deterministic`;
- the code: honing's own source files and the files of the task sources' and plugins' modules.
What the key does not cover: installed packages (transformers, reasoning_gym's scorers), a sandbox
toolchain outside honing (the cad profile's build123d) and the machine. Delete `$HONING_HOME/evals/`
after upgrading them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from honing.config import RunConfig
from honing.models import honing_home
from honing.schedule.runlog import atomic_write_text
from honing.tasks import task_to_json

CACHE_DIR = "evals"
SECTIONS = ("model", "generation", "verify", "reward", "rollout", "sandbox", "eval", "plugins")
NOT_IN_KEY = {"eval": ("every_steps", "reuse_before")}


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the state dict (name, dtype, shape, bytes), in name order."""
    def parts() -> Iterable[bytes]:
        for name, t in sorted(model.state_dict().items()):
            t = t.detach().to("cpu").contiguous()
            yield f"{name}|{t.dtype}|{tuple(t.shape)}".encode()
            yield t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return _digest(parts())


def settings_digest(cfg: RunConfig) -> str:
    d = cfg.model_dump(mode="json")
    keep = {k: d[k] for k in SECTIONS}
    for section, keys in NOT_IN_KEY.items():
        keep[section] = {k: v for k, v in keep[section].items() if k not in keys}
    keep["seed"], keep["deterministic"] = d["seed"], d["run"]["deterministic"]
    return _digest([json.dumps(keep, sort_keys=True).encode()])


def code_files(sources: Iterable[Any], plugins: Iterable[str] = ()) -> list[Path]:
    """honing's own .py files and the module files of the task sources and plugins."""
    root = Path(__file__).resolve().parents[1]
    files = set(root.rglob("*.py"))
    for src in sources:
        f = inspect.getsourcefile(type(getattr(src, "wrapped", src)))  # a TaggedSource: the source's own module
        if f:
            files.add(Path(f).resolve())
    for name in plugins:
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None) if mod else (name if name.endswith(".py") else None)
        if f and Path(f).is_file():
            files.add(Path(f).resolve())
    return sorted(files)


def code_digest(files: Iterable[Path]) -> str:
    return _digest(x for f in files for x in (str(f).encode(), f.read_bytes()))


def tasks_digest(tasks: Iterable[Any]) -> str:
    return _digest(json.dumps(task_to_json(t), sort_keys=True, default=str).encode() for t in tasks)


def before_key(cfg: RunConfig, model: torch.nn.Module, heldout: list, sources: list) -> tuple[str, dict[str, str]]:
    """(the key, its parts) of the evaluation of `model` on `heldout` under `cfg`."""
    parts = {"weights": weights_digest(model), "tasks": tasks_digest(heldout), "settings": settings_digest(cfg),
             "code": code_digest(code_files(sources, cfg.plugins))}
    return _digest(f"{k}={v}".encode() for k, v in sorted(parts.items())), parts


def cache_path(key: str) -> Path:
    return honing_home() / CACHE_DIR / f"before-{key[:32]}.json"


def load(key: str) -> tuple[dict[str, Any], dict[str, float], str] | None:
    """(result, step-0 metrics, the run that evaluated it) stored under `key`, or None. A file that
    cannot be read or whose full key differs counts as no match (the evaluation runs again)."""
    try:
        d = json.loads(cache_path(key).read_text())
        if d["key"] != key:
            return None
        return d["result"], d["metrics"], d["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(key: str, parts: dict[str, str], result: dict[str, Any], metrics: dict[str, float], run: Path) -> Path:
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"key": key, "parts": parts, "run": str(run), "result": result,
                                        "metrics": metrics}))
    return path
