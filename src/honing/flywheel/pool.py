"""Versioned, content-addressed pool snapshots, and the `pool:<dir>@<version>` task source.

Layout of a pool directory (owner-only permissions: it holds de-identified user text, and
de-identification is not perfect):

    POOL/snapshots/<version>.parquet   one row per item (schema below)
    POOL/reports/<version>.json        ingest counts and the redaction report (counts, no values)
    POOL/versions.jsonl                append-only history: version, parent, created, counts
    POOL/LATEST                        the newest version

`version` is the first 16 hex digits of the SHA-256 of the snapshot's rows in id order: the
same content is always the same version, so ingesting the same logs twice makes no new one.
Each snapshot holds the whole pool (the parent's rows plus the new ones), so any version can
be trained on alone. Files are written to a temporary name and renamed; LATEST moves last.

Row schema: id (content address of the item), kind, domain, question (scrubbed), task (the
scrubbed Task as JSON, null for preference rows), pair (preference material as JSON, else
null), log_ids and log_where (provenance: every log record this item came from), notes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from honing.errors import TaskError
from honing.tasks.types import SPLITS, Task, VerifierSpec, task_from_json

HELDOUT_FRACTION = 0.1
ROW_FIELDS = ("id", "kind", "domain", "question", "task", "pair", "log_ids", "log_where", "notes")


def _schema() -> Any:
    import pyarrow as pa

    s, ls = pa.string(), pa.list_(pa.string())
    return pa.schema([("id", s), ("kind", s), ("domain", s), ("question", s), ("task", s), ("pair", s),
                      ("log_ids", ls), ("log_where", ls), ("notes", ls)])


def version_of(rows: Sequence[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: r["id"]):
        h.update(json.dumps([r[k] for k in ROW_FIELDS], sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def latest_version(pool: Path) -> str | None:
    p = pool / "LATEST"
    return p.read_text().strip() or None if p.is_file() else None


def resolve(pool: str | Path, version: str | None = None) -> tuple[Path, str]:
    """(snapshot file, version) for a version, 'latest' or None (latest); errors list the versions."""
    pool = Path(pool).expanduser()
    if not pool.is_dir():
        raise TaskError(f"pool not found: {pool} (make one with `honing flywheel ingest LOGS --out {pool}`)")
    if version in (None, "", "latest"):
        version = latest_version(pool)
        if version is None:
            raise TaskError(f"pool {pool} has no snapshot yet (no LATEST)")
    path = pool / "snapshots" / f"{version}.parquet"
    if not path.is_file():
        known = [v["version"] for v in history(pool)]
        raise TaskError(f"pool {pool}: no version '{version}' (versions: {', '.join(known) or 'none'})")
    return path, version


def history(pool: str | Path) -> list[dict[str, Any]]:
    p = Path(pool) / "versions.jsonl"
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def read_rows(pool: str | Path, version: str | None = None) -> Iterator[dict[str, Any]]:
    """The rows of a snapshot, streamed by record batch (a large pool is never loaded whole)."""
    import pyarrow.parquet as pq

    path, _ = resolve(pool, version)
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def write_snapshot(pool: Path, rows: list[dict[str, Any]], parent: str | None, report: dict[str, Any]) -> tuple[str, bool]:
    """Write a snapshot of `rows` unless that exact content exists; (version, created)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    version = version_of(rows)
    for d in (pool, pool / "snapshots", pool / "reports"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
    path = pool / "snapshots" / f"{version}.parquet"
    if path.is_file() and latest_version(pool) == version:
        return version, False
    buf = io.BytesIO()
    table = pa.Table.from_pylist(sorted(rows, key=lambda r: r["id"]), schema=_schema())
    pq.write_table(table, buf, compression="zstd")
    _atomic_write(path, buf.getvalue())
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
    entry = {"version": version, "parent": parent, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "rows": len(rows), "kinds": dict(sorted(counts.items()))}
    _atomic_write(pool / "reports" / f"{version}.json", json.dumps({**entry, **report}, indent=1).encode())
    with open(pool / "versions.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    os.chmod(pool / "versions.jsonl", 0o600)
    _atomic_write(pool / "LATEST", (version + "\n").encode())
    return version, True


def split_of(item_id: str) -> str:
    h = int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16)
    return "heldout" if h < HELDOUT_FRACTION * 0xFFFFFFFF else "train"


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'<dir>@<version>' | '<dir>@latest' | '<dir>' -> (dir, version or None)."""
    head, at, tail = spec.rpartition("@")
    if at and tail and "/" not in tail:
        return head, (None if tail == "latest" else tail)
    return spec, None


class PoolSource:
    """Tasks of a pool snapshot. Params: `kinds` (default the verifiable ones: code, extract,
    math, tool; add 'judge' for judge-graded tasks; preference rows are never tasks). Each
    item's stable hash puts 10% of it in the held-out split. The version is pinned when the
    source is made (`@latest` resolves once), so a run trains on one snapshot throughout."""

    def __init__(self, spec: str, params: dict | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        from honing.flywheel.convert import KINDS, VERIFIABLE_KINDS

        params = dict(params or {})
        kinds = params.pop("kinds", list(VERIFIABLE_KINDS))
        if params:
            raise TaskError(f"pool:{spec}: unknown params {sorted(params)} (valid: kinds)")
        bad = [k for k in kinds if k not in KINDS or k == "preference"]
        if bad:
            raise TaskError(f"pool:{spec}: kinds {bad} are not task kinds (valid: {', '.join(KINDS[:-1])})")
        pool, version = parse_spec(spec)
        self.path, self.version = resolve(pool, version)
        self.pool = Path(pool).expanduser()
        self.kinds = tuple(kinds)
        self.domain = f"pool:{self.pool.name}"
        self.verifier, self.system_prompt = verifier, system_prompt

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        """Snapshot order (id order; the scheduler shuffles); `seed` is unused."""
        from dataclasses import replace

        if split not in SPLITS:
            raise TaskError(f"pool source: unknown split {split!r}")
        for row in read_rows(self.pool, self.version):
            if row["kind"] not in self.kinds or row["task"] is None or split_of(row["id"]) != split:
                continue
            t = task_from_json(json.loads(row["task"]), f"pool {self.pool}@{self.version} row {row['id']}")
            meta = {**t.metadata, "kind": row["kind"], "log_ids": list(row["log_ids"]),
                    "pool": str(self.pool), "pool_version": self.version}
            t = replace(t, id=row["id"], metadata=meta)
            if self.verifier:
                t = replace(t, verifier=VerifierSpec(self.verifier, dict(t.verifier.params)))
            if self.system_prompt and not any(m.get("role") == "system" for m in t.prompt):
                t = replace(t, prompt=({"role": "system", "content": self.system_prompt}, *t.prompt))
            yield t


def preference_pairs(pool: str | Path, version: str | None = None) -> Iterator[dict[str, Any]]:
    """Preference material of a snapshot: {id, prompt, chosen, rejected, label, signal, log_ids}."""
    for row in read_rows(pool, version):
        if row["kind"] == "preference" and row["pair"]:
            yield {"id": row["id"], **json.loads(row["pair"]), "log_ids": list(row["log_ids"])}
