"""Rollouts: the Trajectory type, the single-turn loop, the multi-turn agent loop
(honing.rollout.multiturn), and `rollout_tasks` for batches that mix both.

The loop functions load lazily: grading code imports `Trajectory` without pulling in torch.
"""

from typing import Any

from honing.rollout.types import Trajectory

__all__ = ["Trajectory", "prompt_ids", "rollout", "rollout_tasks"]


def __getattr__(name: str) -> Any:
    if name in ("prompt_ids", "rollout"):
        from honing.rollout import single

        return getattr(single, name)
    if name == "rollout_tasks":
        from honing.rollout.mixed import rollout_tasks

        return rollout_tasks
    raise AttributeError(name)
