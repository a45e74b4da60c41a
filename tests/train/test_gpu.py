"""The same invariances on a CUDA device (skipped without one): shared-prompt layout vs padded
rows, trainer log-probs vs engine log-probs, a fused-AdamW step, and the engine's bf16 copy."""

from __future__ import annotations

import pytest
import torch

from honing.engine import SamplingParams, TransformersEngine
from honing.models import build_tiny_random
from honing.train.logprobs import completion_logprobs, shared_prompt_logprobs

from .helpers import make_trainer, sampled_trajectories

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda_tiny():  # noqa: ANN201
    model, tok = build_tiny_random(seed=0)
    return model.to("cuda"), tok


def test_shared_prompt_equals_padded_on_cuda(cuda_tiny) -> None:  # noqa: ANN001
    model, tok = cuda_tiny
    trajs = sampled_trajectories(model, tok)
    ps, cs = [t.prompt_ids for t in trajs], [t.completion_ids for t in trajs]
    with torch.no_grad():
        a, m = completion_logprobs(model, ps, cs, tok.pad_token_id)
        b, m2 = shared_prompt_logprobs(model, ps, cs, tok.pad_token_id)
    assert torch.equal(m, m2)
    assert torch.allclose(a * m, b * m2, atol=1e-4)
    # the engine's sampling log-probs are the trainer's (fp32, same weights)
    eng = torch.cat([torch.tensor(t.logprobs, device="cuda") for t in trajs])
    assert torch.allclose(b[m2.bool()], eng, atol=1e-4)


def test_fused_adamw_step_and_bf16_engine_on_cuda(cuda_tiny) -> None:  # noqa: ANN001
    model, tok = build_tiny_random(seed=0)
    model = model.to("cuda")
    trajs = sampled_trajectories(model, tok)
    trainer = make_trainer(model, tok)
    assert trainer.opt.defaults.get("fused")
    before = [p.detach().clone() for p in model.parameters()]
    m = trainer.step(trajs)
    assert m["optimizer_steps"] == 1 and m["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    eng = TransformersEngine(model, [tok.eos_token_id], tok.pad_token_id, True, 64, torch.bfloat16)
    eng.load_weights(None, version=1)
    out = eng.generate([trajs[0].prompt_ids], SamplingParams(8, 1.0, 1.0, 0, 4), seed=0)
    assert len(out[0]) == 4 and all(s.token_ids for s in out[0])
    for a, p in zip(eng.model.parameters(), model.parameters()):
        assert torch.equal(a, p.to(torch.bfloat16))
