"""The shared-prompt layout (each GRPO group's prompt run once for all its completions) gives the
same log-probs and gradients as one padded row per sample (tiny random model, fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from honing.models import build_tiny_random
from honing.train.logprobs import (
    _head_and_decoder,
    completion_logprobs,
    shared_prompt_logprobs,
    shared_prompt_rows,
    shared_prompt_supported,
)

from .helpers import first_step_grads, make_trainer, sampled_trajectories


@pytest.fixture(scope="module")
def trajs(tiny):  # noqa: ANN001
    return sampled_trajectories(*tiny)


def test_rows_group_by_prompt_and_respect_the_cap() -> None:
    prompts = [(1, 2, 3)] * 3 + [(4, 5)] * 2 + [(1, 2, 3)]
    comps = [(7,) * 4, (7,) * 2, (7,) * 5, (8,) * 3, (8,) * 9, (7,)]
    assert shared_prompt_rows(prompts, comps, 1000) == [[0, 1, 2, 5], [3, 4]]
    rows = shared_prompt_rows(prompts, comps, 10)
    assert rows == [[0, 1], [2, 5], [3], [4]]  # 3+4+2 <= 10; 3+5+1; 2+3; 2+9 > 10 but alone
    assert sorted(i for r in rows for i in r) == list(range(6))


def _both(model, tok, ps, cs, **kw):  # noqa: ANN001, ANN003, ANN202
    """(log-probs, mask, grads) for the padded and the shared-prompt layouts."""
    out = []
    for fn in (completion_logprobs, shared_prompt_logprobs):
        model.zero_grad()
        lp, mask = fn(model, ps, cs, tok.pad_token_id, 0.7, **kw)
        (lp * mask * torch.linspace(-1, 1, lp.shape[1])).sum().backward()
        out.append((lp.detach(), mask, {n: p.grad.clone() for n, p in model.named_parameters()}))
    return out


@pytest.mark.parametrize("max_row_tokens,chunk", [(1024, 0), (1024, 8), (20, 0)])
def test_shared_prompt_equals_padded_rows(tiny, trajs, max_row_tokens: int, chunk: int) -> None:  # noqa: ANN001
    _, tok = tiny
    model, _ = build_tiny_random(seed=0)
    assert shared_prompt_supported(model)
    ps, cs = [t.prompt_ids for t in trajs], [list(t.completion_ids) for t in trajs]
    cs[2] = []  # an empty completion: no log-probs, no gradient, no crash
    if max_row_tokens == 20:  # rows split: several rows per prompt
        assert len(shared_prompt_rows(ps, cs, max_row_tokens)) > 2
    (lp_a, m_a, g_a), (lp_b, m_b, g_b) = _both(model, tok, ps, cs, chunk_tokens=chunk)
    if max_row_tokens != 1024:
        model.zero_grad()
        lp_b, m_b = shared_prompt_logprobs(model, ps, cs, tok.pad_token_id, 0.7, chunk, max_row_tokens)
        (lp_b * m_b * torch.linspace(-1, 1, lp_b.shape[1])).sum().backward()
        g_b = {n: p.grad.clone() for n, p in model.named_parameters()}
        lp_b = lp_b.detach()
    assert torch.equal(m_a, m_b) and m_a[2].sum() == 0
    assert torch.allclose(lp_a * m_a, lp_b * m_b, atol=1e-5), float(((lp_a - lp_b) * m_a).abs().max())
    for n in g_a:
        assert torch.allclose(g_a[n], g_b[n], rtol=1e-4, atol=1e-6), n
    assert sum(float(g.abs().sum()) for g in g_b.values()) > 0


def test_completions_of_one_prompt_do_not_see_each_other(tiny) -> None:  # noqa: ANN001
    """Changing one completion leaves its siblings' log-probs untouched (the mask works)."""
    _, tok = tiny
    model, _ = build_tiny_random(seed=0)
    p = [5, 6, 7, 8]
    with torch.no_grad():
        a, _ = shared_prompt_logprobs(model, [p] * 3, [[10, 11, 12], [20, 21], [30, 31, 32, 33]], tok.pad_token_id)
        b, _ = shared_prompt_logprobs(model, [p] * 3, [[10, 11, 12], [25, 26], [30, 31, 32, 33]], tok.pad_token_id)
    assert torch.equal(a[0], b[0]) or torch.allclose(a[0], b[0], atol=1e-6)
    assert torch.allclose(a[2], b[2], atol=1e-6)
    assert not torch.allclose(a[1], b[1], atol=1e-3)


def test_prompt_runs_once_per_group(tiny, trajs) -> None:  # noqa: ANN001
    """The decoder sees one row per distinct prompt and no per-sample prompt copies."""
    _, tok = tiny
    model, _ = build_tiny_random(seed=0)
    dec = _head_and_decoder(model)[0]  # type: ignore[index]
    seen = []
    hook = dec.register_forward_hook(lambda m, i, o: seen.append(tuple(o.last_hidden_state.shape[:2])))
    try:
        with torch.no_grad():
            shared_prompt_logprobs(model, [t.prompt_ids for t in trajs], [t.completion_ids for t in trajs],
                                   tok.pad_token_id)
    finally:
        hook.remove()
    widths = [len(trajs[g * 4].prompt_ids) + sum(len(t.completion_ids) for t in trajs[g * 4:g * 4 + 4])
              for g in range(2)]
    assert seen == [(2, max(widths))]
    padded = len(trajs) * (max(len(t.prompt_ids) for t in trajs) + max(len(t.completion_ids) for t in trajs))
    assert 2 * max(widths) < padded


@pytest.mark.parametrize("budget", [0, 40])
def test_trainer_step_same_with_and_without_sharing(tiny, trajs, budget: int) -> None:  # noqa: ANN001
    _, tok = tiny
    kw = {"micro_batch_tokens": budget, "micro_batch_size": 3}
    shared = make_trainer(build_tiny_random(seed=0)[0], tok, share_prompt=True, packed_row_tokens=24, **kw)
    plain = make_trainer(build_tiny_random(seed=0)[0], tok, share_prompt=False, **kw)
    assert shared.share_prompt and not plain.share_prompt
    if budget:
        micro = shared._micro_batches([_S(t) for t in trajs])
        assert len(micro) > 1 and sorted(id(s.traj) for m in micro for s in m) == sorted(id(t) for t in trajs)
    ms, mp = shared.step(trajs), plain.step(trajs)
    assert ms["loss"] == pytest.approx(mp["loss"], rel=1e-5) and abs(mp["loss"]) > 1e-3
    ga, gb = first_step_grads(shared), first_step_grads(plain)
    for n in gb:
        assert torch.allclose(ga[n], gb[n], rtol=1e-4, atol=1e-6), n


class _S:  # the minimal shape _micro_batches reads
    def __init__(self, t) -> None:  # noqa: ANN001
        self.traj = t
