"""honing.train.losses against naive per-element Python loops."""

from __future__ import annotations

import math

import pytest
import torch

from honing.train.losses import grpo_advantages, kl_k3, ppo_clip_loss, token_mean


def _naive_advantages(rewards: list[float], group_size: int, scale: bool, eps: float = 1e-6) -> list[float]:
    out = []
    for g in range(0, len(rewards), group_size):
        grp = rewards[g:g + group_size]
        mean = sum(grp) / len(grp)
        if scale and len(grp) > 1:
            std = math.sqrt(sum((r - mean) ** 2 for r in grp) / (len(grp) - 1))
            out += [(r - mean) / (std + eps) for r in grp]
        else:
            out += [r - mean for r in grp]
    return out


@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_grpo_advantages_match_naive_loop(group_size: int) -> None:
    gen = torch.Generator().manual_seed(group_size)
    rewards = torch.rand(3 * group_size, generator=gen)
    got = grpo_advantages(rewards, group_size)
    want = torch.tensor(_naive_advantages(rewards.tolist(), group_size, scale=True))
    assert got.shape == (3 * group_size,)
    assert torch.allclose(got, want, atol=1e-5)
    # Each scaled group is centred and has (Bessel) std ~1.
    for g in got.view(3, group_size):
        assert abs(float(g.mean())) < 1e-5
        assert abs(float(g.std()) - 1.0) < 1e-3


def test_grpo_advantages_known_values() -> None:
    # Group [0, 1]: mean 0.5, Bessel std = sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071.
    got = grpo_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0]), 2)
    assert torch.allclose(got, torch.tensor([-0.70710, 0.70710, 0.0, 0.0]), atol=1e-4)


def test_grpo_advantages_unscaled_is_centring_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.25, 1.0])
    got = grpo_advantages(rewards, 4, scale=False)
    want = torch.tensor(_naive_advantages(rewards.tolist(), 4, scale=False))
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    # Differs from the scaled version (the std is not 1).
    assert not torch.allclose(got, grpo_advantages(rewards, 4, scale=True))


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_advantages_all_equal_group_is_zero(scale: bool) -> None:
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.0, 0.0, 1.0, 0.0])
    got = grpo_advantages(rewards, 4, scale=scale)
    assert torch.equal(got[:4], torch.zeros(4))
    assert torch.all(got[4:] != 0)
    assert torch.isfinite(got).all()


def test_grpo_advantages_bad_group_size_raises() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(7), 4)


def _naive_ppo(logp, old, adv, lo, hi):
    B, T = len(logp), len(logp[0])
    loss = [[0.0] * T for _ in range(B)]
    clipped = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]
            r = math.exp(logp[b][t] - old[b][t])
            rc = min(max(r, 1 - lo), 1 + hi)
            loss[b][t] = -min(r * a, rc * a)
            clipped[b][t] = 1.0 if rc * a < r * a else 0.0
    return loss, clipped


def _ppo_inputs():
    # Ratios spread over [exp(-0.6), exp(0.6)] so both clip bounds (0.8 and 1.28) are crossed.
    deltas = torch.tensor([[-0.6, -0.3, -0.1, 0.0, 0.1, 0.2, 0.3, 0.6],
                           [0.6, 0.3, 0.2, 0.1, 0.0, -0.1, -0.3, -0.6],
                           [0.05, -0.05, 0.4, -0.4, 0.27, -0.27, 0.22, -0.22]])
    old = torch.linspace(-3.0, -0.5, 24).view(3, 8)
    return old + deltas, old


@pytest.mark.parametrize("adv_vals", [[1.5, -0.7, 0.0], [-2.0, 0.3, 1.0]])
def test_ppo_clip_loss_matches_naive_asymmetric(adv_vals: list[float]) -> None:
    logp, old = _ppo_inputs()
    adv = torch.tensor(adv_vals)
    loss, clipped = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    want_loss, want_clip = _naive_ppo(logp.tolist(), old.tolist(), adv_vals, 0.2, 0.28)
    assert loss.shape == clipped.shape == (3, 8)
    assert torch.allclose(loss, torch.tensor(want_loss), atol=1e-6)
    assert torch.equal(clipped, torch.tensor(want_clip))
    assert 0 < clipped.sum() < clipped.numel()  # the case exercises both branches


def test_ppo_clip_loss_asymmetric_bounds() -> None:
    # A > 0: ratio 1.25 is inside the high bound 1.28 (not clipped) but outside a symmetric 1.2.
    logp = torch.log(torch.tensor([[1.25, 1.35, 0.75]]))
    old = torch.zeros(1, 3)
    loss, clipped = ppo_clip_loss(logp, old, torch.tensor([1.0]), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([[-1.25, -1.28, -0.75]]), atol=1e-6)
    assert clipped.tolist() == [[0.0, 1.0, 0.0]]
    sym, sym_clip = ppo_clip_loss(logp, old, torch.tensor([1.0]), 0.2, 0.2)
    assert torch.allclose(sym, torch.tensor([[-1.2, -1.2, -0.75]]), atol=1e-6)
    assert sym_clip.tolist() == [[1.0, 1.0, 0.0]]
    # A < 0: the low bound 0.8 clips ratio 0.75, the high bound never clips.
    neg, neg_clip = ppo_clip_loss(logp, old, torch.tensor([-1.0]), 0.2, 0.28)
    assert torch.allclose(neg, torch.tensor([[1.25, 1.35, 0.8]]), atol=1e-6)
    assert neg_clip.tolist() == [[0.0, 0.0, 1.0]]


def test_ppo_clip_loss_broadcast_equals_full_advantages() -> None:
    logp, old = _ppo_inputs()
    adv = torch.tensor([0.9, -1.1, 0.4])
    l1, c1 = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    l2, c2 = ppo_clip_loss(logp, old, adv[:, None].expand(3, 8).clone(), 0.2, 0.28)
    assert torch.equal(l1, l2) and torch.equal(c1, c2)
    # Per-token advantages are honoured too.
    per_tok = torch.linspace(-1, 1, 24).view(3, 8)
    l3, c3 = ppo_clip_loss(logp, old, per_tok, 0.2, 0.28)
    want_loss, want_clip = _naive_ppo(logp.tolist(), old.tolist(), per_tok.tolist(), 0.2, 0.28)
    assert torch.allclose(l3, torch.tensor(want_loss), atol=1e-6)
    assert torch.equal(c3, torch.tensor(want_clip))


def test_ppo_clip_loss_gradient_is_zero_when_clipped() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([2.0]), 0.2, 0.28)
    loss.sum().backward()
    # clipped token: no gradient; ratio-1 token: d(-r*A)/dlogp = -r*A = -2.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -2.0]]), atol=1e-6)


def test_kl_k3_matches_naive_and_is_nonnegative() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=gen) * 4
    ref = -torch.rand(4, 6, generator=gen) * 4
    got = kl_k3(logp, ref)
    want = [[math.exp(r - p) - (r - p) - 1 for p, r in zip(pr, rr)] for pr, rr in zip(logp.tolist(), ref.tolist())]
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)
    assert (got >= 0).all() and (got > 0).any()
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))


def test_token_mean_matches_naive() -> None:
    values = torch.arange(12, dtype=torch.float32).view(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    naive = sum(v for vr, mr in zip(values.tolist(), mask.tolist()) for v, m in zip(vr, mr) if m) / 6
    assert torch.allclose(token_mean(values, mask), torch.tensor(naive))
    assert torch.allclose(token_mean(values, mask, total_tokens=12.0), torch.tensor(naive * 6 / 12))
    assert float(token_mean(values, torch.zeros_like(mask))) == 0.0  # no tokens: 0, not nan


def test_token_mean_micro_batches_sum_to_whole_batch() -> None:
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(8, 5, generator=gen)
    lengths = [5, 1, 3, 2, 5, 4, 0, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lengths])
    total = float(mask.sum())
    whole = token_mean(values, mask)
    for mb in (1, 2, 3, 8):
        acc = sum(token_mean(values[i:i + mb], mask[i:i + mb], total_tokens=total) for i in range(0, 8, mb))
        assert torch.allclose(acc, whole, atol=1e-6)
    # Without total_tokens micro-batch means do not add up (lengths differ): the argument matters.
    naive = sum(token_mean(values[i:i + 2], mask[i:i + 2]) for i in range(0, 8, 2)) / 4
    assert not torch.allclose(naive, whole, atol=1e-4)
