"""Multi-turn sessions: snapshot/restore gives back exactly the workspace, branching works,
a closed session refuses everything, and the async API keeps to its concurrency bound."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from .conftest import small_limits

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)

from honing.sandbox import Sandbox, SandboxError  # noqa: E402

pytestmark = pytest.mark.usefixtures("host_unharmed")


def tree(root: Path) -> dict[str, object]:
    """Everything in a workspace, seen from the host: files by content, dirs, links by target."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


START = {"a.txt": "alpha\n", "src/pkg/mod.py": "X = 1\n", "src/pkg/data/deep.bin": b"\x00\x01\x02"}


def test_restore_gives_back_exactly_the_workspace(sandbox):
    with sandbox.open("shell", files=START) as s:
        s.exec("ln -s a.txt alias")
        before = tree(s.ws.path)
        sid = s.snapshot()
        res = s.exec("echo changed > a.txt; rm src/pkg/mod.py; rm -r src/pkg/data; mkdir -p new/dir; "
                     "echo n > new/dir/f; echo top > extra; rm alias; ln -s /etc/passwd alias")
        assert res.exit_code == 0, res.stderr
        assert tree(s.ws.path) != before
        s.restore(sid)
        assert tree(s.ws.path) == before  # contents back, new files gone, deleted files back
        assert s.read("src/pkg/data/deep.bin") == b"\x00\x01\x02"
        # the box can work on what was restored (restored files are handed back to it)
        res = s.exec("echo again >> a.txt && cat a.txt && readlink alias")
        assert res.exit_code == 0 and res.stdout == "alpha\nagain\na.txt\n", res


def test_several_snapshots_and_branching(sandbox):
    with sandbox.open("shell", files={"log": "0\n"}) as s:
        a = s.snapshot()
        s.exec("echo 1 >> log; echo b > only_b")
        b = s.snapshot()
        s.restore(a)
        assert s.read("log") == b"0\n" and not (s.ws.path / "only_b").exists()
        s.exec("echo a1 >> log; echo x > only_a")  # a branch from A
        a1 = s.snapshot()
        s.restore(b)
        assert s.read("log") == b"0\n1\n" and s.read("only_b") == b"b\n"
        assert not (s.ws.path / "only_a").exists()
        s.restore(a1)
        assert s.read("log") == b"0\na1\n" and s.read("only_a") == b"x\n"
        s.restore(a1)  # restoring twice is the same
        assert tree(s.ws.path) == {"log": b"0\na1\n", "only_a": b"x\n"}
        for bad in ("nope", "../" + a, ""):
            with pytest.raises(SandboxError, match="snapshot"):
                s.restore(bad)


def test_session_keeps_files_between_execs(sandbox):
    counter = "import os\nn = int(open('n').read()) if os.path.exists('n') else 0\nopen('n', 'w').write(str(n + 1))\n" \
              "print(n + 1)\n"
    with sandbox.open("python", files={"counter.py": counter}) as s:
        outs = [s.exec(["python3", "counter.py"]).stdout for _ in range(3)]
        assert outs == ["1\n", "2\n", "3\n"]
        s.write("n", "10")
        assert s.exec(["python3", "counter.py"]).stdout == "11\n"


def test_closed_session_refuses(sandbox):
    s = sandbox.open("shell", files={"f": "x"})
    sid = s.snapshot()
    path = s.ws.path
    s.close()
    assert not path.exists()
    for call in (lambda: s.exec("true"), lambda: s.write("g", "y"), lambda: s.read("f"), s.snapshot,
                 lambda: s.restore(sid)):
        with pytest.raises(SandboxError, match="closed"):
            call()
    s.close()  # closing twice is fine


def test_async_exec_is_bounded_and_all_succeed():
    sb = Sandbox("bwrap", limits=small_limits(timeout_s=10), max_concurrency=2)
    code = "import sys, time\nt0 = time.time()\ntime.sleep(0.1)\nprint(sys.argv[1], t0, time.time())\n"

    async def main():
        jobs = [sb.aexec(["python3", "-c", code, str(i)], profile="python") for i in range(16)]
        return await asyncio.gather(*jobs)

    try:
        t0 = time.perf_counter()
        results = asyncio.run(main())
        elapsed = time.perf_counter() - t0
    finally:
        sb.close()
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    spans = []
    for i, r in enumerate(results):
        idx, start, end = r.stdout.split()
        assert int(idx) == i
        spans.append((float(start), float(end)))
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2, f"{most} boxes ran at once with max_concurrency=2"
    assert elapsed >= 8 * 0.1


def test_snapshot_restore_round_trip_time(sandbox, capsys):
    files = {f"d{i % 10}/f{i}.txt": f"file {i}\n" * 4 for i in range(100)}
    with sandbox.open("shell", files=files) as s:
        before = tree(s.ws.path)
        t0 = time.perf_counter()
        sid = s.snapshot()
        t1 = time.perf_counter()
        s.restore(sid)
        t2 = time.perf_counter()
        assert tree(s.ws.path) == before
    with capsys.disabled():
        print(f"\n[sandbox] 100 small files: snapshot {1000 * (t1 - t0):.1f} ms, restore {1000 * (t2 - t1):.1f} ms, "
              f"round trip {1000 * (t2 - t0):.1f} ms")
