"""Chat-level models: messages in, text out.

The policy is driven through the token-level `Engine` (token ids and log-probs, for training).
Graders such as the LLM judge only need a reply, from a local model or an HTTP endpoint, so
they use this smaller protocol. `make_chat(spec)` builds one from a spec string:

- ``openai:<model>@<base_url>`` (or ``openai:<model>`` with a `base_url` argument): an
  OpenAI-compatible endpoint; the key comes from the environment variable `api_key_env`.
- ``hf:<model spec>``: a local model loaded through `honing.models` (``hf:tiny-random``,
  a directory, a hub id), run by `TransformersEngine`; loaded once per process and spec.
- a name given to `register_chat` (how tests and user code inject their own ChatModel).
"""

from __future__ import annotations

import difflib
import threading
from typing import Any, Protocol, runtime_checkable

from honing.errors import ConfigError


@runtime_checkable
class ChatModel(Protocol):
    def chat(self, messages: list[dict], max_new_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None) -> str:
        """The assistant's reply to `messages` ({role, content} dicts) as text."""
        ...


class HFChat:
    """Any token-level Engine plus a tokenizer's chat template. Calls are serialised: the
    in-process engine shares one model and is not thread-safe."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("HFChat needs a tokenizer with a chat template")
        self.engine, self.tokenizer = engine, tokenizer
        self._lock = threading.Lock()

    def chat(self, messages: list[dict], max_new_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None) -> str:
        from honing.engine.types import SamplingParams

        ids = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        params = SamplingParams(max_new_tokens=int(max_new_tokens), temperature=float(temperature), n=1)
        with self._lock:
            [[sample]] = self.engine.generate([list(ids)], params, seed=seed)
        return self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)


_REGISTRY: dict[str, ChatModel] = {}
_HF_CACHE: dict[str, HFChat] = {}
_HF_LOCK = threading.Lock()
SCHEMES = ("openai:<model>@<base_url>", "hf:<model spec>")


def register_chat(name: str, model: ChatModel) -> ChatModel:
    """Make `model` available to `make_chat(name)` (and so to judge specs) in this process."""
    if not name or ":" in name:
        raise ConfigError(f"chat model name must be non-empty and contain no ':', got {name!r}")
    if not callable(getattr(model, "chat", None)):
        raise ConfigError(f"register_chat({name!r}): object has no chat(messages, ...) method")
    _REGISTRY[name] = model
    return model


def unregister_chat(name: str) -> None:
    _REGISTRY.pop(name, None)


def _hf_chat(spec: str) -> HFChat:
    with _HF_LOCK:  # load each local model once per process
        if spec not in _HF_CACHE:
            from honing.engine.hf import TransformersEngine
            from honing.models import load_policy

            model, tok = load_policy(spec)
            eos = [i for i in (tok.eos_token_id, model.generation_config.eos_token_id) if isinstance(i, int)]
            _HF_CACHE[spec] = HFChat(TransformersEngine(model, eos_ids=eos, pad_id=tok.pad_token_id), tok)
        return _HF_CACHE[spec]


def parse_openai_spec(spec: str, base_url: str | None = None) -> tuple[str, str]:
    """``openai:<model>[@<base_url>]`` -> (model, base_url); `base_url` fills a missing URL."""
    rest = spec[len("openai:"):]
    model, sep, url = rest.partition("@")
    url = url if sep else (base_url or "")
    if not model.strip():
        raise ConfigError(f"chat spec {spec!r}: missing model name (expected {SCHEMES[0]})")
    if not url.strip():
        raise ConfigError(f"chat spec {spec!r}: no base URL; write {SCHEMES[0]} or set one in the environment")
    return model.strip(), url.strip()


def make_chat(spec: str | ChatModel, *, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
              timeout_s: float = 60.0, max_retries: int = 3) -> ChatModel:
    """A ChatModel from a spec (see the module docstring); a ChatModel object passes through."""
    if not isinstance(spec, str):
        if callable(getattr(spec, "chat", None)):
            return spec
        raise ConfigError(f"chat model must be a spec string or have a chat() method, got {type(spec).__name__}")
    spec = spec.strip()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if spec.startswith("openai:"):
        from honing.engine.openai import OpenAIChat

        model, url = parse_openai_spec(spec, base_url)
        return OpenAIChat(url, model, api_key_env=api_key_env, timeout_s=timeout_s, max_retries=max_retries)
    if spec.startswith("hf:"):
        if not spec[3:].strip():
            raise ConfigError(f"chat spec {spec!r}: missing model spec after 'hf:'")
        return _hf_chat(spec[3:].strip())
    from honing import plugins

    if plugins.is_reference(spec):  # a user ChatModel (or a class / factory of one) named by reference
        obj = plugins.resolve(spec, plugins.base())
        obj = obj() if (isinstance(obj, type) or not callable(getattr(obj, "chat", None))) and callable(obj) else obj
        if not callable(getattr(obj, "chat", None)):
            raise ConfigError(f"chat model {spec!r} resolves to a {type(obj).__name__} without a chat() method")
        _REGISTRY[spec] = obj
        return obj
    close = difflib.get_close_matches(spec, list(_REGISTRY), n=3, cutoff=0.5)
    known = ", ".join([*SCHEMES, *sorted(_REGISTRY)])
    raise ConfigError(f"unknown chat model {spec!r}" + (f"; closest: {', '.join(close)}" if close else "")
                      + f"; expected one of: {known}")
