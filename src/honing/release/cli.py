"""`honing release ...` and `honing export` (registered in honing/cli.py). Errors are one line, exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

release_app = typer.Typer(help="Versioned releases: create, list, show, promote (gated), rollback, diff.",
                          no_args_is_help=True)
REGISTRY = typer.Option(None, "--registry", help="Registry directory (default $HONING_RELEASES or ./releases)")


def _console():  # noqa: ANN202
    from honing.eval.cli import Console

    return Console()


@release_app.command("create")
def create_cmd(
    source: str = typer.Argument(..., help="RUN, RUN@step-N (or RUN@N), or a model directory"),
    name: str = typer.Option(..., "--name", help="Release name (letters, digits, . _ -)"),
    suite: Optional[str] = typer.Option(None, "--suite", help="Evaluate the release on this suite now (model card, gate)"),
    eval_json: Optional[Path] = typer.Option(None, "--eval", help="Attach an existing evaluation JSON instead"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="With --suite: at most this many tasks per source"),
    variant: str = typer.Option("standard", "--variant", help="standard, or fast (measured options; needs --suite)"),
    parent: Optional[str] = typer.Option(None, "--parent", help="Parent release (default: the current one)"),
    data_snapshot: Optional[str] = typer.Option(None, "--data-snapshot", help="Data snapshot id (default: the "
                                                "run's pool: sources)"),
    registry: Optional[Path] = REGISTRY,
) -> None:
    """Build an immutable, checksummed release directory and register it with its lineage."""
    from honing.release.build import create

    if suite and eval_json:
        from honing.errors import HoningError

        raise HoningError("give --suite or --eval, not both")
    rel = create(source, name, registry=registry, eval_json=eval_json, suite=suite, limit=limit, variant=variant,
                 parent=parent, data_snapshot=data_snapshot)
    typer.echo(f"release {rel.name} ({rel.variant}) at {rel.path}: run {rel.run}, step {rel.step}, "
               f"parent {rel.parent or '-'}, sha256 {rel.digest[:16]}")
    fast = rel.meta.get("fast")
    if fast:
        for c in fast["candidates"]:
            typer.echo(f"  {c['method']:<13} {c['tokens_per_s']:8.1f} tokens/s  pass@1 {c['pass@1']}  ci {c['ci']}"
                       f"{'  <- chosen' if c['method'] == fast['method'] else ''}")
        typer.echo(f"  fast variant: {fast['method']} ({fast['speedup']:.2f}x): {fast['reason']}")


@release_app.command("list")
def list_cmd(registry: Optional[Path] = REGISTRY) -> None:
    """Every release, oldest first; * marks the current one."""
    from honing.release.registry import Registry

    reg = Registry(registry)
    cur = reg.current()
    for r in reg.list():
        mark = "*" if cur is not None and cur.name == r.name else " "
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created))
        typer.echo(f"{mark} {r.name:<20} {r.variant:<8} {when}  step {r.step}  parent {r.parent or '-'}  "
                   f"run {r.run or '-'}")


@release_app.command("show")
def show_cmd(name: str = typer.Argument(...), registry: Optional[Path] = REGISTRY) -> None:
    """A release's lineage, checksum status and headline evaluation as JSON."""
    from honing.release.ops import show

    typer.echo(json.dumps(show(name, registry), indent=2, default=str))


@release_app.command("promote")
def promote_cmd(
    name: str = typer.Argument(...),
    gate: bool = typer.Option(True, "--gate/--no-gate", help="Refuse on a significant regression against the "
                              "current release (honing eval compare on their evaluations)"),
    level: float = typer.Option(0.95, "--level", help="Confidence level of the gate's paired bootstrap"),
    registry: Optional[Path] = REGISTRY,
) -> None:
    """Make NAME the current release (what `honing serve release:current` serves)."""
    from honing.eval.compare import compare_table
    from honing.release.ops import PromoteRefused, promote

    try:
        out = promote(name, registry, gate, level)
    except PromoteRefused as e:
        _console().print(compare_table(e.comparison, "current", name))
        raise
    if out["comparison"] is not None:
        _console().print(compare_table(out["comparison"], out["previous"], name))
    typer.echo(f"current: {name} (was {out['previous'] or '-'})")


@release_app.command("rollback")
def rollback_cmd(to: Optional[str] = typer.Option(None, "--to", help="Release to point at (default: the one "
                                                  "current before this one)"),
                 registry: Optional[Path] = REGISTRY) -> None:
    """Point `current` back: one registry update; a server following release:current switches on its next poll."""
    from honing.release.ops import rollback

    out = rollback(registry, to)
    typer.echo(f"current: {out['current']} (was {out['previous']})")


@release_app.command("diff")
def diff_cmd(a: str = typer.Argument(...), b: str = typer.Argument(...), registry: Optional[Path] = REGISTRY) -> None:
    """What differs between releases A and B: lineage, files, recipe, and evaluation (B - A)."""
    from honing.eval.compare import compare_table
    from honing.release.ops import diff

    d = diff(a, b, registry)
    for f, (x, y) in d["fields"].items():
        typer.echo(f"{f:<14} {x} -> {y}")
    typer.echo(f"files differing: {', '.join(d['files']) or 'none'}")
    for line in d["recipe_diff"]:
        typer.echo(line)
    if d["comparison"] is not None:
        _console().print(compare_table(d["comparison"], a, b))


def export_cmd(
    source: str = typer.Argument(..., help="RUN, RUN@step-N, a model directory, or release:NAME"),
    out: Path = typer.Option(..., "--out", help="New directory for the plain HF model"),
) -> None:
    """Write a plain Hugging Face directory (weights with LoRA merged, tokenizer) for use elsewhere."""
    from honing.release.build import export

    typer.echo(str(export(source, out)))
