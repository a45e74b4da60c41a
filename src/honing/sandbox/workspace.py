"""Host-side workspaces: the box's /work, written before a run and read after it.

Paths are validated (no absolute paths, no '..'); files are read back without following
symlinks, so a box cannot make the grader read /etc/shadow through a link it planted.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Mapping

from honing.sandbox.types import SandboxError


def sandbox_root() -> Path:
    base = os.environ.get("HONING_SANDBOX_DIR") or os.path.join(tempfile.gettempdir(), "honing-sandbox")
    root = Path(base)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def safe_relpath(name: str) -> str:
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise SandboxError(f"sandbox file name must be a relative path inside the workspace: {name!r}")
    return str(p)


class Workspace:
    """A private directory per box (mode 0700), bound read-write at /work inside the box."""

    def __init__(self, files: Mapping[str, bytes | str] | None = None, files_dir: str | Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="ws-", dir=sandbox_root()))
        os.chmod(self.path, 0o777)  # the box runs as an unprivileged uid inside its user namespace
        self.snap_root = Path(tempfile.mkdtemp(prefix="snap-", dir=sandbox_root()))
        if files_dir is not None:
            src = Path(files_dir)
            if not src.is_dir():
                raise SandboxError(f"files dir does not exist or is not a directory: {src}")
            shutil.copytree(src, self.path, dirs_exist_ok=True, symlinks=True)
        self.write_many(files or {})

    def write_many(self, files: Mapping[str, bytes | str]) -> None:
        for name, data in files.items():
            self.write(name, data)

    def write(self, name: str, data: bytes | str, mode: int = 0o666) -> None:
        target = self.path / safe_relpath(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        os.chmod(target, mode)

    def read(self, name: str, max_bytes: int = 1 << 24) -> bytes:
        """Read a file the box wrote; symlinks and non-regular files are refused."""
        rel = safe_relpath(name)
        fd = -1
        try:
            dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                parts = Path(rel).parts
                cur = dir_fd
                for part in parts[:-1]:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
                    if cur != dir_fd:
                        os.close(cur)
                    cur = nxt
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=cur)
                if cur != dir_fd:
                    os.close(cur)
            finally:
                os.close(dir_fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"sandbox file {name!r} is not a regular file")
            with os.fdopen(fd, "rb") as f:
                fd = -1
                return f.read(max_bytes)
        except OSError as e:
            raise SandboxError(f"cannot read sandbox file {name!r}: {e.strerror or e} (symlinks are refused)") from None
        finally:
            if fd >= 0:
                os.close(fd)

    def snapshot(self) -> str:
        sid = uuid.uuid4().hex[:12]
        shutil.copytree(self.path, self.snap_root / sid, symlinks=True)
        return sid

    def restore(self, sid: str) -> None:
        src = self.snap_root / sid
        if not src.is_dir():
            raise SandboxError(f"unknown snapshot id {sid!r}")
        for child in self.path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        shutil.copytree(src, self.path, dirs_exist_ok=True, symlinks=True)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.snap_root, ignore_errors=True)
