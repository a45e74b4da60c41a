"""`honing train --nproc N`: re-run the command as N torchrun ranks on this machine, and each
rank's side of that (joining the process group, handing rank 0's exit code back). What the ranks
do is in distributed.py; this is only the process plumbing.

Not covered: more than one node (`--standalone` only), and platforms without prctl (a kill -9 of
the launcher there can leave torchrun and its ranks running).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from honing.train.distributed import init_from_env


def threads_per_rank(cores: int, nproc: int) -> int:
    """OMP_NUM_THREADS for each of nproc ranks on `cores` cores (at least 1)."""
    return max(1, cores // nproc)


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_nproc(nproc: int, cores: int, gpus: int = 0) -> None:
    """--nproc must be 1..cores (a core per rank at least) and, on GPUs (NCCL: one GPU per rank),
    at most the GPU count. Raises HoningError."""
    from honing.errors import HoningError

    if nproc < 1:
        raise HoningError(f"--nproc {nproc}: must be at least 1")
    if nproc > cores:
        raise HoningError(f"--nproc {nproc}: this machine allows at most {cores} (the CPU cores this process may "
                          f"use); use --nproc {cores} or fewer")
    if gpus and nproc > gpus:
        raise HoningError(f"--nproc {nproc}: this machine has {gpus} GPU(s) and NCCL needs one per rank; "
                          f"use --nproc {gpus} or fewer")


# torchrun (torch.distributed.run) without its own failure report: rank 0 prints honing's one-line
# errors and the launcher exits with rank 0's code, so torchrun's traceback would only be noise.
TORCHRUN = """import logging, sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run
logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
try:
    run(get_args_parser().parse_args(sys.argv[1:]))
except ChildFailedError:
    sys.exit(1)
"""


def launch_command(nproc: int, argv: Sequence[str], python: str) -> list[str]:
    """The torchrun command that re-runs `honing <argv>` as nproc ranks on this node."""
    return [python, "-c", TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", "-m", "honing.cli", *argv]


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """argv without its `--nproc N` / `--nproc=N`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


CHILD_ENV = "HONING_NPROC_DIR"  # set for the ranks: a directory for rank 0's pid and exit code


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a kill -9 of `honing train --nproc`
    takes torchrun and the ranks with it instead of leaving them running)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def run_ranks(nproc: int, argv: Sequence[str]) -> int:
    """Re-run `honing <argv>` as nproc torchrun ranks on this node (OMP_NUM_THREADS = cores // N
    each) and return rank 0's exit code. torchrun runs in its own session: Ctrl-C / SIGTERM go to
    rank 0 only, which stops cleanly after its step (checkpointed) and releases the followers."""
    import shutil
    import subprocess
    import tempfile

    cores = available_cores()
    check_nproc(nproc, cores, gpu_count())
    d = Path(tempfile.mkdtemp(prefix="honing-ranks-"))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank(cores, nproc)), CHILD_ENV: str(d)}
    p = subprocess.Popen(launch_command(nproc, strip_nproc(argv), sys.executable), env=env,
                         start_new_session=True, preexec_fn=_die_with_parent)

    def forward(signum: int, frame: Any) -> None:
        pid = _read_int(d / "rank0.pid")
        os.kill(pid, signum) if pid else p.send_signal(signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = p.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    code = _read_int(d / "rank0.rc")
    shutil.rmtree(d, ignore_errors=True)
    if code is None or (code == 0 and rc != 0):  # rank 0 died without a word, or another rank failed
        return rc if rc >= 0 else 128 - rc
    return code


def join_as_rank() -> int | None:
    """In a rank of `--nproc N`: join the process group and return this rank (None outside)."""
    d = os.environ.get(CHILD_ENV)
    if not d:
        return None
    _die_with_parent()
    if os.getppid() == 1:  # torchrun is already gone
        raise SystemExit(1)
    r = init_from_env()
    if r == 0:
        (Path(d) / "rank0.pid").write_text(str(os.getpid()))
    return r


def exit_rank(code: object) -> None:
    """The end of a rank of `--nproc N`: rank 0 leaves its exit code for the launcher (torchrun
    reports only "failed"), then the process exits at once. Skipping the interpreter's teardown is
    on purpose: now and then gloo's threads abort it ("terminate called without an active
    exception") after the run has finished and closed everything, which torchrun would report as
    a failed rank."""
    n = code if isinstance(code, int) else (0 if code is None else 1)
    d = os.environ.get(CHILD_ENV)
    if d and os.environ.get("RANK") == "0":
        try:
            (Path(d) / "rank0.rc").write_text(str(n))
        except OSError:
            pass
    if isinstance(code, str):
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(n)
