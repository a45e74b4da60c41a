"""A chat model behind an OpenAI-compatible HTTP endpoint (`POST {base}/v1/chat/completions`).

Works with OpenAI, vLLM's and llama.cpp's servers, and any gateway speaking the same JSON.
Retries with exponential backoff on 429, 5xx and connection errors; other 4xx fail at once.
A read/write timeout is not retried (the caller's time budget is already spent) and raises
`ChatTimeout`. The API key is read from a named environment variable at call time and never
appears in a message, repr or log line.
"""

from __future__ import annotations

import os
import time
from typing import Any

from honing.errors import ConfigError

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 8.0


class ChatHTTPError(RuntimeError):
    """The endpoint failed (after retries where retrying makes sense); names URL and status."""


class ChatTimeout(ChatHTTPError):
    """The endpoint did not answer within `timeout_s`."""


def chat_url(base_url: str) -> str:
    """`http://h:p` or `http://h:p/v1` (with or without a trailing slash) -> the completions URL."""
    base = base_url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"chat endpoint URL must start with http:// or https://, got {base_url!r}")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class OpenAIChat:
    """`chat(messages, ...) -> str` over HTTP. Thread-safe (one pooled httpx client)."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - httpx ships with the `service`/`dev` extras
            raise ConfigError("OpenAI-compatible endpoints need httpx: pip install 'honing[service]'") from None
        if not model:
            raise ConfigError("OpenAIChat needs a model name")
        if timeout_s <= 0 or max_retries < 0:
            raise ConfigError(f"OpenAIChat: timeout_s must be > 0 and max_retries >= 0, got {timeout_s}, {max_retries}")
        self.url = chat_url(base_url)
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.max_retries, self.backoff_s = float(timeout_s), int(max_retries), float(backoff_s)
        self._httpx = httpx
        self._client = httpx.Client(timeout=self.timeout_s)

    def __repr__(self) -> str:  # never the key itself
        return f"OpenAIChat(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _scrub(self, text: str) -> str:
        key = os.environ.get(self.api_key_env, "")
        return text.replace(key, "***") if key else text

    def _fail(self, msg: str) -> ChatHTTPError:
        return ChatHTTPError(self._scrub(f"{self.url}: {msg}"))

    def chat(self, messages: list[dict], max_new_tokens: int = 256, temperature: float = 0.0,
             seed: int | None = None) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                                "max_tokens": int(max_new_tokens), "temperature": float(temperature)}
        if seed is not None:
            body["seed"] = int(seed)
        last, retry_after = "no attempt made", None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self._delay(attempt, retry_after))
            retry_after = None
            try:
                r = self._client.post(self.url, json=body, headers=self._headers())
            except self._httpx.TimeoutException as e:
                if isinstance(e, self._httpx.ConnectTimeout):
                    last = f"connect timeout ({type(e).__name__})"
                    continue
                raise ChatTimeout(self._scrub(f"{self.url}: no answer within {self.timeout_s:g}s")) from None
            except self._httpx.TransportError as e:  # refused, reset, DNS: worth another try
                last = f"connection error ({type(e).__name__}: {e})"
                continue
            if r.status_code in RETRY_STATUSES or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                retry_after = r.headers.get("retry-after")
                continue
            if r.status_code >= 400:
                hint = f" (is ${self.api_key_env} set and valid?)" if r.status_code in (401, 403) else ""
                raise self._fail(f"HTTP {r.status_code}{hint}: {r.text[:200]}")
            return self._content(r)
        raise self._fail(f"gave up after {self.max_retries + 1} attempts; last: {last}")

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Exponential backoff; a numeric Retry-After (429/503) is honoured up to MAX_BACKOFF_S."""
        delay = self.backoff_s * 2 ** (attempt - 1)
        if retry_after is not None:
            try:
                delay = max(delay, float(retry_after))
            except ValueError:
                pass
        return min(delay, MAX_BACKOFF_S)

    def _content(self, r: Any) -> str:
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._fail(f"unexpected response (HTTP {r.status_code}): {r.text[:200]}") from None
        if not isinstance(content, str):
            raise self._fail(f"response has no text content: {r.text[:200]}")
        return content
