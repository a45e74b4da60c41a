"""Counters behind `/metrics`: requests, tokens, tokens/s, latency percentiles, batch sizes.

`/metrics` answers JSON, or the Prometheus text exposition format (version 0.0.4) to a scraper:
`?format=prometheus`, or an `Accept` header that asks for `text/plain` or OpenMetrics text
(what Prometheus sends) and not JSON. Names follow Prometheus' conventions: `honing_` prefix,
`_total` counters, seconds, a summary for request latency."""

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
        self.latency_sum = 0.0  # over every successful request (the Prometheus summary's _sum)
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=keep)  # (end time, latency, tokens)

    def observe(self, status: int, latency_s: float, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        with self._lock:
            self.requests += 1
            self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            if status == 200:
                self.latency_sum += latency_s
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
                "latency_s": {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "n": len(lat),
                              "sum": round(self.latency_sum, 6), "count": self.by_status.get("200", 0)},
                "batches": self.batches,
                "batched_requests": self.batched_requests,
                "mean_batch_requests": round(self.batched_requests / self.batches, 3) if self.batches else None,
                "max_batch_requests": self.max_batch,
            }


def wants_prometheus(fmt: str | None, accept: str | None) -> bool:
    """Whether a `/metrics` request asks for the Prometheus text format (`?format=prometheus`, or an
    Accept header naming text/plain or OpenMetrics text without JSON). ValueError for another format."""
    if fmt is not None:
        if fmt.lower() not in ("json", "prometheus"):
            raise ValueError(f"/metrics?format={fmt}: one of json, prometheus")
        return fmt.lower() == "prometheus"
    a = (accept or "").lower()
    return "json" not in a and ("text/plain" in a or "openmetrics-text" in a)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float | int | None) -> str:
    return "NaN" if v is None else repr(float(v))


def prometheus_text(snap: dict[str, Any], model: str) -> str:
    """`snapshot()` in the Prometheus text exposition format; every sample carries the model label."""
    m = f'model="{_escape(model)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float | int | None]]) -> None:
        out.extend([f"# HELP honing_{name} {help_}", f"# TYPE honing_{name} {kind}"])
        for suffix_labels, value in samples:
            out.append(f"honing_{suffix_labels} {_num(value)}")

    metric("requests_total", "counter", "Requests answered, by HTTP status.",
           [(f'requests_total{{{m},status="{_escape(k)}"}}', v) for k, v in sorted(snap["requests_by_status"].items())]
           or [(f'requests_total{{{m},status="200"}}', 0)])
    metric("prompt_tokens_total", "counter", "Prompt tokens of answered requests.",
           [(f"prompt_tokens_total{{{m}}}", snap["prompt_tokens"])])
    metric("completion_tokens_total", "counter", "Completion tokens generated.",
           [(f"completion_tokens_total{{{m}}}", snap["completion_tokens"])])
    metric("tokens_per_second", "gauge", "Completion tokens per second over the last 60 s.",
           [(f"tokens_per_second{{{m}}}", snap["tokens_per_s_last_60s"])])
    lat = snap["latency_s"]
    metric("request_latency_seconds", "summary", "Latency of successful requests (quantiles over recent ones).",
           [(f'request_latency_seconds{{{m},quantile="0.5"}}', lat["p50"]),
            (f'request_latency_seconds{{{m},quantile="0.99"}}', lat["p99"]),
            (f"request_latency_seconds_sum{{{m}}}", lat["sum"]),
            (f"request_latency_seconds_count{{{m}}}", lat["count"])])
    metric("batches_total", "counter", "Generate calls made by the batcher.", [(f"batches_total{{{m}}}", snap["batches"])])
    metric("batched_requests_total", "counter", "Requests decoded in those generate calls.",
           [(f"batched_requests_total{{{m}}}", snap["batched_requests"])])
    metric("max_batch_requests", "gauge", "Most requests decoded in one generate call.",
           [(f"max_batch_requests{{{m}}}", snap["max_batch_requests"])])
    metric("uptime_seconds", "gauge", "Seconds since the server started.", [(f"uptime_seconds{{{m}}}", snap["uptime_s"])])
    return "\n".join(out) + "\n"
