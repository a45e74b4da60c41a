"""The rollout worker process (honing.schedule.workers): parity with the in-process worker,
weight pushes and versions, pipelining, errors, a killed child, a killed parent."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from honing.errors import HoningError
from honing.schedule._testing_side import make_tiny_side
from honing.schedule.workers import (
    InProcessWorker,
    ProcessWorker,
    WorkerTimeout,
    pack_state,
    unpack_state,
)

SIDE = "honing.schedule._testing_side"
PAYLOAD = {"prompts": ["hello world", "the cat sat on"], "max_new_tokens": 6, "n": 2}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread here and in the worker: CPU float reductions depend on the thread count,
    and the parity tests compare bit for bit with an in-process side (also: no oversubscription)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_worker(one_thread):
    with ProcessWorker(f"{SIDE}:make_tiny_side", {"seed": 0}, threads=1) as w:
        yield w


@pytest.fixture(scope="module")
def ref_side():
    """The same side in this process (building it takes seconds: once per module)."""
    return make_tiny_side({"seed": 0})


@pytest.fixture(scope="module")
def weights(ref_side) -> dict[int, dict[str, torch.Tensor]]:
    """Version 0: the tiny model's own weights; version 1: perturbed."""
    model = copy.deepcopy(ref_side.model)
    v0 = {k: t.clone() for k, t in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # tied embeddings perturbed once
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    v1 = {k: t.clone() for k, t in model.state_dict().items()}
    return {0: v0, 1: v1}


def _sequence(worker, weights) -> list:
    """A fixed request sequence; errors come back as ("error", message)."""
    reqs = [(0, PAYLOAD, 1, 0, weights[0]),
            (1, PAYLOAD, 2, 0, None),           # same version, another seed
            (2, PAYLOAD, 1, 1, weights[1]),     # new weights, same seed as batch 0
            (3, PAYLOAD, 1, 0, None),           # an older version without weights: an error
            (4, PAYLOAD, 1, 0, weights[0])]     # back to version 0 with its weights
    for r in reqs:
        worker.submit(*r)
    out = []
    for r in reqs:
        try:
            result, info = worker.collect(r[0], timeout_s=60)
            assert info["version"] == r[3]
            out.append(result)
        except HoningError as e:
            out.append(("error", str(e)))
    return out


def test_process_matches_in_process_and_versions(tiny_worker, ref_side, weights):
    got = _sequence(tiny_worker, weights)
    ref = _sequence(InProcessWorker(ref_side), weights)
    assert got[:3] == ref[:3] and got[4] == ref[4]
    assert len(got[0]) == 2 and all(len(group) == 2 for group in got[0])  # 2 prompts x n=2
    assert got[1] != got[0]  # another seed
    assert got[2] != got[0]  # other weights, same seed
    assert got[4] == got[0]  # version 0 again reproduces batch 0
    for kind, msg in (got[3], ref[3]):
        assert kind == "error" and "batch 3 asks for policy version 0" in msg
        assert "holds policy version 1" in msg


def test_pipelining_out_of_order_and_accounting(tiny_worker, ref_side, weights):
    slow = dict(PAYLOAD, sleep=0.5)
    t0 = time.perf_counter()
    tiny_worker.submit(10, slow, 5, 0, weights[0])
    tiny_worker.submit(11, PAYLOAD, 6, 0, None)
    tiny_worker.submit(12, PAYLOAD, 7, 0, None)
    assert time.perf_counter() - t0 < 0.4  # submit does not wait for the child
    assert tiny_worker.pending() == [10, 11, 12]
    with pytest.raises(WorkerTimeout):
        tiny_worker.collect(12, timeout_s=0.05)  # batch 10 sleeps first
    assert tiny_worker.pending() == [10, 11, 12]
    res = {}
    for b in (12, 10, 11):
        res[b] = tiny_worker.collect(b)
        assert b not in tiny_worker.pending()
    assert tiny_worker.pending() == []

    ref = InProcessWorker(ref_side)
    for b, seed in ((10, 5), (11, 6), (12, 7)):
        ref.submit(b, PAYLOAD, seed, 0, weights[0] if b == 10 else None)
        assert ref.collect(b)[0] == res[b][0]

    for b, (_, info) in res.items():
        assert info["version"] == 0
        assert info["worker/busy_s"] > 0 and info["worker/idle_s"] >= 0 and info["transfer_s"] >= 0
        assert info["worker/busy_s"] >= info["worker/load_weights_s"] + info["worker/run_s"] - 1e-6
    assert res[10][1]["worker/load_weights_s"] > 0 and res[11][1]["worker/load_weights_s"] == 0
    assert res[10][1]["worker/busy_s"] >= 0.5  # includes the sleep
    assert res[12][1]["transfer_s"] > 0.1  # collect(12) waited for batch 10's sleep

    with pytest.raises(HoningError, match="not submitted or was already collected"):
        tiny_worker.collect(12)


def test_child_exception_is_raised_with_traceback(tiny_worker, weights):
    tiny_worker.submit(20, {"raise": "boom-7f3a"}, 0, 0, weights[0])
    tiny_worker.submit(21, PAYLOAD, 1, 0, None)  # the worker keeps serving after an error
    with pytest.raises(HoningError) as ei:
        tiny_worker.collect(20)
    msg = str(ei.value)
    assert "rollout worker failed on batch 20" in msg
    assert "Traceback (most recent call last)" in msg and "RuntimeError: boom-7f3a" in msg
    assert "_testing_side.py" in msg  # the child's frames
    assert len(tiny_worker.collect(21)[0]) == 2
    with pytest.raises(HoningError, match="already submitted"):
        tiny_worker.submit(22, PAYLOAD, 1, 0, None)
        tiny_worker.submit(22, PAYLOAD, 1, 0, None)
    tiny_worker.collect(22)
    with pytest.raises(HoningError, match="payload of batch 23 cannot be sent"):
        tiny_worker.submit(23, {"f": lambda: 0}, 1, 0, None)
    assert tiny_worker.pending() == []


def test_killed_child_is_reported_not_awaited():
    w = ProcessWorker(f"{SIDE}:make_echo_side", initial_version=0)
    try:
        w.submit(0, {"x": 1}, 3, 0, {"a": torch.ones(3)})
        assert w.collect(0)[0] == {"payload": {"x": 1}, "seed": 3, "checksum": 3.0}
        w.submit(1, {"sleep": 60}, 0, 0, None)
        w.submit(2, {"x": 2}, 0, 0, None)
        time.sleep(0.2)
        os.kill(w.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        with pytest.raises(HoningError, match=r"rollout worker \(pid \d+\) died with exit code -9 \(SIGKILL\)"):
            w.collect(1)
        assert time.perf_counter() - t0 < 5
        with pytest.raises(HoningError, match="died"):
            w.collect(2, timeout_s=30)
        with pytest.raises(HoningError, match="died"):
            w.submit(3, {}, 0, 0, None)
    finally:
        w.close()
        w.close()  # idempotent
    with pytest.raises(HoningError, match="closed"):
        w.submit(4, {}, 0, 0, None)


def test_factory_failure_is_clear_at_start():
    with pytest.raises(HoningError, match="module:function"):
        ProcessWorker("no_colon_here")
    with pytest.raises(HoningError, match="must be picklable"):
        ProcessWorker(f"{SIDE}:make_echo_side", lambda: 0)
    t0 = time.perf_counter()
    with pytest.raises(HoningError) as ei:
        ProcessWorker(f"{SIDE}:make_failing_side", 7)
    msg = str(ei.value)
    assert "make_failing_side" in msg and "failed in the worker process" in msg
    assert "ValueError: this factory always fails (arg=7)" in msg
    assert time.perf_counter() - t0 < 30


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # no /proc: fall back to a signal probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_child_exits_when_parent_is_killed():
    script = textwrap.dedent(f"""
        import time
        from honing.schedule.workers import ProcessWorker
        if __name__ == "__main__":
            w = ProcessWorker("{SIDE}:make_echo_side", initial_version=0)
            w.submit(0, {{"sleep": 120}}, 0, 0, None)  # the child is busy when the parent dies
            time.sleep(1.0)
            print(w.pid, flush=True)
            time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"parent script printed {line!r}"
        child = int(line)
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the rollout worker outlived its parent"


def test_pack_state_roundtrip_ties_and_reuse():
    emb = torch.randn(5, 3)
    state = {"emb": emb, "head": emb, "half": torch.randn(4, dtype=torch.bfloat16),
             "idx": torch.arange(6).view(2, 3).t(), "empty": torch.zeros(0, 2)}
    p = pack_state(state, buf_id=3)
    assert p.buf_id == 3 and set(p.flats) == {"float32", "bfloat16", "int64"}
    assert p.flats["float32"].numel() == 15  # the tied tensor is stored once
    assert all(f.is_shared() for f in p.flats.values())
    out = unpack_state(p)
    assert list(out) == list(state)
    for k, t in state.items():
        assert out[k].dtype == t.dtype and torch.equal(out[k], t)
    state2 = dict(state, emb=emb + 1, half=state["half"] + 1)
    state2["head"] = state2["emb"]
    p2 = pack_state(state2, flats=p.flats)  # same layout: same buffers, new values
    assert p2.flats["float32"].data_ptr() == p.flats["float32"].data_ptr()
    assert torch.equal(unpack_state(p2)["head"], emb + 1)
    p3 = pack_state({"x": torch.ones(2)}, flats=p.flats)  # another layout: new buffers
    assert p3.flats["float32"].data_ptr() != p.flats["float32"].data_ptr()
    with pytest.raises(HoningError, match="not a tensor"):
        pack_state({"x": 1.0})  # type: ignore[dict-item]
