"""GRPO math as small pure functions. Each is tested against a naive loop in tests/unit/test_losses.py.

Shapes: B sequences, T completion tokens. `mask[b, t] = 1` where token t of sequence b is a
model-generated token that carries loss.
"""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages (Shao et al. 2024, DeepSeekMath, "GRPO").

    rewards: [B] with B = groups * group_size, samples of one prompt contiguous.
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), std with Bessel's correction (as TRL).
    scale=False gives Dr. GRPO's centring only (Liu et al. 2025). A group whose rewards are all
    equal gets advantage 0: it carries no signal.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip objective, negated to a loss (Schulman et al. 2017; DAPO clip-higher,
    Yu et al. 2025, when clip_high > clip_low).

    ratio = exp(logp - old_logp);  loss_t = -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A).
    advantages: [B] (broadcast to tokens) or [B, T]. Returns (loss [B, T], clipped [B, T] as 0/1).
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref) (Schulman 2020, "Approximating KL divergence").

    With x = ref_logp - logp:  k3 = exp(x) - x - 1 >= 0, unbiased for samples from pi.
    """
    x = ref_logp - logp
    return torch.exp(x) - x - 1.0


def token_mean(values: torch.Tensor, mask: torch.Tensor, total_tokens: float | None = None) -> torch.Tensor:
    """Token-level aggregation (DAPO): sum over all loss tokens / number of loss tokens.

    `total_tokens` lets a micro-batch divide by the token count of the whole step's batch, so
    that gradient accumulation over micro-batches equals one big batch exactly.
    """
    denom = mask.sum() if total_tokens is None else torch.as_tensor(total_tokens, dtype=values.dtype)
    return (values * mask).sum() / denom.clamp(min=1)
