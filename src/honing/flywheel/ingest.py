"""`ingest`: logs -> read -> held-out guard -> convert -> de-identify -> dedupe -> pool snapshot.

Order matters for safety: every line is read and checked before anything is written (a corrupt
line stops the run with nothing written), and every string is scrubbed before it reaches a row.
The held-out guard runs on the raw prompt (in memory only) and again on the scrubbed one, so
neither a redaction nor its absence lets a held-out question through. Earlier pool rows are
checked against the held-out tasks again too: a suite added since then still excludes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from honing.flywheel.convert import KINDS, PoolItem, content_id, convert, scrub_item
from honing.flywheel.deid import Deidentifier, RedactionReport, default_deidentifier
from honing.flywheel.dedupe import NearDuplicates, heldout_matches, heldout_tasks
from honing.flywheel.logs import ReadStats, log_files, read_logs
from honing.flywheel.pool import latest_version, read_rows, write_snapshot

NEAR_DUP_THRESHOLD = 0.8  # within the pool: two prompts this alike are one task
HELDOUT_NEAR_DUP = 0.6  # against held-out tasks, stricter: one changed word in a 20-word question is ~0.7


@dataclass
class IngestResult:
    pool: Path
    version: str
    parent: str | None
    created: bool  # False: the content equals the latest snapshot (nothing new)
    counts: dict[str, Any] = field(default_factory=dict)
    redaction: dict[str, Any] = field(default_factory=dict)


def _row(item: PoolItem) -> dict[str, Any]:
    import json

    from honing.tasks.types import task_to_json

    task = None
    if item.task is not None:
        tj = task_to_json(item.task)
        tj["id"] = ""  # the row id is the task id; the pool source puts it back
        task = json.dumps(tj, sort_keys=True)
    return {"id": content_id(item), "kind": item.kind, "domain": item.task.domain if item.task else "flywheel:preference",
            "question": item.question, "task": task, "pair": json.dumps(item.pair, sort_keys=True) if item.pair else None,
            "log_ids": [item.log_id], "log_where": [item.where], "notes": list(item.notes)}


def _family(kind: str) -> str:
    return "preference" if kind == "preference" else "task"


def _dedupe_text(question: str, pair: str | None) -> str:
    return question if pair is None else f"{question}\n{pair}"


def ingest(logs: str | Path | Sequence[str | Path], out: str | Path, *, suites: Sequence[str] | None = None,
           heldout_sources: Sequence[str] = (), heldout: Sequence[Any] | None = None, skip_bad: bool = False,
           near_dup: float = NEAR_DUP_THRESHOLD, heldout_near_dup: float = HELDOUT_NEAR_DUP, deid: Deidentifier | None = None) -> IngestResult:
    """Ingest log files (or directories of them) into the pool at `out`; returns the new version.

    Held-out guard: the tasks of `suites` (None: every built-in evaluation suite) and the held-out
    splits of `heldout_sources`, plus any `heldout` tasks or strings given directly.
    Raises LogError (naming file:line) on a corrupt line unless `skip_bad`; nothing is written then.
    """
    pool = Path(out).expanduser()
    paths = [p for x in ([logs] if isinstance(logs, (str, Path)) else logs) for p in log_files(x)]
    stats = ReadStats()
    records = read_logs(paths, skip_bad=skip_bad, stats=stats)  # raises before any write
    guard = list(heldout or []) + heldout_tasks(suites, heldout_sources)
    deid = deid or default_deidentifier()
    report = RedactionReport()

    items = [convert(r) for r in records]
    raw_hit = heldout_matches(guard, [it.question for it in items] + [r.question for r in records], heldout_near_dup)
    n = len(items)
    keep = [it for i, it in enumerate(items) if not (raw_hit[i] or raw_hit[n + i])]
    excluded = n - len(keep)
    scrubbed = [scrub_item(it, deid, report) for it in keep]
    del items, keep, records  # raw text ends here
    hit = heldout_matches(guard, [it.question for it in scrubbed], heldout_near_dup)
    excluded += sum(hit)
    scrubbed = [it for it, h in zip(scrubbed, hit) if not h]

    parent = latest_version(pool) if pool.is_dir() else None
    old = list(read_rows(pool, parent)) if parent else []
    old_hit = heldout_matches(guard, [r["question"] for r in old], heldout_near_dup)
    rows = {r["id"]: r for r, h in zip(old, old_hit) if not h}
    # two families: a prompt becomes at most one task; preference material is deduped on the
    # whole pair (one prompt may carry several different pairs)
    index = {"task": NearDuplicates(near_dup), "preference": NearDuplicates(near_dup)}
    for r in rows.values():
        index[_family(r["kind"])].add(r["id"], _dedupe_text(r["question"], r["pair"]))
    # verifiable items first: of two copies of one prompt, the one a verifier can grade is kept
    scrubbed.sort(key=lambda it: KINDS.index(it.kind))
    dups = 0
    for it in scrubbed:
        row = _row(it)
        same = row["id"] if row["id"] in rows else \
            index[_family(it.kind)].add(row["id"], _dedupe_text(it.question, row["pair"]))
        if same:
            dups += 1
            kept = rows[same]
            for lid, where in zip(row["log_ids"], row["log_where"]):
                if lid not in kept["log_ids"] or where not in kept["log_where"]:
                    kept["log_ids"] = [*kept["log_ids"], lid]
                    kept["log_where"] = [*kept["log_where"], where]
            continue
        rows[row["id"]] = row
    counts = {"files": stats.files, "lines": stats.lines, "records": stats.records, "bad_lines": stats.bad,
              "bad_where": stats.bad_where, "opted_out": stats.opted_out, "heldout_tasks": len(guard),
              "heldout_excluded": excluded, "dropped_from_parent_by_heldout": sum(old_hit),
              "duplicates": dups, "new_items": len(rows) - (len(old) - sum(old_hit)),
              "demoted": sum(any("demoted" in n for n in it.notes) for it in scrubbed)}
    version, created = write_snapshot(pool, list(rows.values()), parent,
                                      {"ingest": counts, "redaction": report.to_json(),
                                       "logs": [str(p) for p in paths]})
    return IngestResult(pool, version, parent, created, counts, report.to_json())
