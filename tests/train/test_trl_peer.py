"""Peer check: on identical inputs honing's loss equals TRL's GRPOTrainer._compute_loss.

TRL's method is called unbound on a minimal stub (`self`), with its model forward replaced by
the log-probs under test, so the same tensors go through both implementations. Gradients with
respect to the log-probs are compared too. `trl` is a test-only dependency.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from honing.config import TrainConfig
from honing.train.trainer import policy_objective

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

B, T, MAX_LEN = 6, 7, 12


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 3, 5, 1, 6, 4]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths], dtype=torch.long)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + (torch.rand(B, T, generator=g) - 0.5) * 0.8  # ratios in [0.67, 1.49]: both clips bite
    ref = old + (torch.rand(B, T, generator=g) - 0.5) * 0.4
    sampling = old + (torch.rand(B, T, generator=g) - 0.5) * 0.6
    adv = torch.tensor([1.2, -0.8, 0.5, -1.5, 0.9, -0.3])
    return {"logp": logp, "old": old, "ref": ref, "sampling": sampling, "adv": adv, "mask": mask}


class _Acc:
    num_processes = 1

    def reduce(self, x, reduction="sum"):  # noqa: ANN001, ANN201
        return x

    def gather(self, x):  # noqa: ANN001, ANN201
        return x


def _trl_loss(x: dict, logp: torch.Tensor, loss_type: str, eps_low: float, eps_high: float, beta: float,
              level: str = "token", is_ratio: torch.Tensor | None = None) -> torch.Tensor:
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=_Acc(),
        _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        max_completion_length=MAX_LEN)
    inputs = {"prompt_ids": torch.ones(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
              "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": x["mask"],
              "advantages": x["adv"], "old_per_token_logps": x["old"], "ref_per_token_logps": x["ref"],
              "num_items_in_batch": x["mask"].sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)


CASES = [
    # (TRL loss_type, level, eps_low, eps_high, honing config)
    ("grpo", "token", 0.2, 0.2, {"loss_aggregation": "seq_mean_token_mean"}),
    ("dapo", "token", 0.2, 0.28, {"loss_aggregation": "token_mean", "clip_eps_high": 0.28}),
    ("bnpo", "token", 0.2, 0.28, {"loss_aggregation": "token_mean", "clip_eps_high": 0.28}),
    ("dr_grpo", "token", 0.2, 0.2, {"loss_aggregation": "seq_sum_norm", "loss_norm_tokens": MAX_LEN}),
    ("grpo", "sequence", 0.03, 0.04, {"policy_loss": "gspo", "loss_aggregation": "seq_mean_token_mean",
                                       "gspo_clip_low": 0.03, "gspo_clip_high": 0.04}),
    ("cispo", "token", 0.2, 1.2, {"policy_loss": "cispo", "loss_aggregation": "token_mean", "cispo_max_weight": 1.2}),
]


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("loss_type,level,lo,hi,cfg", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
@pytest.mark.parametrize("tis", [False, True])
def test_loss_and_gradient_equal_trl(loss_type: str, level: str, lo: float, hi: float, cfg: dict, beta: float,
                                     tis: bool) -> None:
    x = _inputs(seed=zlib.crc32(f"{loss_type}-{level}".encode()) % 1000)
    mask = x["mask"].float()
    # TRL's 'token_truncate' vLLM correction: min(exp(old - sampling), cap), computed the same way on both sides.
    w = torch.clamp(torch.exp(x["old"] - x["sampling"]), max=1.1) if tis else None
    if tis:
        from honing.train.losses import tis_weights

        assert torch.equal(tis_weights(x["old"], x["sampling"], 1.1), w)
        assert 0 < float((w == 1.1).float().mean()) < 1
    lp_trl = x["logp"].clone().requires_grad_(True)
    want = _trl_loss(x, lp_trl, loss_type, lo, hi, beta, level, w)
    want.backward()
    tc = TrainConfig(**{"clip_eps_low": lo, "kl_coef": beta, "kl_estimator": "k3", **cfg})
    lp = x["logp"].clone().requires_grad_(True)
    got, clipped, _ = policy_objective(tc, lp, x["old"], x["adv"], mask, float(mask.sum()), float(B),
                                       float(tc.loss_norm_tokens or 1), w, x["ref"] if beta else None)
    got.backward()
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-7)
    assert torch.allclose(lp.grad, lp_trl.grad, rtol=1e-5, atol=1e-7)
    assert float(lp.grad.abs().sum()) > 0
    if loss_type != "cispo":
        assert 0 < float((clipped * mask).sum()) < float(mask.sum())  # the case crosses a clip bound


def test_peer_check_can_fail() -> None:
    """A different clip range or aggregation gives a different number (the check is sensitive)."""
    x = _inputs(seed=1)
    mask = x["mask"].float()
    want = _trl_loss(x, x["logp"], "dapo", 0.2, 0.28, 0.0)
    for cfg in ({"clip_eps_high": 0.2}, {"clip_eps_high": 0.28, "loss_aggregation": "seq_mean_token_mean"}):
        got, _, _ = policy_objective(TrainConfig(**cfg), x["logp"], x["old"], x["adv"], mask, float(mask.sum()),
                                     float(B), 1.0)
        assert float(got) != pytest.approx(float(want), rel=1e-4)
