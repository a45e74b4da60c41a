"""Rollouts: the Trajectory type and the single-turn loop (multi-turn comes later).

The loop functions load lazily: grading code imports `Trajectory` without pulling in torch.
"""

from typing import Any

from honing.rollout.types import Trajectory

__all__ = ["Trajectory", "prompt_ids", "rollout"]


def __getattr__(name: str) -> Any:
    if name in ("prompt_ids", "rollout"):
        from honing.rollout import single

        return getattr(single, name)
    raise AttributeError(name)
