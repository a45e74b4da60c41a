"""Counters behind `/metrics`: requests, tokens, tokens/s, latency percentiles, batch sizes."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

WINDOW_S = 60.0  # tokens/s over the last minute (and over the server's life)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


class Metrics:
    def __init__(self, keep: int = 10000) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests = 0
        self.by_status: dict[str, int] = {}
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.batches = 0
        self.batched_requests = 0
        self.max_batch = 0
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=keep)  # (end time, latency, tokens)

    def observe(self, status: int, latency_s: float, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        with self._lock:
            self.requests += 1
            self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            if status == 200:
                self._recent.append((time.time(), latency_s, completion_tokens))

    def batch(self, requests: int, rows: int) -> None:
        with self._lock:
            self.batches += 1
            self.batched_requests += requests
            self.max_batch = max(self.max_batch, requests)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            uptime = max(now - self.started, 1e-9)
            recent = [r for r in self._recent if r[0] >= now - WINDOW_S]
            lat = [r[1] for r in self._recent]
            window = min(WINDOW_S, uptime)
            return {
                "uptime_s": round(uptime, 3),
                "requests": self.requests,
                "requests_by_status": dict(self.by_status),
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "tokens_per_s": round(self.completion_tokens / uptime, 3),
                "tokens_per_s_last_60s": round(sum(r[2] for r in recent) / window, 3),
                "latency_s": {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "n": len(lat)},
                "batches": self.batches,
                "mean_batch_requests": round(self.batched_requests / self.batches, 3) if self.batches else None,
                "max_batch_requests": self.max_batch,
            }
