"""Invariances the trainer must keep (tiny random model, fp32, CPU): accumulation, bucketing,
chunked log-probs, LoRA at init, trainer == engine log-probs, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from honing.config import LoraConfig
from honing.models import build_tiny_random
from honing.train.logprobs import _head_and_decoder, completion_logprobs, token_budget_batches
from honing.train.trainer import apply_lora

from .helpers import engine, first_step_grads, make_trainer, prompts, sampled_trajectories


@pytest.fixture(scope="module")
def trajs(tiny):  # noqa: ANN001
    return sampled_trajectories(*tiny)


def _assert_grads_equal(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=rtol, atol=atol), (k, float((a[k] - b[k]).abs().max()))
    assert sum(float(g.abs().sum()) for g in a.values()) > 0


@pytest.mark.parametrize("loss,agg", [("ppo_clip", "token_mean"), ("gspo", "seq_mean_token_mean"),
                                      ("cispo", "seq_sum_norm")])
def test_accumulation_4x2_equals_one_micro_batch_of_8(tiny, trajs, loss: str, agg: str) -> None:  # noqa: ANN001
    _, tok = tiny
    kw = {"policy_loss": loss, "loss_aggregation": agg, "logprob_chunk_tokens": 0}
    small = make_trainer(build_tiny_random(seed=0)[0], tok, micro_batch_size=2, **kw)
    big = make_trainer(build_tiny_random(seed=0)[0], tok, micro_batch_size=8, **kw)
    ms, mb = small.step(trajs), big.step(trajs)
    assert ms["loss"] == pytest.approx(mb["loss"], rel=1e-5) and abs(mb["loss"]) > 1e-3
    assert ms["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4)
    _assert_grads_equal(first_step_grads(small), first_step_grads(big))
    # Each aggregation gives a different gradient (so equal gradients above are not a coincidence).
    other = make_trainer(build_tiny_random(seed=0)[0], tok, micro_batch_size=8, policy_loss=loss,
                         loss_aggregation="token_mean" if agg != "token_mean" else "seq_mean_token_mean")
    assert other.step(trajs)["grad_norm"] != pytest.approx(mb["grad_norm"], rel=1e-3)


def test_token_budget_batches_sort_and_respect_budget() -> None:
    lengths = [(10, 8), (12, 1), (10, 6), (12, 8), (10, 2), (12, 5)]
    batches = token_budget_batches(lengths, budget=40)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        width = max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b)
        assert len(b) == 1 or len(b) * width <= 40
    padded = len(lengths) * (12 + 8)
    bucketed = sum(len(b) * (max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b)) for b in batches)
    assert bucketed < padded  # less compute on padding than one padded batch
    assert token_budget_batches([(50, 50)], budget=10) == [[0]]  # too long: alone, never dropped


def test_bucketed_micro_batches_equal_one_padded_batch(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    budget = 3 * (len(trajs[0].prompt_ids) + 8)
    bucketed = make_trainer(build_tiny_random(seed=0)[0], tok, micro_batch_tokens=budget, share_prompt=False)
    padded = make_trainer(build_tiny_random(seed=0)[0], tok, micro_batch_size=8, share_prompt=False)
    assert len(bucketed._micro_batches([_S(t) for t in trajs])) > 2
    mb, mp = bucketed.step(trajs), padded.step(trajs)
    assert mb["loss"] == pytest.approx(mp["loss"], rel=1e-5)
    _assert_grads_equal(first_step_grads(bucketed), first_step_grads(padded))


class _S:  # the minimal shape _micro_batches reads
    def __init__(self, t) -> None:  # noqa: ANN001
        self.traj = t


def test_chunked_logprobs_equal_unchunked_and_bound_the_logits(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    model, _ = build_tiny_random(seed=0)
    ps, cs = [t.prompt_ids for t in trajs], [t.completion_ids for t in trajs]
    dec_head = _head_and_decoder(model)
    assert dec_head is not None
    shapes = []
    hook = dec_head[1].register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    try:
        full, mask = completion_logprobs(model, ps, cs, tok.pad_token_id, 0.7, chunk_tokens=0)
        (full * mask).sum().backward()
        g_full = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        shapes.clear()
        chunked, mask2 = completion_logprobs(model, ps, cs, tok.pad_token_id, 0.7, chunk_tokens=16)
        (chunked * mask2).sum().backward()
    finally:
        hook.remove()
    assert torch.equal(mask, mask2)
    assert torch.allclose(full, chunked, atol=1e-6)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, g_full[n], rtol=1e-4, atol=1e-6), n
    # Every head call saw at most 16 (row x position) tokens: 8 rows x 2 positions, forward and backward.
    assert shapes and all(s[0] * s[1] <= 16 for s in shapes), shapes
    assert len(shapes) == 2 * 4  # 4 chunks of 2 columns, each recomputed once in the backward pass


def test_zero_initialised_lora_reproduces_base_logprobs(tiny, trajs) -> None:  # noqa: ANN001
    base, tok = tiny
    ps, cs = [t.prompt_ids for t in trajs], [t.completion_ids for t in trajs]
    with torch.no_grad():
        want, _ = completion_logprobs(base, ps, cs, tok.pad_token_id, chunk_tokens=0)
    model, _ = build_tiny_random(seed=0)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8))
    with torch.no_grad():
        for chunk in (0, 16):
            got, _ = completion_logprobs(peft_model, ps, cs, tok.pad_token_id, chunk_tokens=chunk)
            assert torch.allclose(got, want, atol=1e-6), chunk
        for n, p in peft_model.named_parameters():  # a non-zero adapter does change them
            if "lora_B" in n:
                p.fill_(0.05)
        moved, _ = completion_logprobs(peft_model, ps, cs, tok.pad_token_id, chunk_tokens=16)
    assert not torch.allclose(moved, want, atol=1e-3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_logprobs_equal_engine_sampling_logprobs(tiny, temperature: float) -> None:  # noqa: ANN001
    model, tok = tiny
    ps = prompts(tok)
    from honing.engine import SamplingParams

    out = engine(model, tok).generate(ps, SamplingParams(n=3, max_new_tokens=8, temperature=temperature), seed=11)
    flat_p = [p for p, g in zip(ps, out) for _ in g]
    flat = [s for g in out for s in g]
    for chunk in (0, 8):
        with torch.no_grad():
            logp, mask = completion_logprobs(model, flat_p, [s.token_ids for s in flat], tok.pad_token_id,
                                             temperature, chunk_tokens=chunk)
        for i, s in enumerate(flat):
            n = len(s.token_ids)
            assert torch.allclose(logp[i, :n], torch.tensor(s.logprobs), atol=2e-5), (chunk, i)
    # And through the trainer: its recomputed old log-probs match the engine's (fp32).
    from honing.rollout.types import Trajectory

    trajs = [Trajectory(task_id="t", domain="d", prompt_ids=tuple(p), completion_ids=s.token_ids, logprobs=s.logprobs,
                        completion_text="", finish_reason=s.finish_reason, policy_version=0, advantage=0.5)
             for p, s in zip(flat_p, flat)]
    trainer = make_trainer(build_tiny_random(seed=0)[0], tok, recompute_old_logprobs=True, micro_batch_tokens=64)
    trainer.temperature = temperature
    m = trainer.step(trajs)
    assert m["logprob_mismatch"] < 2e-6 and m["mismatch_max_ratio"] < 1 + 2e-5


def test_gradient_checkpointing_gives_the_same_gradients(tiny, trajs) -> None:  # noqa: ANN001
    _, tok = tiny
    plain = make_trainer(build_tiny_random(seed=0)[0], tok)
    ckpt = make_trainer(build_tiny_random(seed=0)[0], tok, gradient_checkpointing=True)
    on = [getattr(t.model, "is_activation_checkpointing", None) for t in (ckpt, plain)]
    on = on if None not in on else [t.model.is_gradient_checkpointing for t in (ckpt, plain)]
    assert on == [True, False]
    plain.step(trajs), ckpt.step(trajs)
    _assert_grads_equal(first_step_grads(plain), first_step_grads(ckpt))


def test_sft_bucketed_and_chunked_equals_one_batch(tiny, trajs) -> None:  # noqa: ANN001
    from honing.train.sft import sft

    _, tok = tiny
    demos = [(list(t.prompt_ids), list(t.completion_ids)) for t in trajs]
    a, _ = build_tiny_random(seed=0)
    b, _ = build_tiny_random(seed=0)
    la = sft(a, demos, tok.pad_token_id, steps=2, learning_rate=1e-3, batch_size=8, bf16_autocast=False)
    lb = sft(b, demos, tok.pad_token_id, steps=2, learning_rate=1e-3, batch_size=8, bf16_autocast=False,
             micro_batch_tokens=3 * (len(trajs[0].prompt_ids) + 8), chunk_tokens=8)
    assert la == pytest.approx(lb, rel=1e-5) and la[1] < la[0]
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    # Adam divides by |g| + 1e-8: float rounding of near-zero gradients moves weights by up to ~lr/10.
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < 1e-4


def test_decode_batch_compaction_keeps_engine_logprobs_exact(tiny) -> None:  # noqa: ANN001
    """Rows that finished are dropped from the decode batch (cache rows selected away). With a
    large end-of-sequence set rows finish at different steps, so compaction happens several
    times; every sample's log-probs must still be exactly the teacher-forced ones."""
    from honing.engine import SamplingParams, TransformersEngine

    model, tok = tiny
    ps = prompts(tok)
    eos = list(range(3, tok.vocab_size, 4))  # a quarter of the vocabulary ends a row
    eng = TransformersEngine(model, eos_ids=eos, pad_id=tok.pad_token_id)
    out = eng.generate(ps, SamplingParams(n=4, max_new_tokens=12, temperature=1.0), seed=5)
    flat_p = [p for p, g in zip(ps, out) for _ in g]
    flat = [s for g in out for s in g]
    lengths = {len(s.token_ids) for s in flat}
    assert len(lengths) >= 3 and min(lengths) < 6, lengths  # rows really finished at different steps
    with torch.no_grad():
        logp, _ = completion_logprobs(model, flat_p, [s.token_ids for s in flat], tok.pad_token_id, 1.0)
    for i, s in enumerate(flat):
        n = len(s.token_ids)
        assert torch.allclose(logp[i, :n], torch.tensor(s.logprobs), atol=2e-5), i
