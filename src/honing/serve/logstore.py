"""The raw request/response log of `honing serve`: append-only JSONL files, rotated by size.

This store is the only place raw user text lives (the flywheel de-identifies it on ingestion), so:

- the directory is created 0700 and every file 0600, whatever the umask (fchmod after open);
- files are only ever appended to (O_APPEND, one `os.write` per record, so a record is never
  interleaved with another one and a crash leaves at most one truncated last line);
- a file past `max_file_bytes` is closed and a new one started; the oldest files beyond
  `retention_files`, and files older than `retention_days`, are deleted (the retention limit);
- request headers are never recorded (the bearer token lives in them), only the JSON body.

Not covered: encryption at rest, and other processes running as the same user (they can read
0600 files): put the directory on an encrypted volume if that matters.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Iterator

FILE_PREFIX = "requests-"
FILE_SUFFIX = ".jsonl"


def log_files(root: Path) -> list[Path]:
    """The log files, oldest first (names sort by creation time, then sequence)."""
    return sorted(p for p in Path(root).glob(f"{FILE_PREFIX}*{FILE_SUFFIX}") if p.is_file())


class LogStore:
    def __init__(self, root: Path | str, max_file_bytes: int = 64 << 20, retention_files: int = 50,
                 retention_days: float | None = 30.0) -> None:
        self.root = Path(root)
        self.max_file_bytes = max(int(max_file_bytes), 1)
        self.retention_files = max(int(retention_files), 1)
        self.retention_days = retention_days
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._seq = 0
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # also tightens a directory that existed with looser bits
        for p in self.files():
            os.chmod(p, 0o600)
        self._prune()

    def files(self) -> list[Path]:
        return log_files(self.root)

    def _open_new(self) -> None:
        self._close()
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.root / f"{FILE_PREFIX}{stamp}-{os.getpid()}-{self._seq:04d}{FILE_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)  # the umask may have widened nothing, but be sure
        self._fd, self._path, self._size = fd, path, os.fstat(fd).st_size

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _prune(self) -> None:
        files = self.files()
        current = self._path
        keep = [p for p in files if p != current]
        cutoff = time.time() - self.retention_days * 86400 if self.retention_days else None
        excess = len(files) - self.retention_files
        for p in keep:
            too_old = cutoff is not None and p.stat().st_mtime < cutoff
            if excess > 0 or too_old:
                p.unlink(missing_ok=True)
                excess -= 1

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line (rotating first when the current file is full)."""
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None or (self._size > 0 and self._size + len(line) > self.max_file_bytes):
                self._open_new()
                self._prune()
            assert self._fd is not None
            os.write(self._fd, line)
            self._size += len(line)

    def close(self) -> None:
        with self._lock:
            self._close()


def read_records(root: Path | str) -> Iterator[tuple[Path, int, dict[str, Any] | None]]:
    """(file, line number, record or None for a line that is not valid JSON) over every log file,
    oldest first. A reader (the flywheel, the load benchmark) decides what a bad line means."""
    for path in log_files(Path(root)):
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    rec = None
                yield path, i, rec if isinstance(rec, dict) else None
