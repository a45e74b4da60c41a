"""The model card (README.md) of a release, generated from its evaluation JSON, recipe and provenance."""

from __future__ import annotations

import yaml


def _metric(block: dict, key: str) -> str:
    v = block.get(key)
    if v is None:
        return "-"
    ci = (block.get("ci") or {}).get(key)
    return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{v:.3f}"


def eval_table(result: dict) -> list[str]:
    """Markdown rows: per domain (and all) pass@1, pass@k, maj@k with 95% bootstrap CIs."""
    meta = result.get("meta", {})
    k = int(meta.get("samples_per_task", 1))
    keys = ["pass@1"] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
    lines = [f"Suite `{meta.get('suite')}` v{meta.get('suite_version')}: {meta.get('n_tasks')} held-out tasks x "
             f"{k} samples, seed {meta.get('seed')}, engine {meta.get('engine')}. 95% bootstrap CIs over tasks.", "",
             "| domain | tasks | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
    rows = sorted(result.get("domains", {}).items())
    if len(rows) > 1 and result.get("overall"):
        rows.append(("all", result["overall"]))
    for d, block in rows:
        lines.append(f"| {d} | {block.get('n_tasks')} | " + " | ".join(_metric(block, m) for m in keys) + " |")
    return lines


def model_card(name: str, variant: str, prov: dict, result: dict | None, fast: dict | None, config: dict) -> str:
    out = [f"# {name}", "", f"A honing release ({variant} variant) of `{prov.get('base_model') or 'a model'}`.",
           "Load it with `transformers.AutoModelForCausalLM.from_pretrained(<this directory>)`, or serve it with "
           f"`honing serve release:{name}`.", "", "## Evaluation", ""]
    out += eval_table(result) if result else ["No evaluation was attached (create with --suite or --eval)."]
    if fast:
        out += ["", "## Fast variant", "",
                f"Chosen by measurement: **{fast['method']}** ({fast.get('reason', '')}).", "",
                "| variant | tokens/s (1 stream, greedy) | held-out pass@1 [95% CI] |", "|---|---:|---:|"]
        for c in fast.get("candidates", []):
            p1, ci = c.get("pass@1"), c.get("ci")
            cell = "-" if p1 is None else (f"{p1:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{p1:.3f}")
            out.append(f"| {c['method']} | {c['tokens_per_s']:.1f} | {cell} |")
        out += ["", f"Speed-up of the chosen variant: {fast.get('speedup', 1.0):.2f}x output tokens/s "
                f"({fast.get('measured_on', '')})."]
    out += ["", "## Provenance", "",
            f"- run: `{prov.get('run')}`", f"- checkpoint: `{prov.get('checkpoint')}` (step {prov.get('step')}, "
            f"weights {prov.get('weights')})", f"- parent release: {prov.get('parent') or '-'}",
            f"- data snapshot: {prov.get('data_snapshot') or '-'}"]
    for s in prov.get("task_sources") or []:
        out.append(f"- task source: `{s.get('name') if isinstance(s, dict) else s}`")
    th = prov.get("training_heldout") or {}
    if th.get("heldout_before") and th.get("heldout_after"):
        out.append(f"- training held-out pass@1: {th['heldout_before'].get('pass@1')} -> "
                   f"{th['heldout_after'].get('pass@1')}")
    if config:
        t = config.get("train", {}) or {}
        lora = (config.get("model") or {}).get("lora") or {}
        out += ["", "## Recipe", "",
                f"model `{(config.get('model') or {}).get('name')}`, {t.get('steps')} RL steps, learning rate "
                f"{t.get('learning_rate')}, LoRA: {'yes' if lora.get('enabled') else 'no'}.",
                "", "<details><summary>Full config (recipe.yaml)</summary>", "", "```yaml",
                yaml.safe_dump(config, sort_keys=False).rstrip(), "```", "</details>"]
    return "\n".join(out) + "\n"
