"""Collect concurrent requests into one `engine.generate` call.

The engines are batch-shaped (prompts in, samples out) and not thread-safe, so one thread owns
the engine: it takes the first waiting request, waits up to `window_s` for more, and runs every
request that shares sampling settings (temperature, top-p, top-k, n) in one generate call with
the largest `max_new_tokens` among them; each request's samples are then cut to its own budget
(for a token-by-token sampler that is the same distribution as stopping there). A request with a
`seed` runs alone, so its output does not depend on what else was in the batch.

Streaming: the transformers engine calls `on_step` after each decode step; the batcher routes
each row's token to its request. Engines without the hook (vLLM) deliver all tokens at the end.
A job's future gets (samples, tag): the tag of the engine that made them (see `swap`).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from honing.engine.types import Sample, SamplingParams

TokenCallback = Callable[[int, int], None]  # (sample index, token id), from the batcher's thread


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    seed: int | None = None
    on_token: TokenCallback | None = None
    future: Future = field(default_factory=Future)

    def key(self) -> tuple:
        p = self.params
        return (p.temperature, p.top_p, p.top_k, p.n)


def cut(sample: Sample, max_new_tokens: int) -> Sample:
    """A sample stopped at `max_new_tokens` (finish reason 'length' if that cut it)."""
    if len(sample.token_ids) <= max_new_tokens:
        return sample
    return Sample(sample.token_ids[:max_new_tokens], sample.logprobs[:max_new_tokens], "length")


class Batcher:
    def __init__(self, engine: Any, eos_ids: Sequence[int], window_s: float = 0.01, max_rows: int | None = None,
                 on_batch: Callable[[int, int], None] | None = None, tag: Any = None) -> None:
        self.engine = engine
        self.tag = tag  # what the engine serves (a Served): each result says which one made it
        self.eos = set(int(i) for i in eos_ids)
        self.window_s = window_s
        self.max_rows = max_rows or int(getattr(engine, "max_batch_size", 32))
        self.on_batch = on_batch  # (requests, rows) of each generate call, for /metrics
        self._q: queue.Queue[Job] = queue.Queue()
        self._swap: tuple[Any, set[int], Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="honing-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future:
        if self._stop.is_set():
            raise RuntimeError("the server is shutting down")
        self._q.put(job)
        return job.future

    def swap(self, engine: Any, eos_ids: Sequence[int], tag: Any = None) -> None:
        """Use `engine` from the next batch on (the one in flight finishes on the old one)."""
        self._swap = (engine, set(int(i) for i in eos_ids), tag)
        self._q.put(Job([], SamplingParams(max_new_tokens=0)))  # wake the loop when idle

    def close(self) -> None:
        self._stop.set()
        self._q.put(Job([], SamplingParams(max_new_tokens=0)))
        self._thread.join(30)

    # --- the engine's thread ------------------------------------------------------------------
    def _take(self) -> list[Job]:
        first = self._q.get()
        jobs = [first]
        deadline = time.monotonic() + self.window_s
        rows = first.params.n
        while rows < self.max_rows:
            left = deadline - time.monotonic()
            try:
                job = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            jobs.append(job)
            rows += job.params.n
        return jobs

    def _loop(self) -> None:
        while not self._stop.is_set():
            jobs = [j for j in self._take() if j.params.max_new_tokens > 0]  # wake-ups carry no work
            if self._swap is not None:
                self.engine, self.eos, self.tag = self._swap
                self._swap = None
            for group in self._groups(jobs):
                self._run(group)
        while True:  # shutting down: fail what is still queued rather than leave callers hanging
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job.params.max_new_tokens > 0 and not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))

    def _groups(self, jobs: list[Job]) -> list[list[Job]]:
        groups: dict[tuple, list[list[Job]]] = {}
        out: list[list[Job]] = []
        for j in jobs:
            if j.seed is not None:
                out.append([j])
                continue
            bucket = groups.setdefault(j.key(), [[]])
            if bucket[-1] and (len(bucket[-1]) + 1) * j.params.n > self.max_rows:
                bucket.append([])  # one generate call must fit one engine chunk (streaming rows)
            bucket[-1].append(j)
        return [g for b in groups.values() for g in b] + out

    def _run(self, group: list[Job]) -> None:
        p = group[0].params
        n = p.n
        params = SamplingParams(max(j.params.max_new_tokens for j in group), p.temperature, p.top_p, p.top_k, n)
        streaming = any(j.on_token is not None for j in group)
        hook = hasattr(self.engine, "on_step")
        if streaming and hook:
            self.engine.on_step = self._router(group, n)
        try:
            out = self.engine.generate([j.prompt for j in group], params, seed=group[0].seed)
        except Exception as e:  # noqa: BLE001 - a failed batch fails its requests, not the server
            for j in group:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        finally:
            if hook:
                self.engine.on_step = None
        if self.on_batch is not None:
            self.on_batch(len(group), len(group) * n)
        for j, samples in zip(group, out):
            samples = [cut(s, j.params.max_new_tokens) for s in samples]
            if j.on_token is not None and not hook:  # no per-step hook: the tokens now, in order
                for i, s in enumerate(samples):
                    for t in s.token_ids:
                        j.on_token(i, t)
            j.future.set_result((samples, self.tag))

    def _router(self, group: list[Job], n: int) -> Callable[[Any], None]:
        """The engine's per-step hook: row r is sample r % n of request r // n."""
        counts = [0] * (len(group) * n)
        finished = [False] * (len(group) * n)

        def on_step(tokens: Any) -> None:
            for r, t in enumerate(tokens.tolist()):
                if finished[r]:
                    continue
                job = group[r // n]
                if counts[r] >= job.params.max_new_tokens:
                    finished[r] = True
                    continue
                counts[r] += 1
                if t in self.eos:
                    finished[r] = True
                if job.on_token is not None:
                    job.on_token(r % n, int(t))

        return on_step
