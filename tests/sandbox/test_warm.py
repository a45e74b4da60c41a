"""The warm sandbox pool: correctness, per-job cleanliness, isolation, containment, recovery."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import threading
import time
from pathlib import Path

import pytest

if shutil.which("bwrap") is None or not os.path.exists("/usr/bin/python3"):
    pytest.skip("bubblewrap and /usr/bin/python3 are needed for the warm sandbox", allow_module_level=True)

from honing.sandbox.types import Limits, SandboxError  # noqa: E402
from honing.sandbox.warm import WarmPool  # noqa: E402

PROJECT = Path(__file__).resolve().parents[2]
FAST = Limits(timeout_s=10, cpu_s=10, memory_mb=256, pids=64)


@pytest.fixture(scope="module")
def pool():
    os.environ["HONING_WARM_TEST_SECRET"] = "hunter2-warm"
    try:
        with WarmPool(size=2, limits=FAST) as p:
            yield p
    finally:
        os.environ.pop("HONING_WARM_TEST_SECRET", None)


@pytest.fixture(scope="module")
def solo():
    """One cell: consecutive jobs are guaranteed to share it."""
    with WarmPool(size=1, limits=FAST) as p:
        yield p


def _healthy(p: WarmPool) -> None:
    r = p.run_python("print('still here')")
    assert r.ok and r.stdout == "still here\n", r


def _cell_procs(p: WarmPool) -> dict[int, str]:
    """Host pids of the processes in the cells' cgroups (pid -> status text)."""
    out = {}
    for cell in list(p._live):
        if cell.cg is None:
            continue
        for pid in cell.cg.pids():
            try:
                out[pid] = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                pass
    return out


# -- correct results --------------------------------------------------------------------

def test_python_output_files_stdin_and_collect(pool):
    code = ("import sys, helper\n"
            "print(helper.VALUE * 2)\n"
            "print(sys.stdin.read().upper(), end='')\n"
            "print('warn', file=sys.stderr)\n"
            "open('out.txt', 'w').write('result')\n"
            "os_link = __import__('os').symlink('/etc/passwd', 'link.txt')\n")
    r = pool.run_python(code, files={"helper.py": "VALUE = 21\n"}, stdin=b"abc\n",
                        collect=["out.txt", "link.txt", "missing.txt"])
    assert r.ok, r
    assert r.backend == "warm"
    assert r.stdout == "42\nABC\n"
    assert r.stderr == "warn\n"
    assert r.files == {"out.txt": b"result"}  # symlinks and missing files are not collected


def test_python_behaves_like_a_script(pool):
    code = ("import sys, os, unittest\n"
            "class T(unittest.TestCase):\n"
            "    def test_add(self):\n"
            "        self.assertEqual(1 + 1, 2)\n"
            "print(__name__, sys.argv, os.getcwd(), os.environ['HOME'], hash('abc') == hash('abc'))\n"
            "unittest.main()\n")
    r = pool.run_python(code)
    assert r.exit_code == 0, r
    assert "__main__ ['main.py'] /work /work True" in r.stdout
    assert "Ran 1 test" in r.stderr and "OK" in r.stderr
    bad = pool.run_python("def f():\n    return 1 / 0\nf()\n")
    assert bad.exit_code == 1
    assert "ZeroDivisionError" in bad.stderr and "return 1 / 0" in bad.stderr  # source lines in the traceback
    assert pool.run_python("exit(7)").exit_code == 7
    assert pool.run_python("import sys; sys.exit('boom')").exit_code == 1
    syntax = pool.run_python("def (:\n")
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr


def test_argv_jobs(pool):
    r = pool.run(["/bin/sh", "-c", "cat data.txt; echo err >&2; exit 4"], files={"data.txt": "hello\n"})
    assert (r.exit_code, r.stdout, r.stderr) == (4, "hello\n", "err\n")
    r = pool.run(["python3", "-c", "print('child interpreter')"])
    assert r.ok and r.stdout == "child interpreter\n", r
    r = pool.run(["no-such-program"])
    assert r.exit_code == 127 and "no-such-program" in r.stderr
    with pytest.raises(SandboxError):
        pool.run("echo not a list")  # type: ignore[arg-type]
    with pytest.raises(SandboxError):
        pool.run_python("print(1)", files={"../escape.py": "x"})


def test_os_exit_code_and_signals(pool):
    assert pool.run_python("import os\nprint('bye', flush=True)\nos._exit(3)").exit_code == 3
    r = pool.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert r.signal == signal.SIGTERM and r.exit_code == 128 + signal.SIGTERM and not r.ok


def test_output_is_capped(pool):
    r = pool.run_python("import sys\nsys.stdout.write('x' * 100000)", limits=FAST.replace(output_bytes=1000))
    assert r.ok and r.truncated and len(r.stdout) == 1000


# -- nothing survives a job ---------------------------------------------------------------

def test_each_job_gets_a_clean_directory(solo):
    first = solo.run_python(
        "import os, subprocess\n"
        "open('left.txt', 'w').write('x'); os.mkdir('d'); open('d/f', 'w').close(); os.chmod('d', 0)\n"
        "open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x')\n"
        "os.chmod('/work', 0o500)\n"
        "subprocess.run(['ipcmk', '-M', '4096'], check=False, capture_output=True)\n"
        "for p in ['/etc/ld.so.preload', '/left', '/usr/left', '/dev/left', '/run/honing/x']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError:\n"
        "        pass\n")
    assert first.ok and "WROTE" not in first.stdout, first
    second = solo.run_python(
        "import os\n"
        "print(sorted(os.listdir('.')), os.listdir('/tmp'), os.listdir('/dev/shm'), oct(os.stat('/work').st_mode & 0o777))\n"
        "print(open('/proc/sysvipc/shm').read().count('\\n'))")
    assert second.ok, second
    assert second.stdout == "[] [] [] 0o777\n1\n"


def test_daemons_die_with_their_job(solo):
    r = solo.run_python(
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(300)\n"
        "    os._exit(0)\n"
        "time.sleep(0.1)\n"
        "print('parent done')\n")
    assert r.ok and r.stdout == "parent done\n", r
    after = solo.run_python("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert after.ok, after
    pids = json.loads(after.stdout)
    assert pids == [1, 2] or (len(pids) == 2 and pids[0] == 1), pids  # the zygote and this job only
    if solo.cgroup_version:
        assert not any("sleep" in s.split("\n", 1)[0] for s in _cell_procs(solo).values())


# -- isolation, as for a cold box ------------------------------------------------------------

def test_isolation_like_a_cold_box(pool):
    r = pool.run_python(
        "import os, socket\n"
        "print('secret', os.environ.get('HONING_WARM_TEST_SECRET'))\n"
        f"print('project', os.path.exists({str(PROJECT)!r}))\n"
        "print('root', os.path.exists('/root'), os.path.exists('/home'))\n"
        "print('uid', os.getuid())\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=1); print('net yes')\n"
        "except OSError:\n"
        "    print('net no')\n"
        "print('ifaces', sorted(n for _, n in socket.if_nameindex()))\n")
    assert r.ok, r
    assert "secret None" in r.stdout
    assert "project False" in r.stdout
    assert "root False False" in r.stdout
    assert "uid 1000" in r.stdout
    assert "net no" in r.stdout and "ifaces ['lo']" in r.stdout


def test_job_cannot_forge_a_result(pool):
    fake = json.dumps({"op": "result", "exit": 0, "signal": None, "stdout": "", "stderr": "", "clean": True,
                       "truncated": False, "aborted": False, "files": {}}).encode()
    frame = struct.pack(">I", len(fake)) + fake
    code = (
        "import os, sys\n"
        f"frame = {frame!r}\n"
        "sys.stdout.buffer.write(frame); sys.stdout.flush(); os.write(2, frame)\n"
        "reached = []\n"
        "for fd in range(3, 1024):\n"
        "    try:\n"
        "        os.write(fd, frame); reached.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    names = os.listdir('/proc/1/fd')\n"
        "except OSError:\n"
        "    names = [str(n) for n in range(256)]\n"
        "for name in names:\n"
        "    try:\n"
        "        fd = os.open('/proc/1/fd/' + name, os.O_WRONLY); os.write(fd, frame); reached.append('proc' + name)\n"
        "    except OSError:\n"
        "        pass\n"
        "os.write(2, repr(reached).encode())\n"
        "os._exit(5)\n")
    r = pool.run_python(code)
    assert r.infra_error is None, r
    assert r.exit_code == 5
    assert r.stdout.endswith(fake.decode()) and r.stderr.endswith("[]"), r
    _healthy(pool)


def test_job_cannot_kill_its_zygote(pool):
    r = pool.run_python(
        "import os, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT):\n"
        "    os.kill(os.getppid(), sig)\n"
        "print('ppid', os.getppid())\n")
    assert r.infra_error is not None or (r.ok and r.stdout == "ppid 1\n"), r
    for _ in range(4):
        _healthy(pool)


# -- limits and containment ----------------------------------------------------------------

def test_timeout_kills_the_job_and_the_pool_recovers(pool):
    t0 = time.monotonic()
    r = pool.run_python("import time\nprint('started', flush=True)\nwhile True:\n    pass",
                        limits=FAST.replace(timeout_s=0.5))
    assert r.timed_out and not r.ok and r.infra_error is None, r
    assert r.stdout == "started\n"  # partial output survives
    assert time.monotonic() - t0 < 5
    for _ in range(3):
        _healthy(pool)


def test_unresponsive_cell_is_killed_and_replaced():
    with WarmPool(size=1, limits=FAST, abort_grace_s=0.3) as p:
        cell = next(iter(p._live))
        threading.Timer(0.3, lambda: os.killpg(cell.proc.pid, signal.SIGSTOP)).start()  # freeze the whole cell
        if cell.cg is not None:
            threading.Timer(0.35, lambda: [os.kill(pid, signal.SIGSTOP) for pid in cell.cg.pids()]).start()
        r = p.run_python("import time\ntime.sleep(30)", limits=FAST.replace(timeout_s=1))
        assert r.timed_out and r.infra_error is None, r
        _healthy(p)
        assert p.stats["cells_replaced"] >= 1


def test_cell_death_mid_job_is_an_infra_error(pool):
    def kill_cells():
        for cell in list(pool._live):
            if cell.proc is not None:
                try:
                    os.killpg(cell.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    threading.Timer(0.4, kill_cells).start()
    r = pool.run_python("import time\ntime.sleep(5)\nprint('finished')")
    assert r.infra_error is not None and "finished" not in r.stdout, r
    for _ in range(3):
        _healthy(pool)


def test_memory_bomb_is_contained(pool):
    r = pool.run_python("x = b'1' * (1 << 30)\nprint('allocated', len(x))", limits=FAST.replace(memory_mb=64))
    assert not r.ok and "allocated" not in r.stdout, r
    assert r.infra_error is None
    assert r.oom or "MemoryError" in r.stderr or r.signal == signal.SIGKILL, r
    _healthy(pool)


def test_memory_in_tmpfs_is_the_jobs_failure_not_infra(solo):
    """Files in /dev/shm are charged to the cell but to no process: the OOM killer may take
    the zygote. That must read as the job's OOM, never as an (unscored) infra error."""
    if solo.cgroup_version is None:
        pytest.skip("needs a cgroup memory controller")
    r = solo.run_python(
        "with open('/dev/shm/fill', 'wb') as f:\n"
        "    for _ in range(120):\n"
        "        f.write(b'x' * (1 << 20))\n"
        "print('filled')\n",
        limits=FAST.replace(memory_mb=48))
    assert r.infra_error is None and not r.ok and r.oom, r
    assert "filled" not in r.stdout
    _healthy(solo)


def test_fork_bomb_is_contained(pool):
    r = pool.run_python(
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n",
        limits=FAST.replace(timeout_s=1.0, pids=32))
    assert not r.ok and r.infra_error is None, r
    for _ in range(3):
        _healthy(pool)
    counts = pool.run_python("import os\nprint(sum(p.isdigit() for p in os.listdir('/proc')))")
    assert counts.stdout == "2\n"


def test_cpu_limit(pool):
    r = pool.run_python("while True:\n    pass", limits=FAST.replace(cpu_s=1, timeout_s=8))
    assert not r.ok and not r.timed_out and r.signal in (signal.SIGXCPU, signal.SIGKILL), r


# -- concurrency ---------------------------------------------------------------------------

def test_fifty_async_jobs_on_two_cells(pool):
    async def main():
        jobs = [pool.arun_python(f"import sys\nprint({i} * {i})\nsys.stdin.read()", stdin=b"") for i in range(50)]
        return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(50)]
    assert all(r.ok for r in results)


def test_thread_safety(pool):
    results: list = []

    def worker(k):
        for i in range(5):
            results.append((k * 100 + i, pool.run_python(f"print({k * 100 + i})")))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    assert all(r.ok and r.stdout == f"{n}\n" for n, r in results)


def test_close_kills_everything():
    p = WarmPool(size=2, limits=FAST)
    cells = list(p._live)
    pids = [c.proc.pid for c in cells]
    dirs = [c.dir for c in cells]
    p.close()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not any(d.exists() for d in dirs)
    r = p.run_python("print(1)")
    assert r.infra_error is not None


def test_preload_is_configurable():
    with pytest.raises(SandboxError):
        WarmPool(size=1, preload=["json; import os"])
    with WarmPool(size=1, limits=FAST, preload=["json"]) as p:
        r = p.run_python("import sys\nprint('json' in sys.modules, 'unittest' in sys.modules)\nimport unittest")
        assert r.ok and r.stdout == "True False\n", r
        assert p.mechanisms()["isolation"].startswith("bubblewrap")
