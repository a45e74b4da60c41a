"""Parquet trajectory shards: exact round trip, corruption detection, atomic writes."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os

import pyarrow.parquet as pq
import pytest

from honing.errors import HoningError
from honing.rollout.types import Trajectory, Turn
from honing.schedule import trajstore
from honing.schedule.trajstore import read_columns, read_shard, write_shard
from honing.verify.types import Verdict


def _single(i: int, verdict: Verdict | None) -> Trajectory:
    # log-probs that float32 cannot hold exactly, and the odd values a sampler can produce
    lps = (-0.1234567890123456789, -1e-300, -2.5e-8 * (i + 1), -0.0, -float("inf"), -17.000000000000004)
    return Trajectory(task_id=f"task-{i}", domain="arithmetic", prompt_ids=(1, 50256, 7, 2**31 + 5),
                      completion_ids=(11, 12, 13, 14, 15, 16), logprobs=lps, completion_text=f"the answer is {i} ✓",
                      finish_reason="stop" if i % 2 else "length", policy_version=3 + i, group=i // 2,
                      loss_mask=(1, 1, 0, 1, 1, 1), verdict=verdict, reward=0.1 + i, reward_layers={"outcome": 1.0,
                      "format": 0.25}, advantage=-0.7071067811865476 * i, timings={"gen_s": 0.5, "verify_s": 1e-6})


def _multi() -> Trajectory:
    t1 = Turn(index=0, action_ids=(5, 6, 7), action_logprobs=(-0.1, -0.2000000000000001, -3.3), action_text="ls",
              observation_ids=(8, 9), observation_text="a.py\nb.py", finish_reason="stop", tool="bash", ok=True,
              parse_error=False, snapshot_id="snap-0", timings={"gen_s": 0.2, "env_s": 0.01},
              observation_truncated=False)
    t2 = Turn(index=1, action_ids=(10,), action_logprobs=(-1e-12,), action_text="submit",
              observation_ids=(), observation_text="", finish_reason="length", tool=None, ok=False,
              parse_error=True, snapshot_id=None, timings={}, observation_truncated=True)
    return Trajectory(
        task_id="swe-1", domain="code", prompt_ids=(1, 2, 3), completion_ids=(5, 6, 7, 8, 9, 10),
        logprobs=(-0.1, -0.2000000000000001, -3.3, 0.0, 0.0, -1e-12), completion_text="ls\na.py\nb.py\nsubmit",
        finish_reason="stop", policy_version=9, group=2, loss_mask=(1, 1, 1, 0, 0, 1),
        verdict=Verdict(score=0.0, passed=False, details="sandbox died", infra_error=True, cost_s=12.5),
        reward=0.0, reward_layers={}, advantage=0.0, timings={"total_s": 3.0},
        turns=(t1, t2), messages=({"role": "user", "content": "fix it"}, {"role": "assistant", "content": "ls"},
                                  {"role": "tool", "content": "a.py\nb.py"}),
        stop_reason="submit", truncated_context=True,
        truncations=({"at_turn": 1, "observation_of_turn": 0, "tokens_removed": 40},),
        stats={"failed_tool_calls": 1, "test_runs": 0}, files={"a.py": "print('hi')\n", "dir/b.py": ""})


def _trajs() -> list[Trajectory]:
    v = Verdict(score=0.75, passed=True, components={"correct": 1.0, "format": 0.5}, details="ok", cost_s=0.003)
    return [_single(0, v), _single(1, None), _multi(), Trajectory.from_text("t", "d", "text only")]


def _same(a: Trajectory, b: Trajectory) -> None:
    for f in dataclasses.fields(Trajectory):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert type(x) is type(y), f.name
        if f.name == "logprobs":  # bit-exact, -0.0 and inf included
            assert [math.copysign(1, v) for v in x] == [math.copysign(1, v) for v in y]
            assert [v.hex() for v in x] == [v.hex() for v in y]
        else:
            assert x == y, f.name
    assert a == b


def test_every_field_is_stored():
    """A new field in Trajectory/Turn/Verdict must be added to the shard format (and this test)."""
    assert {f.name for f in dataclasses.fields(Trajectory)} == {
        "task_id", "domain", "prompt_ids", "completion_ids", "logprobs", "completion_text", "finish_reason",
        "policy_version", "group", "loss_mask", "verdict", "reward", "reward_layers", "advantage", "timings",
        "turns", "messages", "stop_reason", "truncated_context", "truncations", "stats", "files"}
    assert {f.name for f in dataclasses.fields(Verdict)} == {
        "score", "passed", "components", "details", "infra_error", "cost_s"}
    assert set(trajstore._turn_dict(_multi().turns[0])) == {f.name for f in dataclasses.fields(Turn)}


def test_round_trip(tmp_path):
    trajs = _trajs()
    path = tmp_path / "trajectories" / "step_000007.parquet"
    sha, rows = write_shard(path, trajs, step=7)
    assert rows == len(trajs)
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    back = read_shard(path, sha256=sha)
    assert len(back) == len(trajs)
    for a, b in zip(trajs, back):
        _same(a, b)
    assert back[1].verdict is None and back[2].verdict.infra_error
    assert isinstance(back[2].turns[0], Turn) and back[2].turns[1].action_ids == (10,)
    assert pq.read_schema(path).field("logprobs").type.value_type.bit_width == 64


def test_empty_shard(tmp_path):
    path = tmp_path / "empty.parquet"
    sha, rows = write_shard(path, [], step=0)
    assert rows == 0
    assert read_shard(path, sha) == []
    assert read_columns(path, ["step", "reward"]) == []


def test_read_columns_and_extra(tmp_path):
    path = tmp_path / "s.parquet"
    trajs = _trajs()
    write_shard(path, trajs, step=12, extra={"sampler_weight": [0.5, 1.0, 2.0, 0.0], "source": list("abcd")})
    rows = read_columns(path, ["step", "task_id", "domain", "reward", "verdict_passed", "timings", "source"])
    assert rows[0] == {"step": 12, "task_id": "task-0", "domain": "arithmetic", "reward": 0.1,
                       "verdict_passed": True, "timings": {"gen_s": 0.5, "verify_s": 1e-6}, "source": "a"}
    assert rows[1]["verdict_passed"] is None
    assert [r["step"] for r in rows] == [12] * 4
    assert read_columns(path, ["sampler_weight"])[2] == {"sampler_weight": 2.0}
    for a, b in zip(trajs, read_shard(path)):  # extra columns do not disturb the trajectories
        _same(a, b)
    with pytest.raises(HoningError, match="no column"):
        read_columns(path, ["nope"])
    with pytest.raises(ValueError, match="clashes"):
        write_shard(tmp_path / "x.parquet", trajs, 0, extra={"reward": [0] * 4})
    with pytest.raises(ValueError, match="3 values"):
        write_shard(tmp_path / "x.parquet", trajs, 0, extra={"w": [0] * 3})


def test_sha256_mismatch(tmp_path):
    path = tmp_path / "s.parquet"
    sha, _ = write_shard(path, _trajs(), step=1)
    bad = "0" * 64
    with pytest.raises(HoningError, match=r"s\.parquet.*sha256 mismatch"):
        read_shard(path, sha256=bad)
    with pytest.raises(HoningError, match="file not found"):
        read_shard(tmp_path / "missing.parquet", sha)


def test_truncated_file(tmp_path):
    path = tmp_path / "s.parquet"
    write_shard(path, _trajs(), step=1)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 10, 0):
        path.write_bytes(data[:cut])
        with pytest.raises(HoningError, match=r"s\.parquet: truncated or corrupt"):
            read_shard(path)


def test_flipped_bytes_never_pass_silently(tmp_path):
    """Flip one byte at positions across the whole file: read_shard either raises a clear
    HoningError or (for bytes that do not affect the data, e.g. column statistics) returns the
    exact original trajectories. Never different values."""
    path = tmp_path / "s.parquet"
    trajs = _trajs()
    write_shard(path, trajs, step=1)
    data = path.read_bytes()
    detected = 0
    positions = sorted(set(range(0, len(data), max(1, len(data) // 150))) | {len(data) // 2, len(data) - 9})
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0x5A
        path.write_bytes(bytes(flipped))
        try:
            back = read_shard(path)
        except HoningError as exc:
            assert "s.parquet" in str(exc)
            detected += 1
        else:
            assert len(back) == len(trajs)
            for a, b in zip(trajs, back):
                _same(a, b)
    assert detected > len(positions) // 2
    # one bit in the page data of the log-probs column chunk
    meta = pq.ParquetFile(_write_copy(tmp_path, data)).metadata
    col = meta.row_group(0).column(trajstore.COLUMNS.index("logprobs"))
    pos = col.data_page_offset + col.total_compressed_size - 3
    flipped = bytearray(data)
    flipped[pos] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(HoningError, match=r"s\.parquet: (truncated or )?corrupt"):
        read_shard(path)
    path.write_bytes(data)
    assert len(read_shard(path)) == len(trajs)


def _write_copy(tmp_path, data: bytes):
    p = tmp_path / "orig.parquet"
    p.write_bytes(data)
    return p


def test_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    sha, _ = write_shard(path, _trajs()[:1], step=1)
    old = path.read_bytes()
    real_write = pq.write_table

    def half_then_fail(table, where, **kw):
        real_write(table, where, **kw)
        where.seek(where.tell() // 2)
        where.truncate()
        raise OSError("disk full")

    monkeypatch.setattr(trajstore.pq, "write_table", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_shard(path, _trajs(), step=2)
    assert path.read_bytes() == old  # the previous shard is untouched
    with pytest.raises(OSError):
        write_shard(tmp_path / "new.parquet", _trajs(), step=2)
    assert not (tmp_path / "new.parquet").exists()

    def fail_replace(*a):
        raise OSError("rename failed")

    monkeypatch.setattr(trajstore.pq, "write_table", real_write)
    monkeypatch.setattr(trajstore.os, "replace", fail_replace)
    with pytest.raises(OSError, match="rename failed"):
        write_shard(tmp_path / "new.parquet", _trajs(), step=2)
    assert sorted(os.listdir(tmp_path)) == ["s.parquet"]  # no temp files left behind
    assert read_shard(path, sha)[0] == _trajs()[0]
