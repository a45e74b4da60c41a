"""SFT sequence packing: packed rows give the demos' own log-probs, the same loss and update."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from honing.train.logprobs import completion_logprobs
from honing.train.sft import (
    _batch_losses,
    pack_demos,
    packed_layout,
    packed_logprobs,
    sft,
)

QUESTIONS = ["What is 12 + 30?", "Calculate 7 + 8.", "hi", "What is 4 + 5? Answer with a number.", "2+2"]
ANSWERS = ["42", "15", "hello there", "9", "4, because two and two make four"]


def _demos(tok) -> list[tuple[list[int], list[int]]]:
    out = []
    for q, a in zip(QUESTIONS, ANSWERS):
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        out.append((tok(text, add_special_tokens=False).input_ids,
                    tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]))
    return out


def test_pack_demos_budget_and_cover():
    rng = random.Random(0)
    demos = [([1] * rng.randint(1, 30), [2] * rng.randint(0, 20)) for _ in range(50)]
    demos.append(([1] * 70, [2] * 10))  # longer than the budget: a row of its own
    rows = pack_demos(demos, 64)
    assert sorted(i for r in rows for i in r) == list(range(len(demos)))
    for r in rows:
        n = sum(len(demos[i][0]) + len(demos[i][1]) for i in r)
        assert n <= 64 or len(r) == 1
    assert [50] in rows
    assert len(rows) < len(demos) // 2
    assert pack_demos([], 64) == []
    with pytest.raises(ValueError):
        pack_demos(demos, 0)


def test_packed_layout_positions_restart():
    demos = [([5, 6], [7]), ([8], [9, 10])]
    ids, pos, g_row, g_col, tgt = packed_layout(demos, [[0, 1]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert g_col.tolist() == [1, 3, 4] and tgt.tolist() == [7, 9, 10] and g_row.tolist() == [0, 0, 0]


@pytest.mark.parametrize("chunk_tokens", [0, 3])
def test_packed_logprobs_match_one_demo_at_a_time(tiny, chunk_tokens):
    model, tok = tiny
    demos = _demos(tok)
    rows = pack_demos(demos, 2 * max(len(p) + len(c) for p, c in demos))
    assert len(rows) < len(demos) and any(len(r) > 1 for r in rows)
    with torch.no_grad():
        packed = packed_logprobs(model, demos, rows, tok.pad_token_id, chunk_tokens=chunk_tokens)
        alone = []
        for r in rows:
            for i in r:
                logp, _ = completion_logprobs(model, [demos[i][0]], [demos[i][1]], tok.pad_token_id)
                alone.append(logp[0])
    alone = torch.cat(alone)
    assert packed.shape == alone.shape == (sum(len(c) for _, c in demos),)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)


def test_packed_logprobs_would_differ_without_isolation(tiny):
    """Sanity check of the test above: with one continuous position range (attention across
    demos) the values change, so the equality is not vacuous."""
    model, tok = tiny
    demos = _demos(tok)[:2]
    ids, _pos, g_row, g_col, tgt = packed_layout(demos, [[0, 1]], tok.pad_token_id)
    with torch.no_grad():
        iso = packed_logprobs(model, demos, [[0, 1]], tok.pad_token_id)
        logits = model(input_ids=ids, use_cache=False).logits
        leak = torch.log_softmax(logits[g_row, g_col], -1).gather(-1, tgt[:, None]).squeeze(-1)
    n0 = len(demos[0][1])
    torch.testing.assert_close(iso[:n0], leak[:n0], atol=1e-5, rtol=0)
    assert (iso[n0:] - leak[n0:]).abs().max() > 1e-3


@pytest.mark.parametrize("micro_batch_tokens", [0, 200])
def test_packed_gradient_equals_unpacked(tiny, micro_batch_tokens):
    """The accumulated gradient of one batch, packed (into 1 forward, or several under a token
    budget) vs padded: equal to float32 rounding."""
    model, tok = tiny
    demos = _demos(tok)
    assert len(pack_demos(demos, 100)) < len(demos)
    grads, losses, forwards = [], [], []
    for pack in (0, 100):
        m = copy.deepcopy(model)
        m.train()
        loss, n = 0.0, 0
        for part in _batch_losses(m, demos, tok.pad_token_id, False, micro_batch_tokens, 0, pack):
            part.backward()
            loss += float(part.detach())
            n += 1
        forwards.append(n)
        grads.append({k: p.grad for k, p in m.named_parameters()})
        losses.append(loss)
    assert forwards[1] == (2 if micro_batch_tokens else 1)
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    for k, g0 in grads[0].items():
        assert g0.abs().max() > 0, k
        assert ((grads[1][k] - g0).abs().max() / g0.abs().max()) < 1e-5, k


def _one_step(model, tok, demos, lr: float) -> list[tuple[float, dict[str, torch.Tensor]]]:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = []
    for pack in (0, 100):
        m = copy.deepcopy(model)
        losses = sft(m, demos, tok.pad_token_id, steps=1, learning_rate=lr, batch_size=len(demos),
                     bf16_autocast=False, seed=0, pack_tokens=pack)
        out.append((losses[0], {k: (v - before[k]) for k, v in m.state_dict().items()}))
    return out


def test_one_packed_step_equals_unpacked_step_sgd(tiny, monkeypatch):
    """One sft() step (accumulation, clipping, update) with the optimiser swapped for plain SGD,
    whose update is linear in the gradient: the same loss and the same update to 1e-5. (A large
    lr keeps the float32 rounding of the parameters themselves out of the differences.)"""
    model, tok = tiny
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr: torch.optim.SGD(params, lr=lr))
    (l0, d0), (l1, d1) = _one_step(model, tok, _demos(tok), lr=100.0)
    assert l1 == pytest.approx(l0, rel=1e-6)
    for k in d0:
        assert d0[k].abs().max() > 0, k
        assert ((d1[k] - d0[k]).abs().max() / d0[k].abs().max()) < 1e-5, k


def test_one_packed_step_equals_unpacked_step_adamw(tiny):
    """The real optimiser. AdamW's first step is about lr * g / (|g| + eps) per element, which
    magnifies float32 rounding of near-zero gradients, so updates agree to 1% of lr (measured:
    0.07%), while most elements move by the full lr."""
    model, tok = tiny
    lr = 1e-3
    (l0, d0), (l1, d1) = _one_step(model, tok, _demos(tok), lr=lr)
    assert l1 == pytest.approx(l0, rel=1e-6)
    for k in d0:
        assert (d1[k] - d0[k]).abs().max() < 1e-2 * lr, k
    assert max(d.abs().max() for d in d0.values()) > 0.5 * lr


def test_activation_checkpointing_gives_the_same_sft_step(tiny, monkeypatch):
    """sft.gradient_checkpointing trades time for memory only: one SGD step with activations
    recomputed in the backward equals the step without, and switching it off restores the model."""
    from honing.train.trainer import set_activation_checkpointing

    model, tok = tiny
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr: torch.optim.SGD(params, lr=lr))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = []
    for ckpt in (False, True):
        m = copy.deepcopy(model)
        set_activation_checkpointing(m, ckpt)
        on = lambda: getattr(m, "is_activation_checkpointing", None) or m.is_gradient_checkpointing  # noqa: E731
        assert bool(on()) == ckpt
        losses = sft(m, _demos(tok), tok.pad_token_id, steps=1, learning_rate=100.0, batch_size=5,
                     bf16_autocast=False, seed=0)
        out.append((losses[0], {k: v - before[k] for k, v in m.state_dict().items()}))
        set_activation_checkpointing(m, False)
        assert not on()
    (l0, d0), (l1, d1) = out
    assert l1 == pytest.approx(l0, rel=1e-6)
    for k in d0:
        assert d0[k].abs().max() > 0, k
        assert ((d1[k] - d0[k]).abs().max() / d0[k].abs().max()) < 1e-5, k
