"""Task sampling across sources by mixing weight, streamed, never overlapping held-out tasks."""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from honing.errors import ConfigError
from honing.tasks.gym import TRAIN_SEED_SPAN
from honing.tasks.types import Task, TaskSource


def heldout_tasks(sources: Sequence[TaskSource], count: int, seed: int) -> list[Task]:
    """`count` held-out tasks spread evenly over the sources (round-robin)."""
    its = [s.tasks("heldout", seed) for s in sources]
    out: list[Task] = []
    live = list(range(len(its)))
    while len(out) < count and live:
        for i in list(live):
            if len(out) >= count:
                break
            try:
                out.append(next(its[i]))
            except StopIteration:
                live.remove(i)
    return out


def check_seed_ranges(train_seed: int, heldout_seed: int) -> None:
    """Procedural held-out tasks must come from seeds training never uses."""
    if train_seed <= heldout_seed < train_seed + TRAIN_SEED_SPAN or \
            heldout_seed <= train_seed < heldout_seed + TRAIN_SEED_SPAN:
        raise ConfigError(f"tasks.heldout_seed={heldout_seed} overlaps the training seed range "
                          f"[{train_seed}, {train_seed + TRAIN_SEED_SPAN}); pick seeds at least "
                          f"{TRAIN_SEED_SPAN} apart")


class TaskSampler:
    """Draws training tasks: a source by weight, then that source's next task. Tasks whose
    question equals a held-out question are skipped (small domains repeat questions)."""

    def __init__(self, sources: Sequence[TaskSource], weights: Sequence[float], seed: int,
                 exclude_questions: set[str] = frozenset()) -> None:
        self.sources = list(sources)
        self.weights = list(weights)
        self.rng = random.Random(seed)
        self.iters: list[Iterator[Task]] = [s.tasks("train", seed) for s in sources]
        self.exclude = set(exclude_questions)
        self.skipped = 0

    def next(self, count: int) -> list[Task]:
        out = []
        while len(out) < count:
            i = self.rng.choices(range(len(self.sources)), weights=self.weights)[0]
            try:
                task = next(self.iters[i])
            except StopIteration:
                raise ConfigError(f"task source {self.sources[i].domain} ran out of training tasks") from None
            if task.question in self.exclude:
                self.skipped += 1
                continue
            out.append(task)
        return out
