"""FSDP2 data parallelism (gloo, 2 ranks under torchrun, OMP_NUM_THREADS=1): one trainer step on
2 ranks x half a batch equals 1 rank x the whole batch; `honing train --nproc 2` killed after a
checkpoint and resumed ends equal to an uninterrupted `--nproc 2` run; a bad --nproc is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from honing.models import build_tiny_random
from honing.train.distributed import rank_slice
from honing.train.launch import CHILD_ENV, check_nproc, launch_command, strip_nproc, threads_per_rank

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
    check_nproc(2, 16, gpus=2)
    with pytest.raises(HoningError, match="GPU"):
        check_nproc(3, 16, gpus=2)
    assert threads_per_rank(16, 4) == 4 and threads_per_rank(2, 2) == 1 and threads_per_rank(3, 2) == 1
    argv = ["train", "--nproc", "2", "--out", "x", "--nproc=3", "a=1"]
    assert strip_nproc(argv) == ["train", "--out", "x", "a=1"]
    cmd = launch_command(2, ["train", "--out", "x"], "py")
    assert cmd[:2] == ["py", "-c"] and "torch.distributed.run" in cmd[2] and "--nproc_per_node=2" in cmd
    assert cmd[-4:] == ["honing.cli", "train", "--out", "x"]
    from honing.cli import NPROC_DIR_ENV

    assert NPROC_DIR_ENV == CHILD_ENV


def test_optimizer_state_by_name_and_back_round_trips(tiny) -> None:  # noqa: ANN001
    from honing.train.distributed import PREFIX, optimizer_state_by_index, optimizer_state_by_name

    model, tok = tiny
    t = make_trainer(build_tiny_random(seed=0)[0], tok)
    t.step(sampled_trajectories(model, tok))
    osd = t.opt.state_dict()
    names = [PREFIX + n for n, p in t.model.named_parameters() if p.requires_grad]
    by_name = optimizer_state_by_name(osd, names)
    assert set(by_name["state"]) == set(names) and by_name["param_groups"][0]["params"] == names
    assert torch.equal(by_name["state"][names[3]]["exp_avg"], osd["state"][3]["exp_avg"])
    back = optimizer_state_by_index(by_name, names)
    assert back["param_groups"] == osd["param_groups"] and back["state"].keys() == osd["state"].keys()
    assert optimizer_state_by_name(by_name, names) is by_name and optimizer_state_by_index(osd, names) is osd
    fresh = make_trainer(build_tiny_random(seed=0)[0], tok)  # a name-keyed state loads in one process
    fresh.load_state({**t.state(), "optimizer": by_name})
    assert torch.equal(fresh.opt.state_dict()["state"][3]["exp_avg"], osd["state"][3]["exp_avg"])


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
    # the step really changed the weights, far beyond the tolerance (Adam's first step moves an element by
    # about lr whatever its gradient, and the rounding floor of gspo_kl reaches ~1% of lr on some machines)
    assert moved > 20 * tol, (moved, tol)
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


# --- (b) honing train --nproc 2: kill -9 after a checkpoint, resume == uninterrupted -----------------

SHORT = ["--config", "configs/smoke.yaml", "train.steps=4", "sft.steps=0", "tasks.prompts_per_step=4",
         "eval.heldout_tasks=8", "checkpoint.every_steps=2", "run.deterministic=true"]
ROOT = HERE.parents[1]


def _honing(*args: str) -> list[str]:
    return [sys.executable, "-m", "honing.cli", "train", "--no-progress", *args]


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _kill_at(args: list[str], phase: str, run: Path) -> list[str]:
    """Start `honing train`, SIGKILL the launcher when rank 0 enters `phase`; return the phases seen.
    The launcher's death must take torchrun and every rank with it."""
    import signal
    import time

    p = subprocess.Popen(_honing(*args), cwd=ROOT, env={**_env(), "HONING_TRACE_PHASES": "1"},
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = []
    assert p.stderr is not None
    for line in p.stderr:
        if line.startswith("honing-phase "):
            seen.append(line.split(None, 1)[1].strip())
            if seen[-1] == phase:
                p.send_signal(signal.SIGKILL)
                break
    p.wait(timeout=60)
    deadline = time.time() + 30
    while _procs_mentioning(str(run)) and time.time() < deadline:
        time.sleep(0.2)
    assert not _procs_mentioning(str(run)), "ranks outlived the killed launcher"
    return seen


def _resume_in_one_process(run: Path) -> None:
    from honing.config import load_config
    from honing.schedule.loop import train

    cfg, _ = load_config(str(run / "config.yaml"), [])
    was = torch.are_deterministic_algorithms_enabled()
    try:
        assert train(cfg, run, show_progress=False, resume=True)["resumed_from_step"] == 2
    finally:
        torch.use_deterministic_algorithms(was)


@pytest.mark.timeout(600)
def test_nproc2_killed_after_checkpoint_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = subprocess.run(_honing("--nproc", "2", *SHORT, "--out", str(ref)), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    seen = _kill_at(["--nproc", "2", *SHORT, "--out", str(run)], "rollout 3", run)
    assert "checkpoint 2" in seen and "commit 2" in seen and "commit 3" not in seen, seen
    assert not (run / "checkpoints" / "final").exists()
    one = tmp_path / "one"  # the same killed run, resumed in one process (state.sqlite names run's step-2)
    shutil.copytree(run, one)
    _resume_in_one_process(one)
    p = subprocess.run(_honing("--nproc", "2", "--resume", str(run)), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2
    a = (ref / "checkpoints" / "final" / "model.safetensors").read_bytes()
    b = (run / "checkpoints" / "final" / "model.safetensors").read_bytes()
    assert a == b, "final weights differ after kill/resume with 2 ranks"
    # The killed run resumed in one process instead (another N) ends equal up to float rounding.
    from safetensors.torch import load_file

    wa, w1 = (load_file(d / "checkpoints" / "final" / "model.safetensors") for d in (ref, one))
    d_one, d_moved = _maxdiff(wa, w1), _maxdiff(wa, load_file(ref / "checkpoints" / "step-2" / "model.safetensors"))
    print(f"killed 2-rank run resumed in one process vs 2 ranks: {d_one:.2e} (steps 3-4 moved {d_moved:.2e})")
    assert d_one < 1e-2 * d_moved
    step2 = (ref / "checkpoints" / "step-2" / "model.safetensors").read_bytes()
    assert step2 != a  # steps 3-4 changed the weights (the resume did train)
    # The optimizer state in the checkpoint is the full (unsharded) one, keyed by parameter name.
    st = torch.load(run / "checkpoints" / "final" / "trainer_state.pt", weights_only=False)
    exp_avg = {k: v["exp_avg"] for k, v in st["optimizer"]["state"].items()}
    shapes = {k.removeprefix("policy."): tuple(v.shape) for k, v in exp_avg.items()}
    model_shapes = {k: tuple(v.shape) for k, v in build_tiny_random(seed=0)[0].named_parameters()}
    assert shapes == model_shapes
    rows = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    key = [(r["step"], r.get("train/loss"), r.get("train/grad_norm")) for r in rows]
    assert key == [(r["step"], r.get("train/loss"), r.get("train/grad_norm")) for r in rows_b]

@pytest.mark.timeout(300)
def test_nproc2_ctrl_c_stops_cleanly_after_the_step_with_a_checkpoint(tmp_path: Path) -> None:
    """SIGINT to the launcher goes to rank 0 only: it finishes the step, checkpoints, releases the
    followers and exits 130; no torchrun failure report, no rank left behind."""
    import signal

    run = tmp_path / "run"
    args = ["--nproc", "2", *SHORT, "train.steps=6", "checkpoint.every_steps=0", "--out", str(run)]
    p = subprocess.Popen(_honing(*args), cwd=ROOT, env={**_env(), "HONING_TRACE_PHASES": "1"},
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert p.stderr is not None
    err = []
    for line in p.stderr:
        err.append(line)
        if line.strip() == "honing-phase update 3":
            p.send_signal(signal.SIGINT)
    assert p.wait(timeout=120) == 130, "".join(err[-30:])
    text = "".join(err)
    assert "stopped on SIGINT after step 3 (checkpointed)" in text
    assert "ChildFailedError" not in text and "Traceback" not in text, text[-3000:]
    assert (run / "checkpoints" / "step-3" / "manifest.json").is_file()
    assert not _procs_mentioning(str(run))


# --- (c) a bad --nproc: one line, exit 2, nothing started ---------------------------------------------

@pytest.mark.parametrize("which", ["too_many", "zero"])
def test_bad_nproc_is_one_line_and_exit_2(tmp_path: Path, which: str) -> None:
    n = len(os.sched_getaffinity(0)) + 1 if which == "too_many" else 0
    p = subprocess.run(_honing("--nproc", str(n), *SHORT, "--out", str(tmp_path / "r")), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"honing: error: --nproc {n}:"), p.stderr
    assert not (tmp_path / "r").exists()
