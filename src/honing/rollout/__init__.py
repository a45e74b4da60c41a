"""Rollouts: the Trajectory type and the single-turn loop (multi-turn comes later)."""

from honing.rollout.single import prompt_ids, rollout
from honing.rollout.types import Trajectory

__all__ = ["Trajectory", "prompt_ids", "rollout"]
