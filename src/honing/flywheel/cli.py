"""`honing flywheel ingest LOGS --out POOL` and `honing flywheel status POOL`.

Heavy imports (Presidio, spaCy) happen inside the commands, so `honing --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

flywheel_app = typer.Typer(help="The data flywheel: de-identified, deduped request logs -> new training tasks.",
                           no_args_is_help=True)


@flywheel_app.command("ingest")
def ingest_cmd(
    logs: list[Path] = typer.Argument(..., help="Log files or directories (serve logs, OpenAI-chat JSONL, .gz, Parquet)"),
    out: Path = typer.Option(..., "--out", help="Pool directory (created; a new snapshot is added to an existing one)"),
    suite: Optional[list[str]] = typer.Option(None, "--suite", help="Evaluation suite whose held-out tasks are "
                                              "excluded (repeatable; default: every built-in suite)"),
    heldout_source: Optional[list[str]] = typer.Option(None, "--heldout-source", help="Also exclude this task "
                                                       "source's held-out split (repeatable), e.g. jsonl:my.jsonl"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Also exclude the held-out splits of this "
                                         "recipe's task sources"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Count and skip corrupt lines instead of stopping at "
                                  "the first (default: stop, naming file:line, and write nothing)"),
    near_dup: float = typer.Option(0.8, "--near-dup", min=0.1, max=1.0, help="Jaccard at which two prompts are "
                                   "near duplicates within the pool"),
    heldout_near_dup: float = typer.Option(0.6, "--heldout-near-dup", min=0.1, max=1.0, help="Jaccard at which "
                                           "a prompt counts as a held-out task's near duplicate (and is dropped)"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
) -> None:
    """De-identify, dedupe and convert logs into a new content-addressed pool snapshot."""
    from honing.flywheel.ingest import ingest

    sources = list(heldout_source or [])
    if config:
        from honing.config import load_config

        cfg, _ = load_config(config, [])
        sources += [s.name for s in cfg.tasks.sources]
    res = ingest(logs, out, suites=suite or None, heldout_sources=sources, skip_bad=skip_bad, near_dup=near_dup,
                 heldout_near_dup=heldout_near_dup)
    if as_json:
        typer.echo(json.dumps({"pool": str(res.pool), "version": res.version, "parent": res.parent,
                               "created": res.created, "ingest": res.counts, "redaction": res.redaction}, indent=1))
        return
    c = res.counts
    what = "new snapshot" if res.created else "no change; latest snapshot"
    typer.echo(f"{what} {res.version} (parent {res.parent or '-'}) in {res.pool}")
    typer.echo(f"  read {c['records']} records from {c['files']} files ({c['lines']} lines; "
               f"{c['bad_lines']} bad skipped, {c['opted_out']} opted out)")
    typer.echo(f"  held-out guard: {c['heldout_excluded']} excluded against {c['heldout_tasks']} held-out tasks; "
               f"{c['duplicates']} duplicates merged; {c['new_items']} new items; {c['demoted']} demoted to judge")
    red = ", ".join(f"{k} {v}" for k, v in res.redaction["counts"].items()) or "none"
    typer.echo(f"  redacted: {red} (in {res.redaction['texts_changed']} of {res.redaction['texts']} texts)")
    typer.echo(f"  train on it: tasks.sources: [{{name: 'pool:{res.pool}@{res.version}'}}]")


@flywheel_app.command("status")
def status_cmd(
    pool: Path = typer.Argument(..., help="Pool directory"),
    version: Optional[str] = typer.Option(None, "--version", help="A snapshot version (default: latest)"),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON"),
) -> None:
    """Versions of a pool, and the kinds, provenance and redaction counts of one snapshot."""
    from rich.console import Console
    from rich.table import Table

    from honing.flywheel.pool import history, read_rows, resolve

    _, ver = resolve(pool, version)
    report_path = pool / "reports" / f"{ver}.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    kinds: dict[str, int] = {}
    logs = 0
    for row in read_rows(pool, ver):
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
        logs += len(row["log_ids"])
    if as_json:
        typer.echo(json.dumps({"pool": str(pool), "version": ver, "kinds": kinds, "log_records": logs,
                               "history": history(pool), "report": report}, indent=1))
        return
    con = Console()
    h = Table(title=f"pool {pool}", title_justify="left")
    for col in ("version", "parent", "created", "rows", "kinds"):
        h.add_column(col)
    for e in history(pool):
        mark = " *" if e["version"] == ver else ""
        h.add_row(e["version"] + mark, e.get("parent") or "-", e["created"], str(e["rows"]),
                  ", ".join(f"{k} {v}" for k, v in e["kinds"].items()))
    con.print(h)
    t = Table(title=f"snapshot {ver}: {sum(kinds.values())} items from {logs} log records", title_justify="left")
    t.add_column("kind")
    t.add_column("items", justify="right")
    for k, v in sorted(kinds.items()):
        t.add_row(k, str(v))
    con.print(t)
    ing, red = report.get("ingest", {}), report.get("redaction", {})
    if ing:
        con.print(f"last ingest: {ing['records']} records, {ing['heldout_excluded']} held-out excluded, "
                  f"{ing['duplicates']} duplicates, {ing['bad_lines']} bad lines skipped")
    if red:
        con.print("redacted: " + (", ".join(f"{k} {v}" for k, v in red.get("counts", {}).items()) or "none"))
    con.print(f"train on it: pool:{pool}@{ver}")
