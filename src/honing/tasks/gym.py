"""reasoning-gym domains as a TaskSource: `gym:<dataset_name>` with the dataset's config."""

from __future__ import annotations

import dataclasses
import difflib
import json
from functools import lru_cache
from typing import Any, Iterator

from honing.errors import TaskError
from honing.tasks.types import Task, VerifierSpec

# Item i of a reasoning-gym dataset is generated from Random(seed + i). Training streams use
# seeds [train_seed, train_seed + TRAIN_SEED_SPAN); a held-out seed must lie outside that span.
TRAIN_SEED_SPAN = 1_000_000
HELDOUT_SEED_SPAN = 100_000
# Streams are generated in chunks: the dataset for stream items [o, o + CHUNK) is created with
# seed `seed + o` and size CHUNK (never the whole span: some datasets refuse or precompute a
# large `size`, e.g. word_ladder allows at most 20,000). For datasets whose item i comes from
# Random(seed + i) alone (all but acre, gsm_symbolic and list_functions in reasoning-gym 0.1.19)
# stream item o + j is then exactly item j of create_dataset(seed=seed + o); the others also draw
# from Random(chunk seed) (a per-chunk task list or question pool), so their items depend on the
# chunking but are still deterministic. Either way a chunk only uses seeds in
# [seed + o, seed + o + CHUNK), so train and held-out streams still use disjoint seed ranges.
CHUNK = 1000
# An item whose generation raises is skipped (word_ladder, for one, gives up on some seeds); the
# stream restarts the chunk after it. This many failures in a row is an error.
MAX_CONSECUTIVE_FAILURES = 50


def gym_dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_dataset(name: str, params: dict[str, Any]) -> None:
    """Fail early, naming the closest valid dataset or config key."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else f"; {len(DATASETS)} exist (honing tasks list)"
        raise TaskError(f"unknown reasoning-gym domain 'gym:{name}'{hint}")
    _, cfg_cls = DATASETS[name]
    valid = [f.name for f in dataclasses.fields(cfg_cls) if f.name not in ("seed", "size")]
    for key in params:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(valid)})"
            raise TaskError(f"gym:{name}: unknown parameter '{key}'{hint}")


@lru_cache(maxsize=64)
def _dataset(name: str, frozen: str, seed: int, size: int) -> Any:
    import reasoning_gym

    params = json.loads(frozen)
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **params)
    except (AssertionError, ValueError, TypeError) as e:
        raise TaskError(f"gym:{name}: invalid parameters {params}: {e}") from None


def gym_dataset(name: str, params: dict[str, Any], seed: int = 0, size: int = 1) -> Any:
    """A reasoning-gym dataset object (cached); verifiers use it for `score_answer`."""
    return _dataset(name, json.dumps(params, sort_keys=True), seed, size)


class GymSource:
    """Tasks from one reasoning-gym dataset, graded by its own scorer unless told otherwise."""

    def __init__(self, name: str, params: dict[str, Any] | None = None, verifier: str | None = None,
                 prompt_template: str = "{question}", system_prompt: str | None = None) -> None:
        self.name = name
        self.params = dict(params or {})
        check_dataset(name, self.params)
        self.domain = f"gym:{name}"
        self.verifier = verifier or "reasoning_gym"
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        gym_dataset(name, self.params, 0, 1)  # validates the values too

    def _task(self, entry: dict[str, Any], seed: int, idx: int, split: str) -> Task:
        question = self.prompt_template.replace("{question}", entry["question"])
        prompt = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        prompt.append({"role": "user", "content": question})
        meta = entry.get("metadata", {})
        diff = meta.get("difficulty")
        return Task(
            id=f"{self.domain}/{split}/{seed + idx}",
            domain=self.domain,
            prompt=tuple(prompt),
            verifier=VerifierSpec(self.verifier, {"dataset": self.name, "params": self.params}),
            hidden={"answer": entry["answer"], "entry": entry},
            difficulty=None if not isinstance(diff, (int, float)) else float(diff),
            metadata={"seed": seed + idx, "question": entry["question"]},
        )

    def _chunk(self, seed: int) -> Any:
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(self.name, seed=seed, size=CHUNK, **self.params)
        except Exception as e:  # noqa: BLE001 - any dataset's refusal is reported the same way
            raise TaskError(f"gym:{self.name}: cannot create the dataset (seed={seed}, size={CHUNK}, "
                            f"params {self.params}): {type(e).__name__}: {e}") from None

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        """Stream item idx (seed + idx) for idx in [0, span), generated lazily chunk by chunk."""
        span = TRAIN_SEED_SPAN if split == "train" else HELDOUT_SEED_SPAN
        idx, failures = 0, 0
        while idx < span:
            start, ds = idx, self._chunk(seed + idx)
            while idx < min(start + CHUNK, span):
                try:
                    entry = ds[idx - start]
                except Exception as e:  # noqa: BLE001 - skip the item; the dataset may be spent
                    failures += 1
                    if failures >= MAX_CONSECUTIVE_FAILURES:
                        raise TaskError(f"gym:{self.name}: {failures} items in a row failed to generate "
                                        f"(last at seed {seed + idx}): {type(e).__name__}: {e}") from None
                    idx += 1
                    break  # a fresh chunk from the next seed (word_ladder shrinks itself on failure)
                failures = 0
                yield self._task(entry, seed, idx, split)
                idx += 1
