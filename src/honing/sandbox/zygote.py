"""In-box server of a warm sandbox cell (see honing.sandbox.warm). STANDALONE: this file is
bound read-only into a bubblewrap box and run there by the system python3; it must import
nothing but the standard library (never honing, never the project's venv).

It runs as pid 1 of the box's pid namespace (bwrap --as-pid-1), which gives three things:
  * no job can signal it: the kernel drops every signal sent to a namespace's init from
    inside the namespace unless init installed a handler, and SIGKILL/SIGSTOP always;
  * every orphan of a job is re-parented to it, so it can reap and account for them;
  * `kill(-1, SIGKILL)` from it kills every other process of the box, atomically w.r.t. fork.
It also makes itself non-dumpable (inherited by the jobs), so a job (same uid, no
capabilities, no ptrace under the seccomp filter) cannot open /proc/1/fd/* to reach the
control channel.

Protocol. Host -> zygote on the box's stdin: a 4-byte big-endian length + marshal
(version 4) of a dict; the host is this channel's only writer. Zygote -> host on the box's
stdout: 4-byte total length, 4-byte header length, a JSON header, then raw blobs whose
lengths the header gives (stdout, stderr, collected files), so the host never unmarshals
anything from the box. At start both channel fds move to close-on-exec descriptors and
fds 0/1 point at /dev/null. Host frames:
  {"op": "run", "files", "collect", "limits",
   "job": marshal bytes of {"mode": "python"|"argv", "code"|"argv", "args", "limits", "stdin"}}
  {"op": "abort"}  (during a job: kill it now, reply with what it produced; ignored when idle)
Zygote frames: {"op": "ready", ...} once at start, then one result per "run".

Per job: the job's files are written to /work; a job process forked ahead of time (the
"spare": new session, fds 0/1/2 = /dev/null / stdout pipe / stderr pipe, every other fd
closed, blocked on a private pipe) is handed the job (marshal); it sets stdin (a memfd),
cwd /work and rlimits, then execs argv or runs the code in a fresh __main__ module. The
zygote drains the pipes (capped), reaps the job process (exit status, rusage), kills
whatever it left, reads the requested files (regular files only, no symlinks), empties
/work, /tmp and /dev/shm, removes SysV IPC objects, replies, then forks the next spare.
`clean: false` in a reply tells the host to retire this cell.

Cost model (what the speed comes from): a job is one fork of this preloaded interpreter,
and what it costs is mostly page faults (several microseconds each in a VM): every page a
process writes after a fork is copied (CPython's reference counts write to every object it
touches), and fork and exit copy and tear down the page tables of the whole heap. So: the
spare is forked with glibc's _Fork (CPython's after-fork work and the modules' at-fork
hooks: ~185 faults); every module and object a job's path needs is made here once
(`prepare`; `import atexit` in each job alone was ~100 faults); signal handlers are set
through _signal (the enum wrapping of `signal.signal`: ~35); the zygote freezes its
objects before each fork (a job's garbage collections then leave them alone); host
frames are marshal and replies are formatted by hand (the json module: ~80 faults in the
zygote); the reply goes out before the next fork; the preload list stays small.
"""

import atexit
import builtins
import ctypes
import errno
import gc
import io
import json
import linecache
import marshal
import os
import resource
import select
import signal
import _signal
import stat
import struct
import sys
import time
import types

HDR = struct.Struct(">I")
MAX_FRAME = 1 << 30
WORK = "/work"
MAIN_FILE = "/work/main.py"
SCRATCH_DIRS = ("/work", "/tmp", "/dev/shm")
MAX_COLLECT = 1 << 24
PR_SET_DUMPABLE = 4
IPC_RMID = 0

# What graded Python jobs (solutions + their unit tests) import most. Every preloaded module
# costs every job: fork copies page tables, exit unmaps them, and the interpreter's writes
# copy pages, all in proportion to the zygote's heap. So asyncio (2.5 MB), doctest,
# unittest.mock, logging, hashlib, subprocess and pickle are left to the jobs that need
# them. The host can pass another list: --preload=a,b,c
PRELOAD = (
    "abc", "argparse", "array", "ast", "base64", "bisect", "calendar", "collections",
    "collections.abc", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "enum", "fractions", "functools", "glob", "heapq", "inspect", "io", "itertools", "json",
    "linecache", "math", "numbers", "operator", "pathlib", "pprint", "queue", "random", "re",
    "shutil", "statistics", "string", "struct", "tempfile", "textwrap", "threading", "time",
    "timeit", "traceback", "types", "typing", "unittest", "warnings", "weakref", "zlib",
)

LIBC = ctypes.CDLL(None, use_errno=True)
ENV = dict(os.environ)  # the box's environment: bwrap --clearenv + the profile's fixed env
USE_CGROUP = "--cgroup" in sys.argv[1:]
DIR_MODES = {}


# ---------------------------------------------------------------------------- framing

def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = os.read(fd, n - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(fd):
    """A host frame: marshal (version 4) of a dict. Only the host writes this channel."""
    hdr = read_exact(fd, HDR.size)
    if hdr is None:
        return None
    (n,) = HDR.unpack(hdr)
    if n > MAX_FRAME:
        raise ValueError("control frame too large")
    body = read_exact(fd, n)
    return None if body is None else marshal.loads(body)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_frame(fd, meta, blobs=()):
    """A frame to the host: u32 total, u32 meta length, JSON meta, then raw blobs (their
    lengths are in the meta). The host parses JSON and lengths only, never marshal."""
    if not isinstance(meta, str):
        meta = json.dumps(meta, separators=(",", ":"))
    head = meta.encode()
    total = HDR.size + len(head) + sum(len(b) for b in blobs)
    write_all(fd, b"".join([HDR.pack(total), HDR.pack(len(head)), head, *blobs]))


def _js(v):
    """JSON for the scalars of a result (not the json module: what the zygote touches
    between forks costs it a page fault per page)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    return repr(v)


# ---------------------------------------------------------------------------- processes

REAPED = {}  # pid -> (status, rusage) of children reaped while a job runs


def reap_nohang():
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        REAPED[pid] = (status, usage)


def kill_everything(deadline_s=3.0):
    """SIGKILL every process of the box but this one and reap them all. kill(-1) from a
    namespace init reaches all others in one atomic sweep (a forking parent with a pending
    SIGKILL cannot create a child), so this loop ends after one pass in practice."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing left, zombies included
            return True
        reap_nohang()
        if time.monotonic() > end:
            return False
        try:
            pid, status, usage = os.wait4(-1, 0)  # sleep until the next death
            REAPED[pid] = (status, usage)
        except ChildProcessError:
            time.sleep(0.001)


# ---------------------------------------------------------------------------- filesystem

def rm_tree(path):
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        if st.st_mode & 0o700 != 0o700:
            os.chmod(path, 0o700)
        with os.scandir(path) as it:
            entries = [e.path for e in it]
        for p in entries:
            rm_tree(p)
        os.rmdir(path)
    else:
        os.unlink(path)


def clean_scratch():
    """Empty /work, /tmp, /dev/shm, restore their modes, drop SysV IPC objects. True when
    the box is back to its pristine state."""
    ok = True
    for d in SCRATCH_DIRS:
        try:
            if stat.S_IMODE(os.lstat(d).st_mode) != DIR_MODES[d]:
                os.chmod(d, DIR_MODES[d])
            entries = os.listdir(d)
            for name in entries:
                rm_tree(d + "/" + name)
            if entries and os.listdir(d):
                ok = False
        except (OSError, RecursionError):
            ok = False
    try:
        clean_ipc()
    except (OSError, ValueError):
        ok = False
    return ok


def clean_ipc():
    removed = False
    for kind, fn in (("shm", LIBC.shmctl), ("msg", LIBC.msgctl), ("sem", None)):
        for ident in _ipc_ids(kind):
            removed = True
            if fn is None:
                LIBC.semctl(ident, 0, IPC_RMID)
            else:
                fn(ident, IPC_RMID, None)
    if removed and any(_ipc_ids(k) for k in ("shm", "msg", "sem")):
        raise ValueError("SysV IPC objects survive")


def _ipc_ids(kind):
    try:
        fd = os.open("/proc/sysvipc/" + kind, os.O_RDONLY)
    except FileNotFoundError:
        return ()
    try:
        lines = os.read(fd, 1 << 16).split(b"\n")[1:]
    finally:
        os.close(fd)
    return [int(line.split()[1]) for line in lines if line.strip()]


def safe_rel(name):
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts:
        raise ValueError("bad file name %r" % name)
    return parts


def write_files(files):
    for name, data in files.items():
        parts = safe_rel(name)
        d = WORK
        for part in parts[:-1]:
            d = os.path.join(d, part)
            try:
                os.mkdir(d, 0o777)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(d).st_mode):
                    raise
        path = os.path.join(d, parts[-1])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def read_file(name):
    """A file the job left, without following symlinks; None when missing or not regular."""
    try:
        parts = safe_rel(name)
    except ValueError:
        return None
    fds = []
    try:
        cur = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY)
        fds.append(cur)
        for part in parts[:-1]:
            cur = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
            fds.append(cur)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=cur)
        fds.append(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], MAX_COLLECT
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------------- the child

def set_limit(res, value):
    soft, hard = resource.getrlimit(res)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(res, (value, value))


def apply_limits(lim):
    cpu = max(1, int(-(-lim["cpu_s"] // 1)))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY or hard > cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1 if hard == resource.RLIM_INFINITY else min(cpu + 1, hard)))
    set_limit(resource.RLIMIT_FSIZE, int(lim["file_size_mb"]) << 20)
    set_limit(resource.RLIMIT_NOFILE, int(lim["open_files"]))
    set_limit(resource.RLIMIT_CORE, 0)
    if not USE_CGROUP:
        set_limit(resource.RLIMIT_AS, (int(lim["memory_mb"]) + 64) << 20)
        set_limit(resource.RLIMIT_NPROC, int(lim["pids"]))


def _libc_fork():
    """glibc's _Fork(): a real fork (glibc's own state is fixed up in the child) that skips
    every atfork handler, and, called this way, CPython's after-fork work and the at-fork
    hooks of the preloaded modules too. Each of those touches memory that the child would
    otherwise have to copy (about 185 page faults per job, most of a bare fork's cost).
    Only sound because the zygote never has a second thread, holds no lock when it forks,
    and does what matters of that work itself (random is reseeded in the child)."""
    try:
        fn = ctypes.PyDLL(None, use_errno=True)._Fork  # PyDLL: the GIL stays held across the call
    except AttributeError:  # glibc < 2.34, musl: plain os.fork
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


FORK = _libc_fork()


def fork_job_process():
    """Fork a job process (no oom_score_adj games: /proc is read-only in the box; a job
    process maps all the zygote's pages plus its own, so an OOM kill picks it first)."""
    if FORK is None:
        return os.fork()
    pid = FORK()
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err) if err else "fork failed")
    if pid == 0:
        rnd = sys.modules.get("random")
        if rnd is not None:
            rnd._inst.seed()  # what random's at-fork hook does
    return pid


def spare_child(go_r, out_w, err_w):
    """A pre-forked job process (runs in the child; never returns). It does everything that
    does not depend on the job, then blocks until the zygote hands it one over `go_r`. Being
    forked while the cell is idle, it is already scheduled and warm when a job arrives."""
    code = 126
    try:
        os.setsid()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        # everything else goes: the control channel first of all
        os.closerange(3, go_r)
        os.closerange(go_r + 1, 1 << 20)
        os.umask(0o022)
        head = read_exact(go_r, HDR.size)
        req = None if head is None else read_exact(go_r, HDR.unpack(head)[0])
        os.close(go_r)
        if req is None:  # the zygote retired this spare
            os._exit(0)
        req = marshal.loads(req)
        if req.get("stdin") is not None:
            fd = os.memfd_create("stdin", 0)
            view = memoryview(req["stdin"])
            while view:
                view = view[os.write(fd, view):]
            os.lseek(fd, 0, os.SEEK_SET)
            os.dup2(fd, 0)
            os.close(fd)
        os.chdir(WORK)
        apply_limits(req["limits"])
        # the environment is the zygote's, which it never changes: the profile's, as is
        if req["mode"] == "argv":
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT):
                _signal.signal(sig, _signal.SIG_DFL)
            argv = req["argv"]
            try:
                os.execvpe(argv[0], argv, ENV)
            except OSError as e:
                os.write(2, ("honing: cannot execute %r: %s\n" % (argv[0], e.strerror)).encode())
                code = 127
        else:
            code = run_python(req)
    except BaseException as e:  # noqa: BLE001 - report, then die with a distinct code
        try:
            os.write(2, ("honing warm zygote: job setup failed: %r\n" % (e,)).encode())
        except OSError:
            pass
    finally:
        os._exit(code)


FORKS = [0]


class Spare:
    def __init__(self):
        # Objects the zygote made since the last fork go to the permanent generation: a job's
        # garbage collections then never walk (and copy the pages of) the zygote's objects.
        # A full collection now and then frees the zygote's own cyclic garbage.
        FORKS[0] += 1
        if FORKS[0] % 1000 == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        try:
            pid = fork_job_process()
        except OSError:
            for fd in (out_r, out_w, err_r, err_w, go_r, go_w):
                os.close(fd)
            raise
        if pid == 0:
            spare_child(go_r, out_w, err_w)
        for fd in (out_w, err_w, go_r):
            os.close(fd)
        self.pid, self.go_w, self.out_r, self.err_r = pid, go_w, out_r, err_r

    def hand_over(self, job):
        """Give the spare its job (marshal bytes, as the host sent them); False if it is gone
        (then it has been reaped)."""
        try:
            view = memoryview(HDR.pack(len(job)) + job)
            while view:
                view = view[os.write(self.go_w, view):]
            return True
        except OSError:
            self.discard()
            return False
        finally:
            try:
                os.close(self.go_w)
            except OSError:
                pass

    def discard(self):
        for fd in (self.out_r, self.err_r):
            os.close(fd)
        kill_everything()


SPARE = None
EPOLL = None


JOB_OBJECTS = None  # (stdin, stdout, stderr, __main__) built once by the zygote, see prepare()
KEEP = []  # the zygote's own stdio objects: a job replacing them must not free them (page faults)


def prepare():
    """Build what every Python job needs, once, in the zygote: each forked job inherits them
    instead of building its own. Everything a job touches on its way costs it page faults
    (copy-on-write), so: the stdio wrappers, a blank __main__, every module the job path
    uses imported here (importing `atexit` in each job alone cost ~100 faults). The stdio
    wrappers sit on fds 0/1/2, which a job process points at its own stdin/stdout/stderr
    before using them; the zygote never writes to them."""
    global JOB_OBJECTS
    unbuffered = bool(ENV.get("PYTHONUNBUFFERED"))

    def out(fd, errors):
        raw = io.FileIO(fd, "wb", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buf, encoding="utf-8", errors=errors, write_through=unbuffered or fd == 2)

    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding="utf-8",
                             errors="strict")
    main = types.ModuleType("__main__")
    main.__file__ = MAIN_FILE
    main.__builtins__ = builtins
    main.__spec__ = None
    JOB_OBJECTS = (stdin, out(1, "strict"), out(2, "backslashreplace"), main)
    KEEP.extend([sys.stdin, sys.stdout, sys.stderr, sys.modules.get("__main__")])


def run_python(req):
    """Run source code the way `python3 /work/main.py` would, in this forked interpreter."""
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # not signal.signal: its enum work costs faults
    stdin, stdout, stderr, main = JOB_OBJECTS
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr
    sys.modules["__main__"] = main
    sys.argv = ["main.py"] + [str(a) for a in req.get("args") or ()]
    sys.path.insert(0, WORK)
    source = req["code"]
    linecache.cache[MAIN_FILE] = (len(source), None, source.splitlines(True), MAIN_FILE)
    try:
        exec(compile(source, MAIN_FILE, "exec", dont_inherit=True), main.__dict__)
        code = 0
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:  # noqa: BLE001 - what the interpreter would print
        etype, value, tb = sys.exc_info()
        tb = tb.tb_next if tb is not None else None  # drop this function's frame
        try:
            if sys.excepthook is sys.__excepthook__:  # the C hook cannot show our source lines
                import traceback
                traceback.print_exception(etype, value, tb)
            else:
                sys.excepthook(etype, value, tb)
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    try:  # interpreter shutdown: non-daemon threads, atexit, flush
        threading = sys.modules.get("threading")
        if threading is not None and getattr(threading, "_shutdown_locks", True):
            threading._shutdown()  # only when the job started a non-daemon thread
        if atexit._ncallbacks():
            atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            if code == 0:
                code = 120
    return code


def exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except BaseException:  # noqa: BLE001
        pass
    return 1


# ---------------------------------------------------------------------------- a job

def run_job(req, ctl_in):
    global SPARE
    t0 = time.monotonic()
    try:
        write_files(req.get("files") or {})
    except (OSError, ValueError) as e:
        clean = clean_scratch()
        return {"op": "result", "error": "cannot prepare the job directory: %s" % (e,), "clean": clean}, (), clean
    job = req["job"]  # mode, code/argv, args, limits, stdin: marshal, for the job process only
    REAPED.clear()
    t_start = time.monotonic()
    for _ in range(2):
        spare, SPARE = SPARE or Spare(), None
        if spare.hand_over(job):
            break
    else:
        return {"op": "result", "error": "cannot start the job process", "clean": False}, (), False
    pid, out_r, err_r = spare.pid, spare.out_r, spare.err_r

    cap = int(req["limits"]["output_bytes"])
    bufs = {out_r: bytearray(), err_r: bytearray()}
    truncated = False
    aborted = False
    t_end = None
    sel = EPOLL
    for fd in bufs:
        sel.register(fd, select.EPOLLIN)
    sel.register(ctl_in, select.EPOLLIN)
    watched = [out_r, err_r, ctl_in]
    try:
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, select.EPOLLIN)
    except (AttributeError, OSError):
        pidfd = None  # old kernel: poll for the child's death
    open_pipes = 2
    try:
        while open_pipes or pid not in REAPED:
            events = sel.poll(-1 if pidfd is not None else 0.005)
            for fd, _ in events:
                if fd in bufs:
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(fd)
                        watched.remove(fd)
                        os.close(fd)
                        open_pipes -= 1
                        continue
                    buf = bufs[fd]
                    room = cap - len(buf)
                    if room > 0:
                        buf += data[:room]
                    if len(data) > max(room, 0):
                        truncated = True
                elif fd == ctl_in:
                    try:
                        msg = read_frame(ctl_in)
                    except (ValueError, EOFError, TypeError):
                        msg = None
                    if not isinstance(msg, dict):  # the host is gone: so are we, and the box
                        kill_everything()
                        os._exit(0)
                    if msg.get("op") == "abort":
                        aborted = True
                        kill_everything()
                        sel.unregister(ctl_in)
                        watched.remove(ctl_in)
                elif fd == pidfd:
                    reap_nohang()
            if pidfd is None:
                reap_nohang()
            if pid in REAPED and t_end is None:
                t_end = time.monotonic()
                if pidfd is not None:
                    sel.unregister(pidfd)
                    os.close(pidfd)
                kill_everything()  # leftovers (daemons, forks) hold the pipes open
    finally:
        for fd in watched:
            try:
                sel.unregister(fd)
            except (OSError, ValueError):
                pass
        if pidfd is not None and t_end is None:
            try:
                sel.unregister(pidfd)
            except (OSError, ValueError):
                pass
            os.close(pidfd)
    settled = kill_everything()
    status, usage = REAPED[pid]
    names, blobs = [], [bufs[out_r], bufs[err_r]]
    for name in req.get("collect") or ():
        data = read_file(name)
        if data is not None:
            names.append([name, len(data)])
            blobs.append(data)
    clean = clean_scratch() and settled
    exit_status = signum = None
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
    else:
        exit_status = os.WEXITSTATUS(status)
    meta = ('{"op":"result","exit":%s,"signal":%s,"truncated":%s,"aborted":%s,"clean":%s,"wall_s":%s,'
            '"setup_s":%s,"cpu_s":%s,"max_rss_kb":%s,"out":%d,"err":%d,"files":%s}') % (
        _js(exit_status), _js(signum), _js(truncated), _js(aborted), _js(clean),
        _js((t_end or time.monotonic()) - t_start), _js(t_start - t0), _js(usage.ru_utime + usage.ru_stime),
        _js(usage.ru_maxrss), len(blobs[0]), len(blobs[1]), json.dumps(names) if names else "[]")
    return meta, blobs, clean


# ---------------------------------------------------------------------------- main

def preload():
    names = PRELOAD
    for arg in sys.argv[1:]:
        if arg.startswith("--preload="):
            names = tuple(n for n in arg[len("--preload="):].split(",") if n)
    n = 0
    for name in names:
        try:
            __import__(name)
            n += 1
        except Exception:  # noqa: BLE001 - a missing optional module is fine
            pass
    return n


def main():
    if os.getpid() != 1:
        sys.stderr.write("honing zygote: must run as pid 1 of its box (bwrap --as-pid-1)\n")
        return 2
    if LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.stderr.write("honing zygote: cannot make itself non-dumpable\n")
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctl_in = os.dup(0)  # os.dup gives close-on-exec descriptors
    ctl_out = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # the zygote's own directory is not a job's import path
    for d in SCRATCH_DIRS:
        DIR_MODES[d] = stat.S_IMODE(os.lstat(d).st_mode)
    n = preload()
    prepare()
    global EPOLL
    EPOLL = select.epoll()
    clean = clean_scratch()
    gc.collect()
    gc.freeze()  # the preloaded heap stays shared with every forked job (fewer copy-on-write faults)
    global SPARE
    SPARE = Spare()
    write_frame(ctl_out, {"op": "ready", "pid": os.getpid(), "python": sys.version.split()[0],
                          "preloaded": n, "clean": clean})
    while True:
        try:
            msg = read_frame(ctl_in)
        except (OSError, ValueError, EOFError, TypeError):
            msg = None
        if not isinstance(msg, dict):  # the host is gone (or speaks nonsense): so is the box
            kill_everything()
            return 0
        op = msg.get("op")
        if op == "run":
            try:
                meta, blobs, clean = run_job(msg, ctl_in)
            except Exception as e:  # noqa: BLE001 - tell the host; it retires this cell
                kill_everything()
                meta, blobs, clean = {"op": "result", "error": "zygote failure: %s: %s" % (
                    type(e).__name__, e), "clean": False}, (), False
            try:
                write_frame(ctl_out, meta, blobs)
            except OSError as e:
                if e.errno in (errno.EPIPE, errno.EBADF):
                    kill_everything()
                    return 0
                raise
            if clean and SPARE is None:
                # The next job's process. Forked after the reply: until a fork, the pages the
                # zygote touches are its own (cheap faults); after it, they are shared (copies).
                try:
                    SPARE = Spare()
                except OSError:
                    SPARE = None  # the next job tries again (and reports if it cannot)
        elif op == "exit":
            kill_everything()
            return 0
        # "abort" while idle: a job that finished as the host gave up on it; nothing to do


if __name__ == "__main__":
    sys.exit(main())
