"""The default isolation backend: bubblewrap + cgroups (or rlimits).

What a box gets: new user, pid, net (loopback only), ipc, uts, mount and cgroup namespaces,
and no further user namespaces inside (--disable-userns); all capabilities dropped; uid 1000
('box') inside, mapped to an unprivileged host uid (HONING_SANDBOX_HOST_UID, default 65534)
when the host runs as root, so a box process is never host root even without capabilities;
a seccomp filter that refuses ptrace, process_vm_*, keyrings, bpf, perf, userfaultfd,
io_uring, mount/namespace/module/clock/reboot syscalls (x86_64 and aarch64); a read-only
view of the profile's toolchain; a read-only root, /dev and /proc (/proc/sys holds the
host's sysctls); generated /etc/passwd, /etc/group, /etc/hosts (no host user names); the
workspace read-write at /work (a size-capped tmpfs where the host may mount: workspace.py);
size-capped tmpfs /tmp and /dev/shm; its own /proc (only its own processes); an
allow-listed environment. bwrap's options travel through a memfd (--args), so the box's
pid 1 shows no host path in its command line.

Limits: wall time (enforced from outside), CPU time, file size and open files (rlimits);
memory and process count (cgroup when available, else RLIMIT_AS / RLIMIT_NPROC);
stdout/stderr capped with a `truncated` flag. When a job ends, every process of the box is
dead: the cgroup is emptied with SIGKILL and the pid namespace dies with its init. The
reported CPU time is the cgroup's (the rusage of bwrap misses what its pid 1 reaped).
`infra_error` is set only when bwrap's status pipe shows the command never started, so a
program cannot fake one by printing bwrap's messages.

What it does NOT protect against: the box shares the host kernel, so a kernel exploit
escapes it; timing side channels; CPU contention with other work. For hostile
multi-tenant use put it inside a gVisor or VM layer. An exit status above 128 is read as
"killed by signal (status - 128)": bwrap reports a signal death that way, so a program that
calls exit(137) is reported with signal 9 too.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Sequence

from honing.sandbox import cgroups
from honing.sandbox.profiles import BOX_UID, Profile, _system_paths
from honing.sandbox.types import ExecResult, Limits, SandboxError

_MERGED_USR_LINKS = ("bin", "lib", "lib64", "sbin", "lib32")
DEFAULT_HOST_UID = 65534  # 'nobody': what a box's uid maps to on the host when honing runs as root


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap (bwrap) is not installed: run `make setup` as root, or "
                           "`apt-get install bubblewrap`; the unsafe 'local' backend is never used silently")
    return path


# --- seccomp ---------------------------------------------------------------------------------
# A classic-BPF filter over seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {  # name: (x86_64, aarch64)
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "userfaultfd": (323, 282), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "unshare": (272, 97), "setns": (308, 268), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "acct": (163, 89), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "syslog": (103, 116), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "quotactl": (179, 60), "vhangup": (153, 58), "settimeofday": (164, 170), "clock_settime": (227, 112),
    "adjtimex": (159, 171), "clock_adjtime": (305, 266), "lookup_dcookie": (212, 18),
}
_ENOSYS_SYSCALLS = {  # refused with ENOSYS so that libc and runtimes fall back
    "clone3": (435, 435), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
_CLONE = (56, 220)
_CLONE_NS_FLAGS = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The box's seccomp filter for this CPU, or None where no table is known."""
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    col = 0 if machine == "x86_64" else 1
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [_bpf(LD, 4), _bpf(JEQ, _AUDIT_ARCH[machine], 1, 0), _bpf(RET, _RET_ERRNO | _ENOSYS), _bpf(LD, 0)]
    if machine == "x86_64":  # the x32 ABI: another way in to every syscall
        prog += [_bpf(JGE, 0x40000000, 0, 1), _bpf(RET, _RET_ERRNO | _EPERM)]
    for table, err in ((_SYSCALLS, _EPERM), (_ENOSYS_SYSCALLS, _ENOSYS)):
        for nrs in table.values():
            prog += [_bpf(JEQ, nrs[col], 0, 1), _bpf(RET, _RET_ERRNO | err)]
    # clone(flags, ...) with any namespace flag: refused (fork, threads and vfork pass)
    prog += [_bpf(JEQ, _CLONE[col], 0, 3), _bpf(LD, 16), _bpf(JSET, _CLONE_NS_FLAGS, 0, 1),
             _bpf(RET, _RET_ERRNO | _EPERM), _bpf(RET, _RET_ALLOW)]
    return b"".join(prog)


# --- helpers ---------------------------------------------------------------------------------
def _memfd(data: bytes, name: str) -> int:
    """An fd holding `data`, read by bwrap (args, seccomp filter, generated /etc files)."""
    try:
        fd = os.memfd_create(f"honing-{name}", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        f = tempfile.TemporaryFile()
        fd = os.dup(f.fileno())
        f.close()
    _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _give_tree(root: Path, uid: int) -> None:
    """Hand the workspace to the box's host uid (links are not followed: lchown)."""
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            try:
                os.lchown(os.path.join(dirpath, n), uid, uid)
            except OSError:
                pass


def _wanted_host_uid() -> int | None:
    if os.geteuid() != 0:
        return None  # bwrap maps the box to the caller's own (unprivileged) uid
    raw = os.environ.get("HONING_SANDBOX_HOST_UID", str(DEFAULT_HOST_UID)).strip()
    if raw.lower() in ("", "off", "none", "0"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise SandboxError(f"HONING_SANDBOX_HOST_UID must be a number or 'off', got {raw!r}") from None


_probe_cache: dict[tuple, str | None] = {}
_probe_lock = threading.Lock()


def _probe_host_uid(bwrap: str, setpriv: str, uid: int, disable_userns: bool) -> str | None:
    """None when bwrap works started as `uid` (needs unprivileged user namespaces and a
    sandbox dir that uid can reach); else why not."""
    from honing.sandbox.workspace import sandbox_root

    root = sandbox_root()
    key = (bwrap, uid, str(root), disable_userns)
    with _probe_lock:
        if key in _probe_cache:
            return _probe_cache[key]
        d = Path(tempfile.mkdtemp(prefix=f"ws-{os.getpid()}-probe-", dir=root))
        try:
            os.chown(d, uid, uid)
            cmd = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", bwrap,
                   "--unshare-all", "--unshare-user", *(["--disable-userns"] if disable_userns else []),
                   "--uid", str(BOX_UID), "--gid", str(BOX_UID)]
            for p in _system_paths():
                cmd += ["--ro-bind", p, p]
            for name in _MERGED_USR_LINKS:
                if os.path.islink(f"/{name}"):
                    cmd += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
            cmd += ["--bind", str(d), "/work", "--", "/bin/sh", "-c", "echo ok > /work/probe"]
            r = subprocess.run(cmd, capture_output=True, timeout=20, cwd="/", env={"PATH": "/usr/bin:/bin"})
            ok = r.returncode == 0 and (d / "probe").is_file()
            why = None if ok else (r.stderr.decode(errors="replace").strip() or f"exit {r.returncode}")
        except (OSError, subprocess.SubprocessError) as e:
            why = str(e)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        _probe_cache[key] = why
        return why


_bwrap_help: dict[str, str] = {}


def _supports(bwrap: str, option: str) -> bool:
    if bwrap not in _bwrap_help:
        try:
            r = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10)
            _bwrap_help[bwrap] = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
        except (OSError, subprocess.SubprocessError):
            _bwrap_help[bwrap] = ""
    return option in _bwrap_help[bwrap]


class _Capped:
    """Drain a pipe fully, keep at most `cap` bytes."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        self.buf = bytearray()
        self.truncated = False
        self.thread = threading.Thread(target=self._run, args=(stream, cap), daemon=True)
        self.thread.start()

    def _run(self, stream: IO[bytes], cap: int) -> None:
        while chunk := stream.read(65536):
            room = cap - len(self.buf)
            if room > 0:
                self.buf += chunk[:room]
            if len(chunk) > max(room, 0):
                self.truncated = True
        stream.close()

    def text(self) -> str:
        self.thread.join(timeout=5)
        return self.buf.decode("utf-8", "replace")


def bwrap_argv(bwrap: str, profile: Profile, workspace: Path, limits: Limits, argv: Sequence[str],
               extra_ro: Sequence[tuple[str, str]] = (), data_fds: Mapping[str, int] | None = None,
               seccomp_fd: int | None = None, disable_userns: bool = True) -> list[str]:
    """bwrap's command line. `data_fds` maps box paths to fds holding generated files (bound
    read-only); without them the profile's generated files are left out."""
    tmpfs = str(limits.tmpfs_mb << 20)
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--uid", str(BOX_UID), "--gid", str(BOX_UID), "--hostname", "box", "--clearenv"]
    if disable_userns:
        cmd += ["--disable-userns"]
    for k, v in profile.environment().items():
        cmd += ["--setenv", k, v]
    for p in profile.ro_paths:
        cmd += ["--ro-bind", p, p]
    for host, box in getattr(profile, "binds", ()):
        cmd += ["--ro-bind", host, box]
    for name in _MERGED_USR_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            cmd += ["--symlink", os.readlink(host), host]
    for path, fd in (data_fds or {}).items():
        cmd += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", tmpfs, "--perms", "1777", "--tmpfs", "/tmp",
            "--size", tmpfs, "--perms", "1777", "--tmpfs", "/dev/shm", "--bind", str(workspace), "/work"]
    for host, box in extra_ro:
        cmd += ["--ro-bind", host, box]
    # read-only: /proc too (bwrap leaves /proc/sys writable, and its sysctls are host-wide: a box
    # running as host root could rewrite kernel.core_pattern), /dev and the root; /tmp, /dev/shm
    # and /work stay writable
    cmd += ["--remount-ro", "/proc", "--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--chdir", "/work", "--", *argv]
    return cmd


def _rlimit_argv(limits: Limits, with_cgroup: bool) -> list[str]:
    cpu = max(1, math.ceil(limits.cpu_s))
    out = ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--fsize={limits.file_size_mb << 20}",
           f"--nofile={limits.open_files}", "--core=0"]
    if not with_cgroup:
        out += [f"--as={(limits.memory_mb + 64) << 20}", f"--nproc={limits.pids}"]
    return out + ["--"]


class BwrapBackend:
    name = "bwrap"

    def __init__(self, use_cgroups: bool = True) -> None:
        self.bwrap = find_bwrap()
        if shutil.which("prlimit") is None:
            raise SandboxError("prlimit (util-linux) is needed to set a box's rlimits")
        self.cgroup_version = cgroups.detect() if use_cgroups else None
        self.disable_userns = _supports(self.bwrap, "--disable-userns")
        self.seccomp = seccomp_program()
        self.host_uid: int | None = None
        self.host_uid_note = "the caller's own uid" if os.geteuid() != 0 else "host root (no capabilities)"
        wanted = _wanted_host_uid()
        setpriv = shutil.which("setpriv")
        if wanted is not None:
            why = "setpriv (util-linux) is missing" if setpriv is None else \
                _probe_host_uid(self.bwrap, setpriv, wanted, self.disable_userns)
            if why is None:
                self.host_uid, self.setpriv = wanted, setpriv
                self.host_uid_note = f"host uid {wanted}"
            else:
                self.host_uid_note += f" (cannot start boxes as uid {wanted}: {why[:200]})"

    def mechanisms(self) -> dict[str, str]:
        cg = f"cgroup {self.cgroup_version}" if self.cgroup_version else None
        return {
            "isolation": f"bubblewrap ({self.bwrap}): user/pid/net/ipc/uts/mount/cgroup namespaces, caps dropped"
                         + (", no nested user namespaces" if self.disable_userns else ""),
            "identity": f"uid {BOX_UID} in the box = {self.host_uid_note}",
            "syscalls": f"seccomp filter ({platform.machine()})" if self.seccomp
                        else f"no seccomp filter (no syscall table for {platform.machine()})",
            "network": "none (loopback only)",
            "memory": cg or "RLIMIT_AS (no writable cgroup memory controller)",
            "pids": cg or "RLIMIT_NPROC (no writable cgroup pids controller)",
            "cpu_time": "RLIMIT_CPU", "file_size": "RLIMIT_FSIZE", "open_files": "RLIMIT_NOFILE",
            "wall_time": "killed from outside (cgroup / process group + pid namespace)",
            "workspace": (f"tmpfs per workspace, {os.environ.get('HONING_SANDBOX_WORK_MB', '1024')} MB / "
                          f"{os.environ.get('HONING_SANDBOX_WORK_INODES', '65536')} files"
                          if os.geteuid() == 0 and os.environ.get("HONING_SANDBOX_WORK_TMPFS", "1") != "0"
                          else "plain directory (files capped by RLIMIT_FSIZE, total by wall time only)"),
        }

    def run(self, argv: Sequence[str], workspace: Path, profile: Profile, limits: Limits,
            stdin: bytes | None = None, extra_ro: Sequence[tuple[str, str]] = ()) -> ExecResult:
        fds: list[int] = []
        status_r = -1
        try:
            # bwrap reports {"exit-code": N} here only once the command was exec'd: how a failed
            # setup (infra) is told apart from a program that prints "bwrap: ..." and exits 1.
            status_r, status_w = os.pipe()
            fds.append(status_w)
            data_fds = {path: _memfd(text.encode(), "etc") for path, text in profile.data.items()}
            fds += data_fds.values()
            seccomp_fd = _memfd(self.seccomp, "seccomp") if getattr(self, "seccomp", None) else None
            if seccomp_fd is not None:
                fds.append(seccomp_fd)
            box = bwrap_argv(self.bwrap, profile, workspace, limits, argv, extra_ro, data_fds, seccomp_fd,
                             getattr(self, "disable_userns", False))
            # bwrap takes its options from the memfd; the command itself stays on the command line
            sep = box.index("--")
            opts = [*box[1:sep], "--json-status-fd", str(status_w)]
            args_fd = _memfd(b"".join(os.fsencode(a) + b"\0" for a in opts), "args")
            fds.append(args_fd)
            launcher = [box[0], "--args", str(args_fd), *box[sep:]]
            host_uid = getattr(self, "host_uid", None)
            if host_uid is not None:
                _give_tree(workspace, host_uid)
                launcher = [self.setpriv, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--",
                            *launcher]
            return self._run(launcher, limits, stdin, fds, status_r)
        finally:
            for fd in fds:
                os.close(fd)
            if status_r >= 0:
                os.close(status_r)

    def _run(self, launcher: list[str], limits: Limits, stdin: bytes | None, fds: list[int],
             status_fd: int = -1) -> ExecResult:
        cg = cgroups.BoxCgroup.create(self.cgroup_version, limits.memory_mb, limits.pids) \
            if self.cgroup_version else None
        cmd = _rlimit_argv(limits, cg is not None) + launcher
        if cg is not None:  # join the cgroup before anything of the box exists
            joins = "; ".join(f'echo $$ > "{f}"' for f in cg.procs_files())
            cmd = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *cmd]
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin"}, cwd="/", pass_fds=fds)
        except OSError as e:
            _close_all(fds)
            if cg:
                cg.remove()
            return ExecResult(-1, "", "", backend=self.name, infra_error=f"cannot start bwrap: {e}")
        _close_all(fds)  # the child has its copies
        out, err = _Capped(proc.stdout, limits.output_bytes), _Capped(proc.stderr, limits.output_bytes)  # type: ignore[arg-type]
        if stdin:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            _kill(proc, cg)

        timer = threading.Timer(limits.timeout_s, on_timeout)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        oom = cg.oom_killed() if cg else False
        peak = cg.peak_mb() if cg else usage.ru_maxrss / 1024
        cpu = usage.ru_utime + usage.ru_stime
        if cg:
            cg.kill_all()  # bwrap's pid 1 may still be winding down: count all of it
            cpu = cg.cpu_s() or cpu
            cg.remove()  # kills anything left (e.g. a daemon that escaped the session)
        stdout, stderr = out.text(), err.text()
        rc = proc.returncode
        sig = -rc if rc < 0 else (rc - 128 if rc > 128 else None)
        started = b'"exit-code"' in _read_available(status_fd) if status_fd >= 0 else True
        if not started and not timed_out.is_set() and not oom and rc != 0 \
                and not stderr.startswith("bwrap: execvp"):  # a missing command is the job's own error
            return ExecResult(rc, stdout, stderr, backend=self.name, wall_s=wall,
                              infra_error=f"the box did not start: {stderr.strip()[:500] or f'exit {rc}'}")
        if not cg and "MemoryError" in stderr:
            oom = True
        return ExecResult(
            exit_code=rc, stdout=stdout, stderr=stderr, truncated=out.truncated or err.truncated,
            timed_out=timed_out.is_set(), oom=oom, signal=sig, wall_s=wall,
            cpu_s=cpu, max_rss_mb=peak, backend=self.name,
        )


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


def _kill(proc: subprocess.Popen, cg: cgroups.BoxCgroup | None) -> None:
    if cg is not None:
        cg.kill_all()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
