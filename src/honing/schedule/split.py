"""Splitting one rollout batch into several requests (chunks of its tasks) and merging their results
back, so a worker pool can spread a batch over many workers (`schedule.ray.tasks_per_request`).

The result depends on the chunk size only: chunk i is rolled out with `part_seed(batch seed, i)`,
whichever worker runs it."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any, Sequence

from honing.errors import HoningError



def part_seed(seed: int, part: int) -> int:
    """The seed of chunk `part` of a batch with seed `seed` (chunk 0 keeps the batch's seed)."""
    if part == 0:
        return seed
    return int(hashlib.sha256(f"{seed}/part/{part}".encode()).hexdigest()[:8], 16)


class RolloutSplit:
    """Splits a rollout payload (`{"tasks": [...], ...}`) into chunks of `tasks_per_request` tasks
    and merges their `RolloutBatch` results back (task indices, dropped indices, summed counters)."""

    def __init__(self, tasks_per_request: int) -> None:
        if tasks_per_request < 1:
            raise HoningError(f"tasks_per_request must be >= 1, got {tasks_per_request}")
        self.n = tasks_per_request

    def split(self, payload: dict, seed: int) -> list[tuple[dict, int]]:
        tasks = payload["tasks"]
        chunks = [tasks[i:i + self.n] for i in range(0, len(tasks), self.n)] or [tasks]
        return [({**payload, "tasks": c}, part_seed(seed, i)) for i, c in enumerate(chunks)]

    def merge(self, payloads: Sequence[dict], results: Sequence[Any]) -> Any:
        from honing.schedule.orchestrate import RolloutBatch

        trajs, dropped, errors = [], [], []
        stats: dict[str, float] = defaultdict(float)
        offset = 0
        for p, r in zip(payloads, results):
            for t in r.trajs:
                t.group += offset
                trajs.append(t)
            dropped += [d + offset for d in r.dropped]
            for k, v in r.stats.items():
                stats[k] += v
            errors += [e for e in r.errors if e not in errors]
            offset += len(p["tasks"])
        return RolloutBatch(trajs, dropped, dict(stats), errors[:3])
