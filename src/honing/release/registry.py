"""The release registry: release directories plus one SQLite file (WAL) with their lineage and
the `current` pointer.

Layout: `<root>/registry.sqlite`, `<root>/<name>/` (one immutable release directory each:
read-only files, a manifest.json of sha256 per file whose own sha256 the registry keeps). The
root is `--registry`, else `$HONING_RELEASES`, else `./releases`.

The pointer is one row: promote and rollback are one UPDATE in a transaction (instant; a server
following `release:current` picks it up on its next poll). Every move is kept in `history`, which
is what `rollback` walks back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from honing.errors import HoningError

ROOT_ENV = "HONING_RELEASES"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
  name TEXT PRIMARY KEY, created REAL NOT NULL, path TEXT NOT NULL, variant TEXT NOT NULL,
  run TEXT, step INTEGER, parent TEXT, data_snapshot TEXT, digest TEXT NOT NULL, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pointer (id INTEGER PRIMARY KEY CHECK (id = 1), name TEXT);
CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
  action TEXT NOT NULL, name TEXT, previous TEXT);
"""


def default_root() -> Path:
    env = os.environ.get(ROOT_ENV)
    return Path(env).expanduser() if env else Path("releases")


@dataclass(frozen=True)
class Release:
    name: str
    created: float
    path: str
    variant: str
    run: str | None
    step: int | None
    parent: str | None
    data_snapshot: str | None
    digest: str
    meta: dict[str, Any]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Registry:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    @property
    def db_path(self) -> Path:
        return self.root / "registry.sqlite"

    def _connect(self, create: bool = False) -> sqlite3.Connection:
        if not self.db_path.is_file():
            if not create:
                raise HoningError(f"no release registry at {self.root} (create a release first: "
                                  "`honing release create RUN --name NAME`)")
            self.root.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA)
        return con

    # --- reading ------------------------------------------------------------------------------
    @staticmethod
    def _row(r: tuple) -> Release:
        return Release(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], json.loads(r[9]))

    def list(self) -> list[Release]:
        if not self.db_path.is_file():
            return []
        with _closing(self._connect()) as con:
            return [self._row(r) for r in con.execute("SELECT * FROM releases ORDER BY created, name")]

    def get(self, name: str) -> Release:
        if not self.db_path.is_file():
            raise HoningError(f"release {name!r} not found: no registry at {self.root}")
        with _closing(self._connect()) as con:
            r = con.execute("SELECT * FROM releases WHERE name = ?", (name,)).fetchone()
            if r is None:
                have = [x[0] for x in con.execute("SELECT name FROM releases ORDER BY created")]
                raise HoningError(f"release {name!r} not found in {self.root} (have: {', '.join(have) or 'none'})")
        return self._row(r)

    def current(self) -> Release | None:
        if not self.db_path.is_file():
            return None
        with _closing(self._connect()) as con:
            r = con.execute("SELECT name FROM pointer WHERE id = 1").fetchone()
        return self.get(r[0]) if r and r[0] else None

    def history(self) -> list[dict[str, Any]]:
        if not self.db_path.is_file():
            return []
        with _closing(self._connect()) as con:
            return [{"seq": s, "time": t, "action": a, "name": n, "previous": p}
                    for s, t, a, n, p in con.execute("SELECT * FROM history ORDER BY seq")]

    def verify(self, name: str) -> Release:
        """Raise unless the release's files match its manifest and the manifest matches the registry."""
        rel = self.get(name)
        d = Path(rel.path)
        man = d / "manifest.json"
        if not man.is_file():
            raise HoningError(f"release {name} fails its checksum: {man} is missing")
        if sha256_file(man) != rel.digest:
            raise HoningError(f"release {name} fails its checksum: manifest.json was changed")
        files = json.loads(man.read_text())["files"]
        for rel_path, want in files.items():
            p = d / rel_path
            if not p.is_file():
                raise HoningError(f"release {name} fails its checksum: {rel_path} is missing")
            got = sha256_file(p)
            if got != want:
                raise HoningError(f"release {name} fails its checksum: {rel_path} (expected {want[:12]}…, "
                                  f"got {got[:12]}…)")
        extra = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()
                       and str(p.relative_to(d)) not in files and p.name != "manifest.json")
        if extra:
            raise HoningError(f"release {name} fails its checksum: files not in its manifest: {', '.join(extra[:3])}")
        return rel

    # --- writing ------------------------------------------------------------------------------
    def add(self, rel: Release) -> None:
        with _closing(self._connect(create=True)) as con:
            try:
                con.execute("INSERT INTO releases VALUES (?,?,?,?,?,?,?,?,?,?)",
                            (rel.name, rel.created, rel.path, rel.variant, rel.run, rel.step, rel.parent,
                             rel.data_snapshot, rel.digest, json.dumps(rel.meta, default=str)))
                con.execute("INSERT INTO history (time, action, name, previous) VALUES (?, 'create', ?, NULL)",
                            (time.time(), rel.name))
            except sqlite3.IntegrityError:
                raise HoningError(f"release {rel.name!r} already exists in {self.root}") from None

    def set_current(self, name: str, action: str) -> str | None:
        """Point `current` at `name` (in one transaction); returns the previous current."""
        self.get(name)
        with _closing(self._connect()) as con:
            con.execute("BEGIN IMMEDIATE")
            r = con.execute("SELECT name FROM pointer WHERE id = 1").fetchone()
            prev = r[0] if r else None
            con.execute("INSERT INTO pointer (id, name) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET name = ?",
                        (name, name))
            con.execute("INSERT INTO history (time, action, name, previous) VALUES (?, ?, ?, ?)",
                        (time.time(), action, name, prev))
            con.execute("COMMIT")
        return prev

    def rollback_target(self) -> str:
        """The release that was current before the current one was promoted."""
        cur = self.current()
        if cur is None:
            raise HoningError(f"nothing to roll back: registry {self.root} has no current release")
        for h in reversed(self.history()):
            if h["action"] == "promote" and h["name"] == cur.name:
                if h["previous"] and h["previous"] != cur.name:
                    return h["previous"]
                break
        raise HoningError(f"nothing to roll back to: {cur.name} was the first release promoted "
                          "(name one with `honing release rollback --to NAME`)")


def check_name(name: str) -> str:
    if not NAME_RE.match(name or "") or name == "current":
        raise HoningError(f"bad release name {name!r}: letters, digits, '.', '_', '-' (and not 'current')")
    return name


class _closing:
    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        return self.con

    def __exit__(self, *exc: object) -> None:
        self.con.close()


def iter_release_files(d: Path) -> Iterator[Path]:
    return (p for p in sorted(d.rglob("*")) if p.is_file() and p.name != "manifest.json")
