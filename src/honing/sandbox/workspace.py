"""Host-side workspaces: the box's /work, written before a run and read after it.

Paths are validated (no absolute paths, no '..'). The host never follows a link the box
planted: files are read back and written in without following symlinks at any level, so a
box cannot make the grader read /etc/shadow, or write to /etc/cron.d, through a link in /work.

Size: where the host may mount (root), each workspace is its own tmpfs capped at
HONING_SANDBOX_WORK_MB (default 1024) and HONING_SANDBOX_WORK_INODES files (default 65536),
so filling /work cannot fill the host's disk (and the box's writes count against its memory
limit). Elsewhere it is a plain directory: single files are capped by RLIMIT_FSIZE but the
total is only bounded by the wall time of the job (`Workspace.quota_mb` is None then).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import tempfile
import threading
import uuid
import weakref
from pathlib import Path
from typing import Mapping

from honing.sandbox.types import SandboxError

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_swept: set[str] = set()
_sweep_lock = threading.Lock()


def sandbox_root() -> Path:
    base = os.environ.get("HONING_SANDBOX_DIR") or os.path.join(tempfile.gettempdir(), "honing-sandbox")
    root = Path(base)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        # Traversable, not listable: a box that runs as an unprivileged host uid must reach its
        # own workspace (mode 0700, owned by that uid) to have it bound at /work.
        if root.stat().st_uid == os.geteuid() and stat.S_IMODE(root.stat().st_mode) != 0o711:
            os.chmod(root, 0o711)
    except OSError:
        pass
    _sweep_stale(root)
    return root


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale(root: Path) -> None:
    """Remove workspaces and snapshots left by processes that died without closing them."""
    with _sweep_lock:
        if str(root) in _swept:
            return
        _swept.add(str(root))
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for e in entries:
        parts = e.name.split("-")
        if len(parts) < 3 or parts[0] not in ("ws", "snap") or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid != os.getpid() and not _pid_alive(pid):
            _remove_tree(Path(e.path), mounted=e.name.startswith("ws-"))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _umount(path: Path) -> None:
    try:
        _libc().umount2(os.fsencode(str(path)), _MNT_DETACH)
    except (OSError, AttributeError):
        pass


def _remove_tree(path: Path, mounted: bool) -> None:
    if mounted and os.path.ismount(path):
        _umount(path)
    shutil.rmtree(path, ignore_errors=True)


def _mount_tmpfs(path: Path, size_mb: int, inodes: int) -> bool:
    if os.geteuid() != 0 or os.environ.get("HONING_SANDBOX_WORK_TMPFS", "1") == "0":
        return False
    try:
        opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700"
        rc = _libc().mount(b"honing-ws", os.fsencode(str(path)), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                           opts.encode())
    except (OSError, AttributeError):
        return False
    return rc == 0


def safe_relpath(name: str) -> str:
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise SandboxError(f"sandbox file name must be a relative path inside the workspace: {name!r}")
    return str(p)


def _special(src: str, names: list[str]) -> set[str]:
    """copytree ignore: fifos, sockets and devices a box made are not copied (a fifo would block)."""
    out = set()
    for n in names:
        try:
            m = os.lstat(os.path.join(src, n)).st_mode
        except OSError:
            out.add(n)
            continue
        if not (stat.S_ISREG(m) or stat.S_ISDIR(m) or stat.S_ISLNK(m)):
            out.add(n)
    return out


def _nofollow_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


class Workspace:
    """A private directory per box (mode 0700), bound read-write at /work inside the box."""

    def __init__(self, files: Mapping[str, bytes | str] | None = None, files_dir: str | Path | None = None) -> None:
        src = Path(files_dir) if files_dir is not None else None
        if src is not None and not src.is_dir():
            raise SandboxError(f"files dir does not exist or is not a directory: {src}")
        root = sandbox_root()
        tag = f"{os.getpid()}-"
        self.path = Path(tempfile.mkdtemp(prefix=f"ws-{tag}", dir=root))
        self._snapshots: dict[str, list[tuple[str, str, int, bytes | str | None]]] = {}
        size_mb = int(os.environ.get("HONING_SANDBOX_WORK_MB", "1024"))
        inodes = int(os.environ.get("HONING_SANDBOX_WORK_INODES", "65536"))
        self.quota_mb: int | None = size_mb if _mount_tmpfs(self.path, size_mb, inodes) else None
        self.quota_inodes: int | None = inodes if self.quota_mb is not None else None
        self._finalizer = weakref.finalize(self, _cleanup, self.path, self.quota_mb is not None)
        try:
            os.chmod(self.path, 0o700)
            if src is not None:
                try:
                    shutil.copytree(src, self.path, dirs_exist_ok=True, symlinks=True)
                except (OSError, shutil.Error) as e:
                    raise SandboxError(f"cannot copy files dir {src} into the workspace"
                                       f"{f' (quota {self.quota_mb} MB)' if self.quota_mb else ''}: {e}") from None
            self.write_many(files or {})
        except BaseException:
            self.close()
            raise

    def write_many(self, files: Mapping[str, bytes | str]) -> None:
        for name, data in files.items():
            self.write(name, data)

    def _open_parent(self, parts: tuple[str, ...], create: bool) -> int:
        """A dir fd for the parent of `parts`, walked one component at a time without following
        links (a link the box planted is an error, never a way out)."""
        cur = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                if create:
                    try:
                        os.mkdir(part, 0o777, dir_fd=cur)
                    except FileExistsError:
                        pass
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
                os.close(cur)
                cur = nxt
            return cur
        except BaseException:
            os.close(cur)
            raise

    def write(self, name: str, data: bytes | str, mode: int = 0o666) -> None:
        parts = Path(safe_relpath(name)).parts
        payload = data.encode() if isinstance(data, str) else data
        try:
            dir_fd = self._open_parent(parts, create=True)
            try:
                try:
                    st = os.lstat(parts[-1], dir_fd=dir_fd)
                    if not stat.S_ISREG(st.st_mode):  # a link or fifo the box left: replace it
                        if stat.S_ISDIR(st.st_mode):
                            raise SandboxError(f"cannot write sandbox file {name!r}: it is a directory")
                        os.unlink(parts[-1], dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
                    os.fchmod(f.fileno(), mode)
            finally:
                os.close(dir_fd)
        except OSError as e:
            hint = " (quota of the workspace reached)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
            raise SandboxError(f"cannot write sandbox file {name!r}: {e.strerror or e}{hint} "
                               "(links in the workspace are never followed)") from None

    def read(self, name: str, max_bytes: int = 1 << 24) -> bytes:
        """Read a file the box wrote; symlinks and non-regular files are refused."""
        parts = Path(safe_relpath(name)).parts
        fd = -1
        try:
            dir_fd = self._open_parent(parts, create=False)
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
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

    def usage(self) -> tuple[int, int]:
        """(bytes, entries) in the workspace, links not followed."""
        total = count = 0
        for dirpath, dirnames, filenames in os.walk(self.path):
            for n in dirnames + filenames:
                count += 1
                try:
                    total += os.lstat(os.path.join(dirpath, n)).st_size
                except OSError:
                    pass
        return total, count

    def snapshot(self) -> str:
        """Capture the workspace in memory (dirs, regular files, symlinks as links; fifos and
        devices are skipped). In memory because a turn's workspace is small and this runs every
        turn: no disk round trip."""
        sid = uuid.uuid4().hex[:12]
        entries: list[tuple[str, str, int, bytes | str | None]] = []
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(self.path / rel if rel else self.path) as it:
                for e in sorted(it, key=lambda x: x.name):
                    r = f"{rel}/{e.name}" if rel else e.name
                    st = e.stat(follow_symlinks=False)
                    if e.is_symlink():
                        entries.append(("link", r, 0, os.readlink(e.path)))
                    elif e.is_dir(follow_symlinks=False):
                        entries.append(("dir", r, stat.S_IMODE(st.st_mode), None))
                        stack.append(r)
                    elif e.is_file(follow_symlinks=False):
                        with open(e.path, "rb", opener=_nofollow_opener) as f:
                            entries.append(("file", r, stat.S_IMODE(st.st_mode), f.read()))
        self._snapshots[sid] = entries
        return sid

    def restore(self, sid: str) -> None:
        entries = self._snapshots.get(sid)
        if entries is None:
            raise SandboxError(f"unknown snapshot id {sid!r}")
        for child in self.path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        ordered = sorted(entries, key=lambda x: x[1].count("/"))
        for kind, rel, _, _ in ordered:  # directories first, writable while we fill them
            if kind == "dir":
                (self.path / rel).mkdir(mode=0o777, exist_ok=True)
        for kind, rel, mode, data in ordered:
            target = self.path / rel
            if kind == "dir":
                continue
            if kind == "link":
                os.symlink(data, target)  # type: ignore[arg-type]
            else:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)  # type: ignore[arg-type]
                os.chmod(target, mode)
        for kind, rel, mode, _ in reversed(ordered):  # then their modes, deepest first
            if kind == "dir":
                os.chmod(self.path / rel, mode)

    def close(self) -> None:
        self._finalizer()


def _cleanup(path: Path, mounted: bool) -> None:
    _remove_tree(path, mounted)
