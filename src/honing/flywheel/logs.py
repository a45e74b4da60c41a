"""Reading request/response logs: honing's serve logs and generic OpenAI-chat JSONL.

One record per line (JSONL, optionally gzipped; rotated files such as `requests.jsonl.1` too) or
per row (Parquet). What a line may look like (every field but the conversation is optional):

    {"id": "...", "messages": [{"role": "user", "content": "..."}, ...],
     "response": "..." | {"role": "assistant", "content": "..."} | <an OpenAI chat.completion object>,
     "metadata": {"accepted_answer": "42", "accepted": true, "correction": {...}, "tests": "assert ...",
                  "outcome": {"success": true, "answer": "..."}, "chosen": "...", "rejected": "...",
                  "opt_out": false}}

A `honing serve` log record (`{"id", "endpoint", "model", "release", "request": <the request body>,
"response": {"choices": [...], "usage"}}`, honing.serve.logstore) is read as it is: the
conversation from `request.messages` (or a completions request's `prompt`), the reply from the
first choice, and metadata from `request.metadata` (an OpenAI client's string-valued map: JSON
corrections may arrive as strings) merged with a top-level `metadata`.

The conversation may also sit in `request` (`{"request": {"messages": [...]}}` or a completions
request's `prompt`), the reply in `completion`/`output`, and a trailing assistant message counts
as the reply when there is no other. Message content may be a string or a list of
`{"type": "text", "text": ...}` parts. Anything else is a corrupt line: reading stops with one
`LogError` naming file:line (the caller writes nothing), unless `skip_bad` is set, when the line
is counted and skipped. Records whose metadata says `opt_out` are dropped (the server should not
have logged them; the ingester honours the flag anyway).

The text read here is raw user text: it lives only in memory until `deid` scrubs it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from honing.errors import HoningError

ROLES = ("system", "user", "assistant", "tool")


class LogError(HoningError):
    """A log line that is not a conversation record (message names file:line)."""


@dataclass
class LogRecord:
    log_id: str
    where: str  # "file:line" (the file name is the operator's, not user text)
    messages: list[dict[str, Any]]  # role, content, and for tool use: tool_calls / name / tool_call_id
    response: str | None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def question(self) -> str:
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users else ""

    @property
    def is_tool_episode(self) -> bool:
        return any(m["role"] == "tool" or m.get("tool_calls") for m in self.messages)


@dataclass
class ReadStats:
    files: int = 0
    lines: int = 0
    records: int = 0
    bad: int = 0
    opted_out: int = 0
    bad_where: list[str] = field(default_factory=list)  # first few "file:line: why" (no line text)


def log_files(path: str | Path) -> list[Path]:
    """A log file, or every log file under a directory (sorted: rotation order is name order)."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise LogError(f"log path not found: {p}")
    found = sorted(f for f in p.rglob("*") if f.is_file() and (".jsonl" in f.name or f.suffix == ".parquet"))
    if not found:
        raise LogError(f"{p}: no log files (*.jsonl, *.jsonl.gz, rotated *.jsonl.N, *.parquet)")
    return found


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") not in (None, "text"):
                continue  # images, audio: not text, not kept
            else:
                raise LogError(f"{where}: message content part is neither text nor a typed part")
        return "\n".join(parts)
    raise LogError(f"{where}: message content must be a string or a list of parts, got {type(content).__name__}")


def _messages(raw: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise LogError(f"{where}: 'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise LogError(f"{where}: messages[{i}] must be an object with role in {'/'.join(ROLES)}")
        msg: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"), f"{where}: messages[{i}]")}
        for key in ("tool_calls", "name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def _response(raw: Any, where: str) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, dict):
        if isinstance(raw.get("choices"), list) and raw["choices"]:  # an OpenAI response object
            c = raw["choices"][0]
            if isinstance(c, dict):
                if isinstance(c.get("message"), dict):
                    return _text(c["message"].get("content"), f"{where}: response")
                if isinstance(c.get("text"), str):
                    return c["text"]
        if "content" in raw:
            return _text(raw["content"], f"{where}: response")
    raise LogError(f"{where}: 'response' must be a string, an assistant message or a completion object")


def parse_record(obj: Any, where: str, default_id: str) -> LogRecord | None:
    """One log object -> a LogRecord (None when opted out); LogError when it is not a record."""
    if not isinstance(obj, dict):
        raise LogError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    req = obj.get("request") if isinstance(obj.get("request"), dict) else {}
    conv = obj.get("messages", req.get("messages", obj.get("prompt", req.get("prompt"))))
    if conv is None:
        raise LogError(f"{where}: no conversation ('messages', 'prompt' or 'request.messages')")
    messages = _messages(conv, where)
    resp_raw = next((obj[k] for k in ("response", "completion", "output") if obj.get(k) is not None), None)
    response = _response(resp_raw, where)
    if response is None and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        response = messages.pop()["content"]
    if not any(m["role"] == "user" for m in messages):
        raise LogError(f"{where}: the conversation has no user message")
    # a serve log record keeps the request body whole: an OpenAI client's `metadata` sits in it
    meta: dict[str, Any] = {}
    for m in (req.get("metadata"), obj.get("metadata")):
        if m is not None and not isinstance(m, dict):
            raise LogError(f"{where}: 'metadata' must be an object")
        meta.update(m or {})
    for k in ("feedback", "accepted", "accepted_answer", "correction", "tests", "outcome", "tool_outcome",
              "chosen", "rejected", "opt_out"):
        if k in obj and k not in meta:
            meta[k] = obj[k]
    if meta.get("opt_out") in (True, "true", "1") or obj.get("opt_out") is True:
        return None
    rid = obj.get("id", obj.get("request_id", resp_raw.get("id") if isinstance(resp_raw, dict) else None))
    return LogRecord(str(rid) if rid is not None else default_id, where, messages, response, meta)


def _lines(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed object or None, JSON error) per non-empty line or Parquet row."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                n += 1
                yield n, {k: _maybe_json(v) for k, v in row.items()}, None
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="strict") as f:  # type: ignore[operator]
        n = 0
        while True:
            n += 1
            try:
                line = f.readline()
            except UnicodeDecodeError:
                yield n, None, "not valid UTF-8"
                continue
            if not line:
                return
            if not line.strip():
                continue
            try:
                yield n, json.loads(line), None
            except json.JSONDecodeError as e:
                yield n, None, f"not valid JSON ({e.msg} at column {e.colno})"
            except RecursionError:
                yield n, None, "JSON nested too deeply"


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def read_logs(paths: list[Path], skip_bad: bool = False, stats: ReadStats | None = None) -> list[LogRecord]:
    """Every record of `paths`, in order. The first bad line raises LogError (file:line and why,
    never the line's text: it is raw user input) unless `skip_bad`."""
    stats = stats if stats is not None else ReadStats()
    out: list[LogRecord] = []
    for path in paths:
        stats.files += 1
        for lineno, obj, err in _lines(path):
            stats.lines += 1
            where = f"{path}:{lineno}"
            try:
                if err:
                    raise LogError(f"{where}: {err}")
                rec = parse_record(obj, where, f"{path.name}:{lineno}")
            except LogError as e:
                if not skip_bad:
                    raise
                stats.bad += 1
                if len(stats.bad_where) < 20:
                    stats.bad_where.append(str(e))
                continue
            if rec is None:
                stats.opted_out += 1
                continue
            stats.records += 1
            out.append(rec)
    return out
