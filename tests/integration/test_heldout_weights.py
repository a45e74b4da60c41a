"""Held-out evaluation measures the weights that get exported (`eval.weights: export`, the default),
not the generation engine's bf16 copy, and says which weights it measured."""

from __future__ import annotations

import pytest

from honing.config import load_config
from honing.engine import SamplingParams, TransformersEngine
from honing.eval import evaluate
from honing.models import load_policy
from honing.schedule.loop import build_tasks, train
from honing.schedule.rollout_side import eos_ids_of

OVERRIDES = ["model.bf16_autocast=true", "generation.weights=bf16", "train.steps=3", "sft.steps=0",
             "tasks.prompts_per_step=4", "eval.heldout_tasks=24", "generation.max_new_tokens=6",
             "train.learning_rate=3e-3"]


def run(tmp_path, *extra: str) -> tuple:
    cfg, _ = load_config("smoke", OVERRIDES + list(extra))
    return cfg, train(cfg, tmp_path / "run", show_progress=False)


def test_heldout_is_the_exported_checkpoint_decoded_in_full_precision(tmp_path) -> None:
    cfg, s = run(tmp_path)
    assert s["heldout_weights"] == "exported weights (float32, hf engine)"
    assert s["heldout_before"]["weights"] == s["heldout_after"]["weights"] == s["heldout_weights"]
    # `honing eval`'s view: the final checkpoint loaded from disk, decoded by an fp32 engine
    model, tok = load_policy(s["final_checkpoint"])
    engine = TransformersEngine(model, eos_ids_of(tok), tok.pad_token_id)
    g = cfg.generation
    params = SamplingParams(g.max_new_tokens, cfg.eval.temperature, g.top_p, g.top_k, cfg.eval.samples_per_task)
    setup = build_tasks(cfg)
    res = evaluate(engine, tok, setup.heldout, params, setup.ctx, seed=cfg.seed + 7)
    assert res["pass@1"] == s["heldout_after"]["pass@1"] and res["mean_reward"] == s["heldout_after"]["mean_reward"]
    assert [e["completion"] for e in res["examples"]] == [e["completion"] for e in s["examples_after"]]


def test_engine_weights_are_named_when_chosen(tmp_path) -> None:
    _, s = run(tmp_path, "eval.weights=engine")
    assert s["heldout_weights"] == "engine copy (hf bfloat16 copy)"


@pytest.mark.parametrize("choice", ["export", "engine"])
def test_eval_engine_decodes_the_trainer_module_or_the_engine_copy(tmp_path, choice: str) -> None:
    from honing.schedule.loop import Run

    cfg, _ = load_config("smoke", OVERRIDES + [f"eval.weights={choice}"])
    r = Run(cfg, tmp_path / "run", False, False, None)
    try:
        assert r.engine.weights_dtype is not None  # generation decodes from its own bf16 copy
        engine, which = r.eval_engine()
        if choice == "engine":
            assert engine is r.engine and which.startswith("engine copy")
        else:
            assert engine is not r.engine and engine.source is r.model and engine.model is r.model
            assert engine.weights_dtype is None and not engine.bf16_autocast
            assert r.eval_engine()[0] is engine  # built once
    finally:
        r.state.close()


def test_unknown_eval_weights_is_a_clear_error() -> None:
    from honing.errors import HoningError

    with pytest.raises(HoningError, match="eval.weights"):
        load_config("smoke", ["eval.weights=fp8"])


def test_model_device_cuda_without_a_gpu_is_a_config_error(tmp_path) -> None:
    import torch

    from honing.errors import ConfigError
    from honing.schedule.loop import policy_device

    assert policy_device("cpu") == torch.device("cpu")
    assert policy_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="model.device=cuda"):
            policy_device("cuda")
