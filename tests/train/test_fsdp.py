"""FSDP2 data parallelism (gloo, 2 ranks under torchrun, OMP_NUM_THREADS=1): one trainer step on
2 ranks x half a batch equals 1 rank x the whole batch; `honing train --nproc 2` killed after a
checkpoint and resumed ends equal to an uninterrupted `--nproc 2` run; a bad --nproc is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from honing.models import build_tiny_random
from honing.train.distributed import check_nproc, launch_command, rank_slice, strip_nproc, threads_per_rank

from .helpers import make_trainer, sampled_trajectories

HERE = Path(__file__).resolve().parent


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


# --- pure helpers ----------------------------------------------------------------------------------

def test_rank_slice_is_contiguous_balanced_and_covers_everything() -> None:
    for n in range(0, 12):
        items = list(range(n))
        for world in (1, 2, 3, 5):
            parts = [rank_slice(items, r, world) for r in range(world)]
            assert sum(parts, []) == items  # contiguous, in rank order, nothing lost or doubled
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    with pytest.raises(ValueError):
        rank_slice([1], 2, 2)


def test_nproc_checks_and_launch_command() -> None:
    from honing.errors import HoningError

    check_nproc(2, 2)
    for bad in (0, -1, 3):
        with pytest.raises(HoningError):
            check_nproc(bad, 2)
    assert threads_per_rank(16, 4) == 4 and threads_per_rank(2, 2) == 1 and threads_per_rank(3, 2) == 1
    argv = ["train", "--nproc", "2", "--out", "x", "--nproc=3", "a=1"]
    assert strip_nproc(argv) == ["train", "--out", "x", "a=1"]
    cmd = launch_command(2, ["train", "--out", "x"], "py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"] and "--nproc_per_node=2" in cmd
    assert cmd[-4:] == ["honing.cli", "train", "--out", "x"]


# --- (a) 2 ranks x half batch == 1 rank x full batch ----------------------------------------------

ADVS_ONE_ZERO = [1.0, -0.5, 0.0, -1.25, -0.3, 0.9, 0.4, 1.1]  # 7 active: uneven slices, dummy micro-batches
CASES = [
    {"name": "ppo", "advs": ADVS_ONE_ZERO,
     "train": {"micro_batch_size": 1, "mini_batches": 2, "max_grad_norm": 0.5}},
    {"name": "ppo_wrong_norm", "wrong_norm": True, "advs": ADVS_ONE_ZERO,
     "train": {"micro_batch_size": 1, "mini_batches": 2, "max_grad_norm": 0.5}},
    {"name": "gspo_kl", "advs": [1.0, -0.5, 0.75, -1.25, -0.3, 0.9, 0.4, 1.1],
     "train": {"policy_loss": "gspo", "loss_aggregation": "seq_mean_token_mean", "kl_coef": 0.05,
               "share_prompt": False, "micro_batch_tokens": 40, "max_grad_norm": 0.5}},
]


def _single(case: dict, **over) -> tuple[dict, dict]:
    model, tok = build_tiny_random(seed=0)
    trajs = sampled_trajectories(model, tok, advs=tuple(case["advs"]))
    t = make_trainer(build_tiny_random(seed=0)[0], tok, **{**case["train"], **over})
    m = t.step(trajs)
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}, m


def _maxdiff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> dict:  # noqa: ANN001
    d = tmp_path_factory.mktemp("fsdp")
    (d / "cases.json").write_text(json.dumps(CASES))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HERE / "fsdp_worker.py"), str(d / "out.pt"), str(d / "cases.json")]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return torch.load(d / "out.pt", weights_only=False)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["ppo", "gspo_kl"])
def test_two_ranks_half_batch_equal_one_rank_full_batch(two_rank_results, name: str) -> None:  # noqa: ANN001
    case = next(c for c in CASES if c["name"] == name)
    init = build_tiny_random(seed=0)[0].state_dict()
    w1, m1 = _single(case)
    # The tolerance is the float-rounding spread of this very step: the same batch on one rank
    # with another micro-batching (another summation order). Adam divides by |g| + eps, so
    # near-zero gradients turn rounding into visible weight moves; that is what this measures.
    other = {"micro_batch_size": 8, "micro_batch_tokens": 0}
    w_other, m_other = _single(case, **other)
    floor = _maxdiff(w1, w_other)
    tol = 4 * max(floor, 1e-7)
    moved = _maxdiff(w1, init)
    assert moved > 100 * tol, (moved, tol)  # the step really changed the weights
    got = two_rank_results[name]
    dp_diff = _maxdiff(w1, got["weights"])
    print(f"{name}: update {moved:.2e}, rounding floor {floor:.2e}, 2 ranks vs 1 {dp_diff:.2e}")
    assert dp_diff <= tol, (dp_diff, tol)
    m2 = got["metrics"]
    # grad_norm is the global norm of the summed gradient (Adam hides a wrong gradient scale in the
    # weights; this does not): clipping was active (norm > max_grad_norm) with the same norm.
    assert m1["grad_norm"] > case["train"]["max_grad_norm"]
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7) and abs(m1["loss"]) > 1e-3
    for k in ("optimizer_steps", "tokens", "active_seqs", "clip_frac", "kl", "logprob_mismatch"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
    if name == "ppo":  # uneven slices made one rank run zero-loss dummy micro-batches
        assert got["dummy_micro_batches"] > 0

    if name == "ppo":  # the control: per-rank normalisers (no global counts) fail the same tolerance
        wrong = two_rank_results["ppo_wrong_norm"]
        assert _maxdiff(w1, wrong["weights"]) > 100 * tol
        assert wrong["metrics"]["grad_norm"] != pytest.approx(m1["grad_norm"], rel=1e-2)
