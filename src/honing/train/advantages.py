"""Advantage estimators as small pure functions, and the config-driven dispatcher.

rewards: [B] with B = groups * group_size, the samples of one prompt contiguous. Each
estimator returns one advantage per sequence ([B]); `broadcast_to_tokens` gives every loss
token of a sequence its sequence's advantage. Each is tested against a naive loop in
tests/unit/test_losses.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from honing.config import TrainConfig

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages (Shao et al. 2024, DeepSeekMath, "GRPO").

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), std with Bessel's correction (as TRL).
    scale=False gives Dr. GRPO's centring only (Liu et al. 2025). A group whose rewards are all
    equal gets advantage 0: it carries no signal.
    """
    r = _groups(rewards, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def dr_grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r_group).

    No division by the group std (it up-weights too easy / too hard prompts). The other half of
    Dr. GRPO, no per-sequence length normalisation, is `loss_aggregation: seq_sum_norm`.
    """
    return grpo_advantages(rewards, group_size, scale=False)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - (1 / (G - 1)) * sum_{j != i} r_j  =  G / (G - 1) * (r_i - mean(r_group)).
    Needs G >= 2 (with one sample there is nothing to leave out).
    """
    if group_size < 2:
        raise ValueError("RLOO needs at least 2 samples per prompt")
    r = _groups(rewards, group_size)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).reshape(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, "REINFORCE++: a simple and efficient approach for aligning LLMs").

    Global batch normalisation instead of a per-prompt baseline:
    A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps), std with Bessel's correction. Works
    with one sample per prompt. (The paper's token-level KL-in-reward is `kl_in_reward`.)
    """
    r = rewards.float().reshape(-1)
    centred = r - r.mean()
    if r.numel() > 1:
        centred = centred / (r.std() + eps)
    return centred


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantages [B, T]: A_{i,t} = A_i on loss tokens, 0 elsewhere (outcome reward,
    no discounting, as GRPO/RLOO/REINFORCE++ with gamma = 1)."""
    return advantages.float()[:, None] * mask


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), added to the reward.

    0 for L <= max_len - cache_len; (max_len - cache_len - L) / cache_len inside the cache
    window (linear from 0 down to -1); -1 beyond max_len.
    """
    L = lengths.float()
    start = max_len - cache_len
    pen = (start - L) / max(cache_len, 1)
    return torch.where(L <= start, torch.zeros_like(L), torch.where(L <= max_len, pen, -torch.ones_like(L)))


def compute_advantages(rewards: torch.Tensor, group_size: int, cfg: "TrainConfig") -> torch.Tensor:
    """Advantages by `train.advantage_estimator` (the loop's one entry point)."""
    est = cfg.advantage_estimator
    if est == "grpo":
        return grpo_advantages(rewards, group_size, scale=cfg.scale_rewards)
    if est == "dr_grpo":
        return dr_grpo_advantages(rewards, group_size)
    if est == "rloo":
        return rloo_advantages(rewards, group_size)
    if est == "reinforce_pp":
        return reinforce_pp_advantages(rewards)
    return user_advantages(est, rewards, group_size)


def user_advantages(ref: str, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A user estimator `fn(rewards, group_size)`: a float tensor of the rewards' shape, all finite."""
    from honing import plugins

    fn = plugins.resolve(ref, plugins.base())
    out = fn(rewards, group_size)
    if not isinstance(out, torch.Tensor) or out.shape != rewards.shape or not torch.isfinite(out).all():
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"advantage estimator '{ref}' returned {shape} (need a finite float tensor of shape "
                         f"{tuple(rewards.shape)})")
    return out.float()


def check_train_config(cfg: "TrainConfig", samples_per_prompt: int) -> None:
    """Start-up cross-checks between `train` and `tasks` (raises ConfigError saying why)."""
    from honing.errors import ConfigError

    if cfg.advantage_estimator not in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):  # a user estimator: try it now
        probe = torch.tensor([0.0, 1.0] * max(samples_per_prompt, 1))[: 2 * samples_per_prompt]
        try:
            user_advantages(cfg.advantage_estimator, probe, samples_per_prompt)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's function or its import failed: say which and how
            raise ConfigError(f"train.advantage_estimator: {e}") from None
    if cfg.advantage_estimator in GROUP_ESTIMATORS and samples_per_prompt < 2:
        raise ConfigError(f"train.advantage_estimator={cfg.advantage_estimator!r} compares samples of one prompt, "
                          f"but tasks.samples_per_prompt={samples_per_prompt}: every advantage would be 0. Use "
                          "tasks.samples_per_prompt >= 2 or train.advantage_estimator='reinforce_pp'")
