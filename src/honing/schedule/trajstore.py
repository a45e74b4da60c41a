"""Trajectory shards: one Parquet file per batch of trajectories (runs/<name>/trajectories/*.parquet).

A shard is self-describing (a `step` column, a format version in the file metadata) and carries
a digest of its decoded contents in the metadata; data pages are written with CRC checksums.
`read_shard` therefore rejects a truncated or bit-flipped file (HoningError naming the file and
the problem) instead of returning wrong values, and also checks the whole file's sha256 when the
caller has it (e.g. from a manifest written next to the shard).

Scalars and token/log-prob sequences are real columns (log-probs as float64, so the trainer sees
bit-identical values); nested or irregular fields (turns, messages, dicts) are JSON strings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from honing.errors import HoningError
from honing.schedule.runlog import file_sha256
from honing.rollout.types import Trajectory, Turn
from honing.verify.types import Verdict

FORMAT_VERSION = "1"
_META_VERSION = b"honing.trajstore.version"
_META_DIGEST = b"honing.trajstore.digest"

_JSON = pa.string()  # a JSON-encoded column
SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("task_id", pa.string()),
    ("domain", pa.string()),
    ("prompt_ids", pa.list_(pa.int64())),
    ("completion_ids", pa.list_(pa.int64())),
    ("logprobs", pa.list_(pa.float64())),
    ("loss_mask", pa.list_(pa.int64())),
    ("completion_text", pa.string()),
    ("finish_reason", pa.string()),
    ("policy_version", pa.int64()),
    ("group", pa.int64()),
    ("verdict_score", pa.float64()),  # the verdict_* columns are all null when verdict is None
    ("verdict_passed", pa.bool_()),
    ("verdict_components", _JSON),
    ("verdict_details", pa.string()),
    ("verdict_infra_error", pa.bool_()),
    ("verdict_cost_s", pa.float64()),
    ("reward", pa.float64()),
    ("reward_layers", _JSON),
    ("advantage", pa.float64()),
    ("timings", _JSON),
    ("turns", _JSON),
    ("messages", _JSON),
    ("stop_reason", pa.string()),
    ("truncated_context", pa.bool_()),
    ("truncations", _JSON),
    ("stats", _JSON),
    ("files", _JSON),
])
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
JSON_COLUMNS = frozenset(f.name for f in SCHEMA if f.name in {
    "verdict_components", "reward_layers", "timings", "turns", "messages", "truncations", "stats", "files"})


class ShardError(HoningError):
    """A trajectory shard that is missing, truncated, corrupt or not what its manifest says."""


def _dumps(obj: Any) -> str:
    if not obj:  # most single-turn fields are empty: skip the encoder
        return "{}" if isinstance(obj, dict) else "[]" if isinstance(obj, list) else json.dumps(obj)
    return json.dumps(obj, ensure_ascii=False, allow_nan=True)


def _turn_dict(t: Turn) -> dict[str, Any]:
    return {f.name: (list(v) if isinstance(v := getattr(t, f.name), tuple) else v) for f in dataclasses.fields(Turn)}


def _turn(d: dict[str, Any]) -> Turn:
    return Turn(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _row(t: Trajectory, step: int) -> dict[str, Any]:
    v = t.verdict
    return {
        "step": step, "task_id": t.task_id, "domain": t.domain,
        "prompt_ids": [int(x) for x in t.prompt_ids], "completion_ids": [int(x) for x in t.completion_ids],
        "logprobs": [float(x) for x in t.logprobs], "loss_mask": [int(x) for x in t.loss_mask],
        "completion_text": t.completion_text, "finish_reason": t.finish_reason,
        "policy_version": int(t.policy_version), "group": int(t.group),
        "verdict_score": None if v is None else float(v.score),
        "verdict_passed": None if v is None else bool(v.passed),
        "verdict_components": None if v is None else _dumps(dict(v.components)),
        "verdict_details": None if v is None else v.details,
        "verdict_infra_error": None if v is None else bool(v.infra_error),
        "verdict_cost_s": None if v is None else float(v.cost_s),
        "reward": float(t.reward), "reward_layers": _dumps(dict(t.reward_layers)),
        "advantage": float(t.advantage), "timings": _dumps(dict(t.timings)),
        "turns": _dumps([_turn_dict(x) for x in t.turns]),
        "messages": _dumps([dict(m) for m in t.messages]),
        "stop_reason": t.stop_reason, "truncated_context": bool(t.truncated_context),
        "truncations": _dumps([dict(x) for x in t.truncations]),
        "stats": _dumps(dict(t.stats)), "files": _dumps(dict(t.files)),
    }


def _trajectory(r: dict[str, Any]) -> Trajectory:
    j = {k: json.loads(r[k]) if r[k] is not None else None for k in JSON_COLUMNS}
    verdict = None
    if r["verdict_score"] is not None:
        verdict = Verdict(score=r["verdict_score"], passed=r["verdict_passed"], components=j["verdict_components"],
                          details=r["verdict_details"], infra_error=r["verdict_infra_error"],
                          cost_s=r["verdict_cost_s"])
    return Trajectory(
        task_id=r["task_id"], domain=r["domain"], prompt_ids=tuple(r["prompt_ids"]),
        completion_ids=tuple(r["completion_ids"]), logprobs=tuple(r["logprobs"]),
        completion_text=r["completion_text"], finish_reason=r["finish_reason"],
        policy_version=r["policy_version"], group=r["group"], loss_mask=tuple(r["loss_mask"]), verdict=verdict,
        reward=r["reward"], reward_layers=j["reward_layers"], advantage=r["advantage"], timings=j["timings"],
        turns=tuple(_turn(d) for d in j["turns"]), messages=tuple(j["messages"]), stop_reason=r["stop_reason"],
        truncated_context=r["truncated_context"], truncations=tuple(j["truncations"]), stats=j["stats"],
        files=j["files"])


def _type_key(t: pa.DataType) -> str:
    """The type as text, without the list item's field name (Parquet renames "item" to "element")."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"{type(t).__name__}<{_type_key(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{t.field(i).name}: {_type_key(t.field(i).type)}" for i in range(t.num_fields)) + ">"
    return str(t)


def _digest(table: pa.Table) -> str:
    """sha256 of the table's decoded values, column by column (numeric lists as raw bytes)."""
    h = hashlib.sha256()
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        h.update(name.encode() + b"\0" + _type_key(col.type).encode() + b"\0")
        if pa.types.is_list(col.type) and (pa.types.is_integer(col.type.value_type)
                                           or pa.types.is_floating(col.type.value_type)) and col.null_count == 0:
            offsets = col.offsets.to_numpy()
            h.update((offsets - offsets[0]).tobytes())
            h.update(col.flatten().to_numpy(zero_copy_only=False).tobytes())
        else:
            h.update(repr(col.to_pylist()).encode())
    return h.hexdigest()


def write_shard(path: Path, trajs: Sequence[Trajectory], step: int,
                extra: dict[str, list] | None = None) -> tuple[str, int]:
    """Write `trajs` (and optional `extra` columns, one value per trajectory) as one Parquet
    shard at `path`, atomically: a temp file in the same directory, fsync, os.replace. The
    target is either the old file (or absent) or the complete new one. Returns (sha256 hex of
    the written file, number of rows)."""
    path = Path(path)
    cols: dict[str, list] = {name: [] for name in COLUMNS}
    for t in trajs:
        for k, v in _row(t, int(step)).items():
            cols[k].append(v)
    table = pa.Table.from_pydict(cols, schema=SCHEMA)
    for name, values in (extra or {}).items():
        if name in table.column_names:
            raise ValueError(f"extra column {name!r} clashes with a trajectory column")
        if len(values) != len(trajs):
            raise ValueError(f"extra column {name!r} has {len(values)} values for {len(trajs)} trajectories")
        table = table.append_column(name, pa.array(list(values)))
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META_VERSION: FORMAT_VERSION.encode(),
                                           _META_DIGEST: _digest(table).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd", write_page_checksum=True)
            f.flush()
            os.fsync(f.fileno())
        digest = file_sha256(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable (best effort: not every filesystem allows it)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return digest, table.num_rows


def _read_table(path: Path, columns: Sequence[str] | None, sha256: str | None) -> pa.Table:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ShardError(f"trajectory shard {path}: file not found") from None
    except OSError as exc:
        raise ShardError(f"trajectory shard {path}: cannot read ({exc})") from exc
    if sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256.lower():
            raise ShardError(f"trajectory shard {path}: sha256 mismatch (expected {sha256}, file has {actual}; "
                             f"{len(data)} bytes): the file changed or is corrupt")
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        meta = pf.schema_arrow.metadata or {}
        if _META_VERSION not in meta:
            raise ShardError(f"trajectory shard {path}: not a honing trajectory shard (no format version)")
        if columns is not None:
            missing = [c for c in columns if c not in pf.schema_arrow.names]
            if missing:
                raise ShardError(f"trajectory shard {path}: no column(s) {missing}; "
                                 f"it has {pf.schema_arrow.names}")
        table = pf.read(columns=list(columns) if columns is not None else None)
    except ShardError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ShardError(f"trajectory shard {path}: truncated or corrupt ({len(data)} bytes): {exc}") from exc
    if meta[_META_VERSION].decode() != FORMAT_VERSION:
        raise ShardError(f"trajectory shard {path}: format version {meta[_META_VERSION].decode()!r}, "
                         f"this honing reads {FORMAT_VERSION!r}")
    if columns is None:
        want = meta.get(_META_DIGEST, b"").decode()
        if _digest(table.replace_schema_metadata(None)) != want:
            raise ShardError(f"trajectory shard {path}: corrupt (decoded contents do not match the stored digest)")
    return table


def read_shard(path: Path, sha256: str | None = None) -> list[Trajectory]:
    """The trajectories of a shard, exactly as written. With `sha256`, the file must hash to it.
    Raises ShardError (a HoningError) naming the file for a missing, truncated or corrupt shard."""
    table = _read_table(path, None, sha256)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ShardError(f"trajectory shard {path}: no column(s) {missing}")
    try:
        return [_trajectory(r) for r in table.select(list(COLUMNS)).to_pylist()]
    except (ValueError, TypeError, KeyError) as exc:  # JSON that does not decode, a Verdict that does not validate
        raise ShardError(f"trajectory shard {path}: corrupt ({exc})") from exc


def read_columns(path: Path, columns: Sequence[str]) -> list[dict]:
    """Some columns of a shard as one dict per row (only those columns are read and decoded):
    e.g. ["step", "task_id", "domain", "reward"]. Column names are COLUMNS (verdict fields as
    verdict_score, verdict_passed...) plus any `extra` columns; JSON columns come back decoded."""
    table = _read_table(path, list(columns), None)
    rows = table.to_pylist()
    js = [c for c in columns if c in JSON_COLUMNS]
    if js:
        try:
            for r in rows:
                for c in js:
                    if r[c] is not None:
                        r[c] = json.loads(r[c])
        except ValueError as exc:
            raise ShardError(f"trajectory shard {path}: corrupt JSON column ({exc})") from exc
    return rows
