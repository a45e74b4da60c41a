"""honing.train.losses against naive per-element Python loops."""

from __future__ import annotations

import math

import pytest
import torch

from honing.config import TrainConfig
from honing.train.advantages import (broadcast_to_tokens, compute_advantages, dr_grpo_advantages, grpo_advantages,
                                     overlong_penalty, reinforce_pp_advantages, rloo_advantages)
from honing.train.losses import (aggregate_loss, cispo_loss, gspo_loss, kl_k1, kl_k2, kl_k3, ppo_clip_loss,
                                 sequence_ratio_mask, tis_weights, token_mean)


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


# --- advantage estimators ------------------------------------------------------------------------


def _naive_rloo(rewards: list[float], g: int) -> list[float]:
    out = []
    for s in range(0, len(rewards), g):
        grp = rewards[s:s + g]
        for i, r in enumerate(grp):
            others = [x for j, x in enumerate(grp) if j != i]
            out.append(r - sum(others) / len(others))
    return out


def _naive_batch_norm(rewards: list[float], eps: float = 1e-6) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + eps) for r in rewards]


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_rloo_matches_naive_leave_one_out(group_size: int) -> None:
    rewards = torch.rand(4 * group_size, generator=torch.Generator().manual_seed(group_size))
    got = rloo_advantages(rewards, group_size)
    assert torch.allclose(got, torch.tensor(_naive_rloo(rewards.tolist(), group_size)), atol=1e-6)
    # RLOO = G/(G-1) x centring: differs from Dr. GRPO by exactly that factor.
    assert torch.allclose(got, dr_grpo_advantages(rewards, group_size) * group_size / (group_size - 1), atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(rewards, 1)


def test_dr_grpo_is_centring_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.25, 1.0])
    want = torch.tensor(_naive_advantages(rewards.tolist(), 4, scale=False))
    assert torch.allclose(dr_grpo_advantages(rewards, 4), want, atol=1e-6)


def test_reinforce_pp_is_batch_normalised() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.25])
    got = reinforce_pp_advantages(rewards)
    assert torch.allclose(got, torch.tensor(_naive_batch_norm(rewards.tolist())), atol=1e-5)
    # Unlike the group estimators, an all-equal group is not zeroed (its baseline is the batch's).
    assert torch.all(got[3:6] != 0)
    assert abs(float(got.mean())) < 1e-6 and abs(float(got.std()) - 1) < 1e-3
    assert torch.isfinite(reinforce_pp_advantages(torch.tensor([0.5]))).all()


def test_broadcast_to_tokens() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    got = broadcast_to_tokens(torch.tensor([0.5, -2.0]), mask)
    assert got.tolist() == [[0.5, 0.5, 0.0], [-2.0, 0.0, -2.0]]


def test_overlong_penalty_matches_dapo_formula() -> None:
    lengths = torch.tensor([10, 12, 16, 18, 20, 25])
    got = overlong_penalty(lengths, max_len=20, cache_len=8)
    want = [0.0 if L <= 12 else ((12 - L) / 8 if L <= 20 else -1.0) for L in lengths.tolist()]
    assert torch.allclose(got, torch.tensor(want))
    assert got.tolist()[2] == -0.5


@pytest.mark.parametrize("est,fn", [("grpo", lambda r: grpo_advantages(r, 4)),
                                    ("dr_grpo", lambda r: dr_grpo_advantages(r, 4)),
                                    ("rloo", lambda r: rloo_advantages(r, 4)),
                                    ("reinforce_pp", reinforce_pp_advantages)])
def test_compute_advantages_dispatches_on_config(est: str, fn) -> None:  # noqa: ANN001
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.25, 1.0])
    assert torch.equal(compute_advantages(rewards, 4, TrainConfig(advantage_estimator=est)), fn(rewards))


# --- GSPO, CISPO, KL, aggregation, off-policy weights -------------------------------------------------


def test_gspo_matches_naive_sequence_ratio() -> None:
    logp, old = _ppo_inputs()
    mask = torch.tensor([[1.0] * 8, [1.0] * 5 + [0.0] * 3, [1.0] * 2 + [0.0] * 6])
    adv = [1.0, 0.5, -2.0]  # row 1: ratio 1.27 > 1 + hi with A > 0 (clipped); row 0: ratio 1
    lo, hi = 0.05, 0.1
    loss, clipped = gspo_loss(logp, old, torch.tensor(adv), mask, lo, hi)
    L, O, M = logp.tolist(), old.tolist(), mask.tolist()
    for b in range(3):
        n = sum(M[b])
        s = math.exp(sum((L[b][t] - O[b][t]) * M[b][t] for t in range(8)) / n)
        sc = min(max(s, 1 - lo), 1 + hi)
        want = -min(s * adv[b], sc * adv[b])
        assert all(abs(x - want) < 1e-5 for x in loss[b].tolist())
        assert clipped[b].tolist() == [float(sc * adv[b] < s * adv[b])] * 8
    assert 0 < clipped[:, 0].sum() < 3
    # The gradient of one sequence's loss is spread over its masked tokens evenly (1/|o|), none outside.
    lp = logp.clone().requires_grad_(True)
    l2, _ = gspo_loss(lp, old, torch.tensor([1.0, 1.0, 1.0]), mask, 10.0, 10.0)  # never clipped
    l2[:, 0].sum().backward()
    for b in range(3):
        n = int(mask[b].sum())
        s = math.exp(float(((logp[b] - old[b]) * mask[b]).sum()) / n)
        assert torch.allclose(lp.grad[b, :n], torch.full((n,), -s / n), atol=1e-5)
        assert torch.all(lp.grad[b, n:] == 0)


def test_cispo_matches_naive_and_stops_weight_gradient() -> None:
    logp, old = _ppo_inputs()
    adv = [1.5, -0.7, 0.3]
    loss, clipped = cispo_loss(logp, old, torch.tensor(adv), max_weight=1.3)
    for b in range(3):
        for t in range(8):
            r = math.exp(float(logp[b, t] - old[b, t]))
            w = min(r, 1.3)
            assert abs(float(loss[b, t]) - (-w * adv[b] * float(logp[b, t]))) < 1e-5
            assert float(clipped[b, t]) == float(r > 1.3)
    assert 0 < clipped.sum() < 24
    # d loss / d logp = -w * A (the weight is a constant), even where the weight is clipped.
    lp = logp.clone().requires_grad_(True)
    cispo_loss(lp, old, torch.tensor(adv), max_weight=1.3)[0].sum().backward()
    w = torch.clamp(torch.exp(logp - old), max=1.3)
    assert torch.allclose(lp.grad, -w * torch.tensor(adv)[:, None], atol=1e-6)


def test_kl_k1_k2_match_naive() -> None:
    gen = torch.Generator().manual_seed(3)
    logp, ref = -torch.rand(3, 5, generator=gen) * 3, -torch.rand(3, 5, generator=gen) * 3
    P, R = logp.tolist(), ref.tolist()
    assert torch.allclose(kl_k1(logp, ref), torch.tensor([[p - r for p, r in zip(a, b)] for a, b in zip(P, R)]))
    assert torch.allclose(kl_k2(logp, ref), torch.tensor([[0.5 * (p - r) ** 2 for p, r in zip(a, b)]
                                                          for a, b in zip(P, R)]))
    assert (kl_k1(logp, ref) < 0).any() and (kl_k2(logp, ref) >= 0).all()


def _naive_aggregate(values: list[list[float]], mask: list[list[float]], mode: str, norm: float) -> float:
    seqs = [(v, m) for v, m in zip(values, mask)]
    n_tok = sum(sum(m) for _, m in seqs)
    n_seq = sum(1 for _, m in seqs if sum(m))
    if mode == "token_mean":
        return sum(x * y for v, m in seqs for x, y in zip(v, m)) / n_tok
    if mode == "seq_mean_token_mean":
        return sum(sum(x * y for x, y in zip(v, m)) / sum(m) for v, m in seqs if sum(m)) / n_seq
    return sum(x * y for v, m in seqs for x, y in zip(v, m)) / (n_seq * norm)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_aggregate_loss_matches_naive_and_adds_over_micro_batches(mode: str) -> None:
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(8, 6, generator=gen)
    lengths = [6, 1, 3, 2, 6, 4, 5, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths])
    n_tok, n_seq = float(mask.sum()), 8.0
    whole = aggregate_loss(values, mask, mode, n_tok, n_seq, norm_tokens=16.0)
    assert float(whole) == pytest.approx(_naive_aggregate(values.tolist(), mask.tolist(), mode, 16.0), abs=1e-5)
    for mb in (1, 2, 3):
        acc = sum(aggregate_loss(values[i:i + mb], mask[i:i + mb], mode, n_tok, n_seq, 16.0) for i in range(0, 8, mb))
        assert torch.allclose(acc, whole, atol=1e-6)
    others = {m: float(aggregate_loss(values, mask, m, n_tok, n_seq, 16.0))
              for m in ("token_mean", "seq_mean_token_mean", "seq_sum_norm")}
    assert len({round(v, 5) for v in others.values()}) == 3  # the three modes really differ here


def test_tis_weights_truncate_and_carry_no_gradient() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    eng = torch.tensor([[-1.0, -2.5, -2.0, -2.0]])
    w = tis_weights(old, eng, cap=2.0)
    want = [min(math.exp(o - e), 2.0) for o, e in zip(old[0].tolist(), eng[0].tolist())]
    assert torch.allclose(w, torch.tensor([want]))
    assert w.tolist()[0][2] == 2.0 and w.tolist()[0][0] == 1.0 and w.tolist()[0][3] < 1
    assert not w.requires_grad


def test_sequence_ratio_mask_geometric_mean() -> None:
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0], [-2.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    eng = torch.tensor([[-1.0, -1.0, -1.0], [-1.5, -1.5, -9.0], [-1.0, -1.0, 0.0], [-1.0, -5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    keep, rho = sequence_ratio_mask(old, eng, mask, 0.8, 1.25)
    want_rho = []
    for o, e, m in zip(old.tolist(), eng.tolist(), mask.tolist()):
        want_rho.append(math.exp(sum((a - b) * c for a, b, c in zip(o, e, m)) / sum(m)))
    assert torch.allclose(rho, torch.tensor(want_rho))
    assert keep[:, 0].tolist() == [float(0.8 <= r <= 1.25) for r in want_rho] == [1.0, 0.0, 0.0, 1.0]
    keep_hi, _ = sequence_ratio_mask(old, eng, mask, None, 1.25)
    assert keep_hi[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]  # only the upper bound applies
