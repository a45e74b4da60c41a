"""The fault-injecting backend: failures become infra_error results (never a grade), hangs stall
then run, counters are exact under threads, the draw sequence is seeded, and the
`faulty:<inner>[:k=v,...]` name works through make_backend / Sandbox."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from honing.rollout.types import Trajectory
from honing.sandbox import ExecResult, Sandbox, SandboxError
from honing.sandbox.core import BACKENDS, make_backend
from honing.sandbox.faulty import FaultyBackend, parse_faulty
from honing.tasks.code import CodeFunctionsSource, reference_solution
from honing.verify import VerifyContext, get_verifier

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


class Echo:
    """A stand-in inner backend: no processes, counts its runs."""

    name = "echo"

    def __init__(self) -> None:
        self.runs = 0
        self.extra_attr = "kept"

    def mechanisms(self) -> dict[str, str]:
        return {"isolation": "none"}

    def run(self, argv, workspace: Path, profile, limits, stdin=None, extra_ro=()) -> ExecResult:
        self.runs += 1
        return ExecResult(0, "ok\n", "", backend=self.name)


def test_parse_and_errors() -> None:
    assert parse_faulty("faulty:bwrap:fail=0.1,hang=0.02,hang_s=5,seed=3") == (
        "bwrap", {"fail": 0.1, "hang": 0.02, "hang_s": 5.0, "seed": 3})
    assert parse_faulty("faulty:local") == ("local", {})
    assert any("faulty" in b for b in BACKENDS)
    for bad in ("faulty:", "faulty:bwrap:nope=1", "faulty:bwrap:fail", "faulty:bwrap:fail=x"):
        with pytest.raises(SandboxError):
            parse_faulty(bad)
    with pytest.raises(SandboxError, match="unknown sandbox backend 'docker'"):
        make_backend("faulty:docker:fail=0.5")
    with pytest.raises(SandboxError, match="fail"):
        FaultyBackend(Echo(), fail=0.8, hang=0.5)


def test_failure_becomes_infra_result_and_is_counted() -> None:
    inner = Echo()
    fb = FaultyBackend(inner, fail=1.0)
    sb = Sandbox(fb)
    res = sb.exec(["true"])
    assert res.infra_error == "RuntimeError: injected sandbox failure" and not res.ok
    assert fb.injected == {"fail": 1, "hang": 0, "calls": 1} and inner.runs == 0
    assert fb.name == "faulty:echo" and fb.extra_attr == "kept" and "faults" in fb.mechanisms()
    ok = Sandbox(FaultyBackend(Echo())).exec(["true"])  # no faults: the inner result, untouched
    assert ok.ok and ok.stdout == "ok\n"


def test_hang_stalls_then_runs_and_close_wakes_it() -> None:
    inner = Echo()
    fb = FaultyBackend(inner, hang=1.0, hang_s=0.3)
    t0 = time.perf_counter()
    res = Sandbox(fb).exec(["true"])
    assert time.perf_counter() - t0 >= 0.3 and res.ok and inner.runs == 1  # slow, not broken
    assert fb.injected == {"fail": 0, "hang": 1, "calls": 1}
    fb2 = FaultyBackend(Echo(), hang=1.0, hang_s=30)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(Sandbox(fb2).exec, ["true"])
        time.sleep(0.1)
        assert fb2.busy() == 1 and not fb2.drain(0.05)
        fb2.close()
        assert "injected hang" in fut.result(timeout=5).infra_error
    assert fb2.drain(1) and fb2.busy() == 0


def test_seeded_and_thread_safe_counts() -> None:
    def draws(seed: int) -> list[bool]:
        fb = FaultyBackend(Echo(), fail=0.3, seed=seed)
        return [Sandbox(fb).exec(["true"]).infra_error is not None for _ in range(60)]

    assert draws(1) == draws(1) and draws(1) != draws(2)
    inner = Echo()
    fb = FaultyBackend(inner, fail=0.25, hang=0.05, hang_s=0.0, seed=0)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _safe(fb), range(400)))
    assert fb.injected["calls"] == 400
    assert results.count("fail") == fb.injected["fail"] and inner.runs == 400 - fb.injected["fail"]
    assert 50 < fb.injected["fail"] < 150 and 5 < fb.injected["hang"] < 50


def _safe(fb: FaultyBackend) -> str:
    try:
        fb.run(["x"], Path("/"), None, None)  # type: ignore[arg-type]
        return "ok"
    except RuntimeError:
        return "fail"


@needs_bwrap
def test_by_name_through_the_code_verifier() -> None:
    sb = Sandbox("faulty:bwrap:fail=1,seed=0", max_concurrency=1)
    assert sb.backend.name == "faulty:bwrap" and isinstance(sb.backend, FaultyBackend)
    task = CodeFunctionsSource({"templates": ["sum_evens"], "num_cases": 3}).make("train", 0)
    good = f"```python\n{reference_solution(task)}```"
    v = get_verifier("code").verify(task, Trajectory.from_text(task.id, task.domain, good), VerifyContext(
        extra={"sandbox": sb}))
    assert v.infra_error and "injected sandbox failure" in v.details and v.score == 0
    clean = Sandbox("faulty:bwrap:fail=0", max_concurrency=1)
    v = get_verifier("code").verify(task, Trajectory.from_text(task.id, task.domain, good), VerifyContext(
        extra={"sandbox": clean}))
    assert v.passed and v.score == 1.0 and clean.backend.injected == {"fail": 0, "hang": 0, "calls": 1}
