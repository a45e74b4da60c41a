"""Engine scratch directories: a killed run's /dev/shm weight copies are swept by the next run."""

from __future__ import annotations

import os
import subprocess
import sys

from honing.engine.scratch import private_dir, sweep_orphans


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_dirs_of_dead_owners_are_swept_and_live_ones_kept(tmp_path) -> None:
    dead = tmp_path / f"honing-vllm-{dead_pid()}-abcd"
    live = tmp_path / f"honing-vllm-{os.getpid()}-efgh"
    other = tmp_path / "honing-vllm-weights-123-x"  # another prefix: not this sweep's
    unrelated = tmp_path / "honing-vllm-notapid"
    for d in (dead, live, other, unrelated):
        (d / "model").mkdir(parents=True)
        (d / "model" / "model.safetensors").write_bytes(b"x" * 100)
    new = private_dir("honing-vllm-", tmp_path)
    assert new.name.startswith(f"honing-vllm-{os.getpid()}-") and new.is_dir()
    assert not dead.exists() and live.exists() and other.exists() and unrelated.exists()
    assert oct(new.stat().st_mode & 0o777) == "0o700"
    assert sweep_orphans("honing-vllm-weights-", tmp_path) == ([other] if not os.path.exists("/proc/123") else [])
