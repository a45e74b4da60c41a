"""Adversarial suite: hostile programs against the bwrap box.

Each case asserts both that the host is unharmed and that the ExecResult reports what
happened. Limits are small (2 s, 128 MB, 32 pids) so the whole suite stays short.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO, host_pids, leaked_cgroups, marker, new_processes, pids_named, pids_with, small_limits, wait_gone

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)

from honing.sandbox import Limits, SandboxError, get_profile  # noqa: E402
from honing.sandbox.workspace import Workspace  # noqa: E402

pytestmark = pytest.mark.usefixtures("host_unharmed")
IS_ROOT = os.geteuid() == 0


def needs_cgroup(sandbox) -> None:
    if sandbox.backend.cgroup_version is None:
        pytest.skip("no writable cgroup memory/pids controllers here (rlimits only)")


def py(sandbox, code: str, *args: str, **kw):
    """Run `code` as /work/main.py with the python profile."""
    files = {"main.py": code, **kw.pop("files", {})}
    return sandbox.exec(["python3", "main.py", *args], files=files, profile="python", **kw)


# --- processes -------------------------------------------------------------------------------

FORK_BOMB = """
import os, sys, time
root, end, fails = os.getpid(), time.time() + 0.8, 0
while time.time() < end:
    try:
        pid = os.fork()
    except OSError:
        fails += 1
        time.sleep(0.01)
        continue
    if pid == 0:
        fails = 0
if os.getpid() != root:
    time.sleep(30)
    os._exit(0)
seen = len([p for p in os.listdir('/proc') if p.isdigit()])
print('fork_failures', fails, 'procs_seen', seen, flush=True)
"""


def test_fork_bomb_held_by_pids_limit(sandbox):
    needs_cgroup(sandbox)
    tag, before = marker(), set(host_pids())
    res = py(sandbox, FORK_BOMB, tag, limits=small_limits(pids=32, timeout_s=4))
    # reported: the bomb ran into the limit and the job still ended by itself
    assert res.infra_error is None and not res.timed_out, res
    words = res.stdout.split()
    assert words[0] == "fork_failures" and int(words[1]) > 0, res.stdout
    assert int(words[3]) <= 32, res.stdout
    # host: nothing of it is left, neither under this process nor orphaned to init
    assert wait_gone(tag) == []
    assert new_processes(before, "python3") == []
    assert leaked_cgroups() == []


def test_shell_fork_bomb_times_out_and_is_reaped(sandbox):
    tag = marker()
    res = sandbox.exec(f"bomb() {{ bomb | bomb & }}; bomb; sleep 30 # {tag}", profile="shell",
                       limits=small_limits(timeout_s=1.5))
    assert res.timed_out and res.wall_s < 4, res
    assert wait_gone(tag) == [] and wait_gone("bomb | bomb") == []


def test_infinite_loop_hits_wall_timeout(sandbox):
    res = py(sandbox, "while True:\n    pass\n", limits=small_limits(timeout_s=1, cpu_s=30))
    assert res.timed_out and res.signal == 9 and not res.ok
    assert 0.9 <= res.wall_s < 2.5, res.wall_s
    assert leaked_cgroups() == []


def test_infinite_loop_hits_cpu_limit(sandbox):
    tag = marker()
    res = py(sandbox, "while True:\n    pass\n", tag, limits=small_limits(timeout_s=8, cpu_s=1))
    # RLIMIT_CPU: SIGXCPU at the soft limit (SIGKILL at the hard one), before the wall timeout
    assert not res.timed_out and res.signal in (9, 24), res
    if sandbox.backend.cgroup_version:  # the whole box's CPU time comes from the cgroup
        assert res.cpu_s >= 0.8, res.cpu_s
    assert wait_gone(tag) == []


def test_sleep_forever_is_killed_from_outside(sandbox):
    tag = marker()
    res = sandbox.exec(f"sleep 1000 & sleep 1000; : {tag}", profile="shell", limits=small_limits(timeout_s=1))
    assert res.timed_out and res.signal == 9
    assert 0.9 <= res.wall_s < 2.5
    assert wait_gone(tag) == []


def test_os_exit_code_is_reported(sandbox):
    res = py(sandbox, "import os\nprint('bye', flush=True)\nos._exit(3)\n")
    assert res.exit_code == 3 and res.signal is None and res.stdout == "bye\n" and not res.timed_out


def test_sigkill_of_itself_is_reported(sandbox):
    res = py(sandbox, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert res.signal == 9 and not res.timed_out and not res.oom and not res.ok


def test_killing_parent_and_pid1_does_not_reach_host(sandbox):
    canary = __import__("subprocess").Popen(["sleep", "30"])
    try:
        res = sandbox.exec("kill -9 $PPID; kill -9 1; echo still-here; kill -9 -1; echo after-all; kill -9 $$",
                           profile="shell")
        # the box's init ignores kills from inside; kill -1 reaches only the box's own processes
        assert res.stdout.split() == ["still-here", "after-all"] and not res.timed_out
        assert res.signal == 9, res
        assert canary.poll() is None, "a host process was killed from inside the box"
        assert os.getppid() > 1
    finally:
        canary.kill()
        canary.wait()


def test_ptrace_and_process_vm_are_refused(sandbox):
    code = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
child = os.fork()
if child == 0:
    time.sleep(5)
    os._exit(0)
out = []
for target in (1, child, os.getppid()):
    rc = libc.ptrace(16, target, None, None)  # PTRACE_ATTACH
    out.append((rc, ctypes.get_errno()))
buf = ctypes.create_string_buffer(8)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
iov = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                                  ctypes.c_ulong, ctypes.c_ulong]
rc = libc.process_vm_readv(child, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
out.append((rc, ctypes.get_errno()))
print(out)
os.kill(child, 9)
"""
    res = py(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "[(-1, 1), (-1, 1), (-1, 1), (-1, 1)]"  # all EPERM
    assert not res.timed_out


DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        while True:
            with open('/work/heartbeat', 'a') as f:
                f.write('beat\\n')
            time.sleep(0.02)
    os._exit(0)
time.sleep(0.3)
print('parent leaves')
"""


def test_double_forked_daemon_dies_with_its_job(sandbox):
    tag = marker()
    with sandbox.open("python", files={"daemon.py": DAEMON}) as s:
        res = s.exec(["python3", "daemon.py", tag])
        assert res.exit_code == 0 and res.stdout == "parent leaves\n" and not res.timed_out
        size = len(s.read("heartbeat"))
        assert size > 0, "the daemon never started"
        time.sleep(0.3)
        assert len(s.read("heartbeat")) == size, "the daemon outlived its job"
        assert wait_gone(tag, 0.5) == []


ZOMBIES = """
import ctypes, os, time
libc = ctypes.CDLL(None)
made = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        libc.prctl(15, NAME.encode(), 0, 0, 0)  # PR_SET_NAME
        os._exit(0)
    made += 1
time.sleep(0.2)
zombies = 0
for p in os.listdir('/proc'):
    try:
        if p.isdigit() and open(f'/proc/{p}/stat').read().split(') ')[1].startswith('Z'):
            zombies += 1
    except OSError:
        pass
print(made, zombies)
"""


def test_zombie_storm_leaves_no_zombies(sandbox):
    needs_cgroup(sandbox)
    name = marker()[-14:]  # comm keeps 15 chars
    res = py(sandbox, f"NAME = {name!r}\n" + ZOMBIES)
    made, zombies = map(int, res.stdout.split())
    assert res.exit_code == 0 and made >= 20 and zombies >= 20, res
    assert made < 32, "the pids limit counts zombies too"
    time.sleep(0.1)
    assert pids_named(name) == []


def test_processes_run_as_unprivileged_host_uid(sandbox):
    if not IS_ROOT:
        pytest.skip("the box maps to the caller's uid when not root")
    if os.environ.get("HONING_SANDBOX_HOST_UID", "").lower() in ("off", "none", "0"):
        pytest.skip("HONING_SANDBOX_HOST_UID=off: boxes run as host root without capabilities, by request")
    tag = marker()
    seen: dict[int, int] = {}

    def scan():
        end = time.monotonic() + 3
        while time.monotonic() < end and not seen:
            for pid in pids_with(tag):
                try:
                    st = Path(f"/proc/{pid}/status").read_text()
                    ruid = int(next(line for line in st.splitlines() if line.startswith("Uid:")).split()[1])
                    if Path(f"/proc/{pid}/comm").read_text().strip() in ("python3", "bwrap"):
                        seen[pid] = ruid
                except (OSError, StopIteration):
                    pass
            time.sleep(0.02)

    t = threading.Thread(target=scan)
    t.start()
    res = sandbox.exec(["python3", "-c", "import time; time.sleep(1)", tag], profile="python")
    t.join()
    assert res.exit_code == 0
    assert seen and all(uid != 0 for uid in seen.values()), seen
    assert "host uid" in sandbox.mechanisms()["identity"]


# --- memory, disk, output ----------------------------------------------------------------------

def test_heap_memory_bomb(sandbox):
    code = "a = []\nwhile True:\n    a.append(b'x' * (8 << 20))\n    print(len(a), flush=True)\n"
    # time and CPU limits far off: only the memory limit may stop it (under load, 2 s of wall time
    # ran out at 112 MB and the kill was the timeout's, not the OOM the test is about)
    res = py(sandbox, code, limits=small_limits(memory_mb=128, timeout_s=30, cpu_s=30))
    assert res.oom or "MemoryError" in res.stderr, res
    assert not res.ok and res.exit_code != 0
    assert res.max_rss_mb < 128 + 16, res.max_rss_mb
    assert int(res.stdout.split()[-1]) * 8 < 160
    assert leaked_cgroups() == []


@pytest.mark.parametrize("where", ["/dev/shm", "/tmp"])
def test_tmpfs_fill_is_capped(sandbox, where):
    code = f"""
import errno
n = 0
try:
    with open('{where}/fill', 'wb') as f:
        while True:
            f.write(b'x' * (1 << 20)); f.flush(); n += 1
except OSError as e:
    print('stopped', errno.errorcode[e.errno], n)
"""
    res = py(sandbox, code, limits=small_limits(tmpfs_mb=16, memory_mb=128, file_size_mb=64))
    assert res.exit_code == 0 and res.stdout.startswith("stopped ENOSPC"), res
    assert int(res.stdout.split()[-1]) <= 16
    assert not os.path.exists(f"{where}/fill")  # the box's /tmp and /dev/shm are its own


def test_tmpfs_bigger_than_memory_is_held_by_memory_limit(sandbox):
    needs_cgroup(sandbox)
    code = "with open('/dev/shm/fill', 'wb') as f:\n    for i in range(200):\n        f.write(b'x' * (1 << 20))\n"
    res = py(sandbox, code, limits=small_limits(tmpfs_mb=256, memory_mb=64, file_size_mb=512))
    assert res.oom and res.signal == 9, res
    assert leaked_cgroups() == []


def test_output_flood_is_truncated(sandbox):
    cap = 64 << 10
    code = "import sys\nsys.stdout.write('x' * 5_000_000)\nsys.stderr.write('e' * 3_000_000)\n"
    res = py(sandbox, code, limits=small_limits(output_bytes=cap))
    assert res.exit_code == 0 and res.truncated and not res.timed_out
    assert len(res.stdout) == cap and set(res.stdout) == {"x"}
    assert len(res.stderr) == cap


def test_endless_output_is_truncated_and_timed_out(sandbox):
    tag = marker()
    res = sandbox.exec(f"yes {tag}", profile="shell", limits=small_limits(timeout_s=1, output_bytes=4096))
    assert res.timed_out and res.truncated and len(res.stdout) == 4096
    assert wait_gone(tag) == []


def test_big_file_is_cut_by_rlimit_fsize(sandbox):
    code = """
import errno, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
try:
    with open('big', 'wb') as f:
        for _ in range(32):
            f.write(b'x' * (1 << 20))
except OSError as e:
    print('stopped', errno.errorcode[e.errno])
"""
    res = py(sandbox, code, limits=small_limits(file_size_mb=4), collect=["big"])
    assert res.stdout.strip() == "stopped EFBIG", res
    assert len(res.files["big"]) == 4 << 20
    # without the handler, the writer is killed by SIGXFSZ, and that is what is reported
    res = sandbox.exec("head -c 20000000 /dev/zero > big2", profile="shell", limits=small_limits(file_size_mb=4))
    assert res.signal == 25, res


def test_many_files_in_work_are_bounded(sandbox, monkeypatch):
    monkeypatch.setenv("HONING_SANDBOX_WORK_MB", "16")
    monkeypatch.setenv("HONING_SANDBOX_WORK_INODES", "500")
    probe = Workspace()
    quota = probe.quota_mb
    probe.close()
    if quota is None:
        pytest.skip("no workspace quota here (needs mount privileges): /work is bounded only by "
                    "RLIMIT_FSIZE per file and the wall time")
    code = """
import errno, os
m = 0
try:
    while True:
        open(f't{m}', 'w').close()
        m += 1
except OSError as e:
    print('many', errno.errorcode[e.errno], m)
for i in range(m):
    os.remove(f't{i}')
n = 0
try:
    while True:
        with open(f'f{n}', 'wb') as f:
            f.write(b'x' * (1 << 19))
        n += 1
except OSError as e:
    print('big', errno.errorcode[e.errno], n)
"""
    with sandbox.open("python", files={"main.py": code}) as s:
        res = s.exec(["python3", "main.py"], limits=small_limits(timeout_s=5))
        many, big = res.stdout.splitlines()
        assert res.exit_code == 0 and many.startswith("many ENOSPC") and big.startswith("big ENOSPC"), res
        assert int(many.split()[-1]) <= 500 and int(big.split()[-1]) <= 32
        used, entries = s.ws.usage()
        assert used <= 16 << 20 and entries <= 500  # what stays on the host is bounded too


# --- network ----------------------------------------------------------------------------------

NET = """
import socket, sys
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=1).close()
        return 'connected'
    except OSError as e:
        return type(e).__name__
def udp(host, port):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b'ping', (host, port))
        return 'sent'
    except OSError as e:
        return type(e).__name__
def dns(name):
    try:
        return socket.getaddrinfo(name, 80)[0][4][0]
    except OSError as e:
        return type(e).__name__
port = int(sys.argv[1])
print(tcp('1.1.1.1', 53), tcp('127.0.0.1', port), udp('1.1.1.1', 53), udp('127.0.0.1', port + 1),
      dns('example.com'), dns('pypi.org'))
"""


def test_network_egress_is_blocked(sandbox):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    usrv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        usrv.bind(("127.0.0.1", port + 1))
    except OSError:
        usrv.bind(("127.0.0.1", 0))
    usrv.settimeout(0.2)
    try:
        res = py(sandbox, NET, str(port))
        tcp_out, tcp_lo, udp_out, udp_lo, dns1, dns2 = res.stdout.split()
        assert res.exit_code == 0, res.stderr
        assert tcp_out == "OSError" and udp_out == "OSError", res.stdout  # ENETUNREACH
        assert tcp_lo == "ConnectionRefusedError", "the host's loopback is reachable from the box"
        assert dns1 == "gaierror" and dns2 == "gaierror"
        assert udp_lo in ("sent", "OSError")  # lands on the box's own loopback, if anywhere
        with pytest.raises(socket.timeout):
            srv.accept()
        with pytest.raises(socket.timeout):
            usrv.recvfrom(16)
    finally:
        srv.close()
        usrv.close()


def test_host_abstract_unix_socket_is_unreachable(sandbox):
    name = marker()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)  # abstract sockets belong to the network namespace
    srv.listen(1)
    srv.settimeout(0.2)
    code = f"""
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect('\\0{name}')
    print('connected')
except OSError as e:
    print(type(e).__name__)
"""
    try:
        res = py(sandbox, code)
        assert res.exit_code == 0 and res.stdout.strip() == "ConnectionRefusedError", res
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


def test_box_has_only_loopback(sandbox):
    res = sandbox.exec("ls /sys/class/net 2>/dev/null; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
                       "cat /etc/resolv.conf", profile="shell")
    assert res.stdout.split() == ["lo"], res.stdout
    assert "resolv.conf" in res.stderr


# --- what the box can see -----------------------------------------------------------------------

def test_host_files_are_invisible(sandbox):
    targets = ["/root", "/home", str(REPO), str(REPO / "pyproject.toml"), os.path.expanduser("~/.ssh"),
               "/etc/shadow", "/etc/sudoers", "/etc/ssh", str(Path(os.__file__).parent), "/var", "/srv",
               "/sys/fs/cgroup", "/tmp/honing-sandbox"]
    code = "import os, sys\nfor p in sys.argv[1:]:\n    print(p, os.path.exists(p))\n"
    res = py(sandbox, code, *targets)
    assert res.exit_code == 0, res.stderr
    visible = [line for line in res.stdout.splitlines() if line.endswith("True")]
    if str(Path(os.__file__).parent).startswith("/usr/lib/python3"):  # the box's own stdlib
        visible = [v for v in visible if not v.startswith(str(Path(os.__file__).parent))]
    assert visible == [], visible
    assert len(res.stdout.splitlines()) == len(targets)


def test_proc_shows_only_the_box(sandbox, monkeypatch):
    secret = marker()
    monkeypatch.setenv("HONING_ADV_SECRET", secret)
    me = os.getpid()
    code = f"""
import os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
print(len(pids))
try:
    print(open('/proc/{me}/environ', 'rb').read())
except OSError as e:
    print(type(e).__name__)
for p in pids:
    try:
        if b'{secret}' in open(f'/proc/{{p}}/environ', 'rb').read():
            print('LEAK', p)
    except OSError:
        pass
"""
    res = py(sandbox, code)
    lines = res.stdout.split("\n")
    assert res.exit_code == 0, res.stderr
    assert int(lines[0]) <= 4, res.stdout
    assert lines[1] == "FileNotFoundError" or secret not in lines[1]
    assert "LEAK" not in res.stdout and secret not in res.stdout


def test_host_environment_does_not_leak(sandbox, monkeypatch):
    secret = marker()
    monkeypatch.setenv("HONING_ADV_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    res = sandbox.exec("env; tr '\\0' '\\n' < /proc/1/environ; tr '\\0' ' ' < /proc/1/cmdline", profile="shell")
    assert res.exit_code == 0
    assert secret not in res.stdout and "AWS_SECRET" not in res.stdout
    assert str(REPO) not in res.stdout and "honing-sandbox" not in res.stdout  # no host paths


def test_environment_is_exactly_the_allow_list(sandbox):
    res = py(sandbox, "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    env = __import__("json").loads(res.stdout)
    assert env == {**get_profile("python").environment(), "PWD": "/work"}  # bwrap sets PWD on --chdir
    assert set(env) >= {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED"}


def test_passwd_is_generated_not_the_hosts(sandbox):
    res = sandbox.exec("cat /etc/passwd; echo ---; cat /etc/group; echo ---; id -un; id -u; id -g",
                       profile="shell")
    passwd, group, ids = res.stdout.split("---\n")
    users = [line.split(":")[0] for line in passwd.splitlines()]
    assert users == ["root", "box", "nobody"]
    assert [line.split(":")[0] for line in group.splitlines()] == ["root", "box", "nogroup"]
    assert ids.split() == ["box", "1000", "1000"]
    host_users = [line.split(":") for line in Path("/etc/passwd").read_text().splitlines() if line.count(":") >= 6]
    for name, _, uid, *_ in host_users:
        if int(uid) >= 1000 and name not in ("nobody", "box"):
            assert name not in res.stdout, f"host user name {name!r} leaked into the box"
    res = sandbox.exec("echo x >> /etc/passwd", profile="shell")
    assert res.exit_code != 0 and ("Read-only" in res.stderr or "Permission denied" in res.stderr)


def test_hostname_is_box(sandbox):
    before = socket.gethostname()
    res = sandbox.exec("hostname; uname -n; hostname evil", profile="shell")
    assert res.stdout.split() == ["box", "box"] and res.exit_code != 0
    assert socket.gethostname() == before


def test_no_privileges_inside(sandbox):
    res = sandbox.exec("grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; "
                       "unshare -r true && echo USERNS; mount -t tmpfs x /tmp 2>/dev/null && echo MOUNTED; "
                       "true", profile="shell")  # mount is setuid root on the host: no_new_privs holds
    st = dict(line.split(":", 1) for line in res.stdout.strip().splitlines())
    st = {k: v.split() for k, v in st.items()}
    assert st["Uid"] == ["1000"] * 4 and st["Gid"] == ["1000"] * 4
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(st[cap][0], 16) == 0, (cap, st[cap])
    assert st["NoNewPrivs"] == ["1"] and st["Seccomp"] == ["2"]
    assert "USERNS" not in res.stdout and "MOUNTED" not in res.stdout


def test_clock_cannot_be_changed(sandbox):
    before = time.time()
    res = sandbox.exec("date -s '2001-01-01 00:00:00'; echo rc=$?; date +%Y", profile="shell")
    assert "rc=1" in res.stdout and "not permitted" in res.stderr
    assert res.stdout.split()[-1] != "2001"
    assert abs(time.time() - before) < 30


def test_cannot_write_outside_workspace(sandbox):
    name = marker()
    targets = [f"/{name}", f"/usr/{name}", f"/usr/bin/{name}", f"/etc/{name}", f"/bin/{name}", f"/proc/{name}",
               "/proc/sys/kernel/hostname", f"/dev/{name}"]
    code = """
import sys
for p in sys.argv[1:]:
    try:
        open(p, 'w').write('x')
        print(p, 'WROTE')
    except OSError as e:
        print(p, type(e).__name__)
open('/work/ok', 'w').write('x')
open('/tmp/ok', 'w').write('x')
"""
    res = py(sandbox, code, *targets)
    assert res.exit_code == 0, res.stderr
    assert "WROTE" not in res.stdout and len(res.stdout.splitlines()) == len(targets)
    for t in targets:
        assert not os.path.exists(t) or t.startswith("/proc/sys")
    assert not any(name in p for p in os.listdir("/usr/bin"))


def test_host_sysctls_and_proc_are_read_only(sandbox):
    # /proc/sys is host-wide (core_pattern runs a helper as host root): only access() is probed
    # for the dangerous ones; hostname is per-UTS-namespace, so really writing it is harmless
    before = socket.gethostname()
    code = """
import os
for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/sysrq-trigger',
          '/proc/sys/kernel/modprobe', '/proc/self/oom_score_adj'):
    print(p, os.access(p, os.W_OK))
try:
    open('/proc/sys/kernel/hostname', 'w').write('evil')
    print('hostname WROTE')
except OSError as e:
    print('hostname', type(e).__name__)
"""
    res = py(sandbox, code)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(line.endswith("False") for line in lines[:-1]), res.stdout
    assert lines[-1] == "hostname OSError"
    assert socket.gethostname() == before


def test_python_profile_has_no_project_venv(sandbox):
    code = """
import sys
for mod in ('honing', 'torch', 'pytest', 'transformers'):
    try:
        __import__(mod)
        print(mod, 'IMPORTED')
    except ImportError:
        print(mod, 'missing')
print(sys.executable, sys.prefix)
"""
    res = py(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert "IMPORTED" not in res.stdout
    assert res.stdout.splitlines()[-1] == "/usr/bin/python3 /usr"


def test_runs_are_reproducible(sandbox):
    code = """
import locale, os, sys, time
print(hash('abc'), hash(('x', 1)), time.tzname, os.environ['TZ'], locale.getpreferredencoding(),
      sys.getfilesystemencoding(), sorted(os.listdir('/')), os.listdir('/work'), os.getcwd(), os.getuid())
"""
    files = {f"f{i}.txt": str(i) for i in range(5)}
    a, b = py(sandbox, code, files=files), py(sandbox, code, files=files)
    assert a.exit_code == 0 and a.stdout == b.stdout and a.stderr == b.stderr == ""
    assert a.stdout.startswith(str(__import__("subprocess").run(
        ["/usr/bin/python3", "-c", "print(hash('abc'))"], env={"PYTHONHASHSEED": "0"},
        capture_output=True, text=True).stdout.strip()))


# --- files handed back ------------------------------------------------------------------------

def test_returned_symlinks_are_not_followed(sandbox):
    res = sandbox.exec("ln -s /etc/passwd link; ln -s /etc dirlink; ln -s /proc/1/environ env; echo real > ok",
                       profile="shell", collect=["link", "dirlink/passwd", "env", "ok"])
    assert res.exit_code == 0
    assert res.files == {"ok": b"real\n"}
    with sandbox.open("shell") as s:
        s.exec("ln -s /etc/passwd link; ln -s /etc dirlink; mkfifo fifo")
        for name in ("link", "dirlink/passwd", "fifo"):
            with pytest.raises(SandboxError):
                s.read(name)
        with pytest.raises(SandboxError):
            s.write("dirlink/honing-written-through-link", "x")  # would land in the host's /etc
        assert not os.path.exists("/etc/honing-written-through-link")
        s.write("link", "replaced")  # a planted link is replaced, its target untouched
        assert s.read("link") == b"replaced"
        start = time.monotonic()
        sid = s.snapshot()  # a fifo the box made must not block the host
        s.restore(sid)
        assert time.monotonic() - start < 5


# --- input validation ---------------------------------------------------------------------------

def test_negative_limits_are_refused():
    with pytest.raises(SandboxError, match="memory_mb"):
        Limits(memory_mb=-1)
    with pytest.raises(SandboxError, match="timeout_s"):
        Limits(timeout_s=0)


def test_unknown_profile_names_the_nearest(sandbox):
    with pytest.raises(SandboxError, match="did you mean 'python'"):
        sandbox.exec("true", profile="pyton")
    with pytest.raises(SandboxError, match="did you mean 'shell'"):
        get_profile("shel")


def test_missing_files_dir_is_refused(sandbox, tmp_path):
    with pytest.raises(SandboxError, match="files dir"):
        sandbox.exec("true", profile="shell", files_dir=tmp_path / "nope")


def test_bad_file_names_are_refused(sandbox):
    for bad in ("/etc/passwd", "../escape", "a/../../b"):
        with pytest.raises(SandboxError, match="relative path"):
            sandbox.exec("true", profile="shell", files={bad: "x"})


def test_cgroups_are_removed_after_each_job(sandbox):
    for cmd in ("true", "exit 7", "sleep 5"):
        res = sandbox.exec(cmd, profile="shell", limits=small_limits(timeout_s=0.5))
        assert res.infra_error is None
        assert leaked_cgroups() == []
    assert res.timed_out


# --- what counts as the sandbox's failure -------------------------------------------------------

def test_program_cannot_fake_an_infra_error(sandbox):
    # infra_error means "not the candidate's fault, do not score": a program must not be able to
    # claim it by imitating bwrap's messages
    res = sandbox.exec("echo 'bwrap: Cannot find source path /x: No such file or directory' >&2; exit 1",
                       profile="shell")
    assert res.exit_code == 1 and res.infra_error is None
    res = sandbox.exec(["/no/such/program"], profile="shell")
    assert res.exit_code != 0 and res.infra_error is None and "No such file" in res.stderr


def test_box_that_cannot_start_is_an_infra_error(sandbox, tmp_path):
    from honing.sandbox.profiles import Profile

    broken = Profile("broken", ("/usr", "/nonexistent-honing-path"))
    res = sandbox.backend.run(["true"], tmp_path, broken, small_limits())
    assert res.infra_error and "nonexistent-honing-path" in res.infra_error and not res.ok
    assert leaked_cgroups() == []
