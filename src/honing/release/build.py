"""`honing release create` and `honing export`: a checkpoint becomes a plain HF directory (LoRA
merged), then, for a release, an immutable checksummed directory with its evaluation, recipe,
provenance and model card, registered with its lineage.

A release is built in `<root>/.tmp-<name>-<pid>` and renamed into place only when complete, and
registered after that; a failure at any point leaves no release and no registry row.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from honing.errors import HoningError
from honing.release.registry import Registry, Release, check_name, sha256_file

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json",
            "tokenizer.model")


def resolve_source(source: str) -> tuple[Path, Path | None, int | None]:
    """`RUN`, `RUN@step-N`, `RUN@N` or a model directory -> (checkpoint dir, run dir or None, step)."""
    from honing.eval.runner import _checkpoint_of, is_run_dir

    base, sep, step = source.rpartition("@")
    if sep and step.isdigit():
        step = f"step-{step}"
    run = Path(base if sep else source).expanduser()
    if sep and not step.startswith("step-") and step not in ("final", "sft"):
        raise HoningError(f"{source!r}: expected RUN@step-N (or RUN@N)")
    if not run.exists():
        raise HoningError(f"{run}: no such run or model directory")
    if is_run_dir(run):
        ck = _checkpoint_of(run, step if sep else None)
    elif sep:
        raise HoningError(f"{run} is not a run directory (no checkpoints/, config.yaml or metrics.jsonl)")
    else:
        ck, run = run, None  # a model directory of its own
    n = None
    man = ck / "manifest.json"
    if man.is_file():
        n = json.loads(man.read_text()).get("step")
    if n is None and ck.name.startswith("step-") and ck.name[5:].isdigit():
        n = int(ck.name[5:])
    return ck, run, n


def materialize(ckpt: Path, out: Path) -> str:
    """Write `ckpt`'s weights as a plain HF directory at `out`. A checkpoint holds merged weights
    already (the trainer exports LoRA merged); a bare LoRA adapter directory (adapter_config.json,
    no full weights) is merged into its base model here. Returns how: 'copied' or 'merged'."""
    out.mkdir(parents=True, exist_ok=True)
    full = list(ckpt.glob("*.safetensors")) + list(ckpt.glob("model*.safetensors.index.json"))
    full = [p for p in full if not p.name.startswith("adapter")]
    if full and (ckpt / "config.json").is_file():
        for p in full + [ckpt / f for f in HF_FILES if (ckpt / f).is_file()]:
            shutil.copy2(p, out / p.name)
        return "copied"
    adapter = ckpt if (ckpt / "adapter_config.json").is_file() else ckpt / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise HoningError(f"{ckpt}: neither HF weights (config.json + *.safetensors) nor a LoRA adapter")
    from peft import PeftModel

    from honing.models import load_policy

    base_spec = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_spec:
        raise HoningError(f"{adapter}/adapter_config.json names no base model (base_model_name_or_path)")
    model, tok = load_policy(base_spec)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return "merged"


def export(source: str, out: Path) -> Path:
    """`honing export`: a plain HF directory (weights with LoRA merged, tokenizer) for use elsewhere."""
    from honing.serve.model import RELEASE_PREFIX

    if out.exists() and any(out.iterdir()):
        raise HoningError(f"export: {out} exists and is not empty")
    if source.startswith(RELEASE_PREFIX):
        name = source[len(RELEASE_PREFIX):]
        reg = Registry()
        rel = reg.current() if name == "current" else reg.get(name)
        if rel is None:
            raise HoningError("export release:current: no current release")
        reg.verify(rel.name)
        ckpt: Path = Path(rel.path)
    else:
        ckpt = resolve_source(source)[0]
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    materialize(ckpt, tmp)
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return out


def data_snapshot_of(config: dict) -> str | None:
    """The flywheel pool snapshots (`pool:<dir>@<version>`) a run's tasks came from, if any."""
    srcs = [s.get("name", "") if isinstance(s, dict) else str(s) for s in
            (config.get("tasks", {}) or {}).get("sources", []) or []]
    pools = [s for s in srcs if s.startswith("pool:")]
    return ",".join(pools) or None


def _evaluate(model_dir: Path, suite: str, limit: int | None, engine: Any = None, tok: Any = None) -> dict:
    from honing.eval.runner import evaluate_suite
    from honing.eval.suite import load_suite

    return evaluate_suite(str(model_dir), load_suite(suite), limit=limit, engine=engine, tokenizer=tok)


def _seal(d: Path) -> str:
    """Write manifest.json (sha256 per file), make everything read-only; the manifest's own sha256."""
    files = {str(p.relative_to(d)): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}
    (d / "manifest.json").write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    for p in d.rglob("*"):
        os.chmod(p, 0o444 if p.is_file() else 0o555)
    digest = sha256_file(d / "manifest.json")
    os.chmod(d / "manifest.json", 0o444)
    os.chmod(d, 0o555)
    return digest


def create(source: str, name: str, *, registry: Path | str | None = None, eval_json: Path | None = None,
           suite: str | None = None, limit: int | None = None, variant: str = "standard",
           parent: str | None = None, data_snapshot: str | None = None, notes: str = "") -> Release:
    """Build and register release `name` from `source` (RUN[@step-N] or a model directory).

    Evaluation: `eval_json` (an existing `honing eval --out` file) or `suite` (evaluated now on the
    release's weights, `limit` tasks per source). `variant='fast'` measures the fast options
    (release/fast.py) on the suite and keeps the fastest that holds pass@1 within the CI.
    The parent is the current release unless given."""
    import yaml

    from honing.release.card import model_card

    check_name(name)
    if variant not in ("standard", "fast"):
        raise HoningError(f"--variant {variant!r}: standard or fast")
    if variant == "fast" and suite is None:
        raise HoningError("--variant fast needs --suite: the fast option is chosen by measuring pass@1 on it")
    reg = Registry(registry)
    reg.root.mkdir(parents=True, exist_ok=True)
    if (reg.root / name).exists() or any(r.name == name for r in reg.list()):
        raise HoningError(f"release {name!r} already exists in {reg.root}")
    if parent is not None:
        reg.get(parent)
    else:
        cur = reg.current()
        parent = cur.name if cur is not None else None
    ckpt, run, step = resolve_source(source)
    config: dict = {}
    if run is not None and (run / "config.yaml").is_file():
        config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    data_snapshot = data_snapshot or data_snapshot_of(config)
    tmp = reg.root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        how = materialize(ckpt, tmp)
        result: dict | None = None
        if eval_json is not None:
            from honing.eval.runner import load_result

            result = load_result(Path(eval_json))
        elif suite is not None:
            result = _evaluate(tmp, suite, limit)
        if result is not None:
            (tmp / "eval.json").write_text(json.dumps(result, indent=1, default=str))
        fast_info = None
        if variant == "fast":
            from honing.release.fast import choose_fast

            fast_info = choose_fast(tmp, suite, limit, result)  # type: ignore[arg-type]
        if config:
            (tmp / "recipe.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        provenance = {"source": source, "checkpoint": str(ckpt.resolve()), "run": str(run.resolve()) if run else None,
                      "step": step, "weights": how, "parent": parent, "data_snapshot": data_snapshot,
                      "task_sources": (config.get("tasks", {}) or {}).get("sources"),
                      "base_model": (config.get("model", {}) or {}).get("name"), "created": time.time(),
                      "notes": notes}
        if run is not None and (run / "summary.json").is_file():
            s = json.loads((run / "summary.json").read_text())
            provenance["training_heldout"] = {k: s.get(k) for k in ("heldout_before", "heldout_after", "heldout_ci")}
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=1, default=str))
        (tmp / "README.md").write_text(model_card(name, variant, provenance, result, fast_info, config))
        digest = _seal(tmp)
        final = reg.root / name
        os.replace(tmp, final)
    except BaseException:
        _force_rmtree(tmp)
        raise
    rel = Release(name, time.time(), str(final.resolve()), variant, str(run.resolve()) if run else None, step,
                  parent, data_snapshot, digest,
                  {"source": source, "weights": how, "suite": (result or {}).get("meta", {}).get("suite"),
                   "fast": fast_info})
    try:
        reg.add(rel)
    except BaseException:
        _force_rmtree(final)
        raise
    return rel


def _force_rmtree(d: Path) -> None:
    if not d.exists():
        return
    for p in [d, *d.rglob("*")]:
        if p.is_dir():
            os.chmod(p, 0o755)
    shutil.rmtree(d, ignore_errors=True)
