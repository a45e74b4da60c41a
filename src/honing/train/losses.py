"""Policy losses, KL estimators, loss aggregation and off-policy weights as small pure functions.
Each is tested against a naive loop in tests/unit/test_losses.py (advantages: advantages.py).

Shapes: B sequences, T completion tokens. `mask[b, t] = 1` where token t of sequence b is a
model-generated token that carries loss.
"""

from __future__ import annotations

import torch

from honing.train.advantages import grpo_advantages  # noqa: F401  (re-exported)


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


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_low: float = 3e-4, clip_high: float = 4e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): a sequence-level,
    length-normalised ratio clipped instead of per-token ratios.

    s_i = exp(mean_{t in mask} (logp_t - old_logp_t));
    loss_i = -min(s_i * A_i, clip(s_i, 1 - low, 1 + high) * A_i), broadcast to the sequence's tokens.
    Returns (loss [B, T], clipped [B, T] as 0/1). Aggregate with seq_mean_token_mean to get
    the paper's mean over sequences (token_mean weighs long sequences more).
    """
    adv = advantages if advantages.dim() == 1 else advantages[:, 0]
    n = mask.sum(-1).clamp(min=1)
    s = torch.exp(((logp - old_logp) * mask).sum(-1) / n)[:, None]
    a = adv[:, None]
    unclipped, clipped = s * a, torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    return loss.expand_as(logp), (clipped < unclipped).float().expand_as(logp)


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
               max_weight: float = 5.0, min_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax 2025, "MiniMax-M1"): clip the importance weight, not the update, and stop its
    gradient, so every token keeps a REINFORCE gradient.

    loss_t = -sg(clip(ratio_t, min_weight, max_weight)) * A * logp_t,  ratio_t = exp(logp_t - old_logp_t).
    (TRL's `loss_type="cispo"` uses `epsilon_high` as max_weight and no lower bound.)
    Returns (loss [B, T], clipped [B, T] as 0/1 where the weight was clipped).
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp).detach()
    w = torch.clamp(ratio, min_weight, max_weight)
    return -w * adv * logp, (w != ratio).float()


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 estimator of KL(pi || ref) (Schulman 2020): logp - ref_logp. Unbiased, high variance, can be < 0."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 estimator of KL(pi || ref) (Schulman 2020): 0.5 * (logp - ref_logp)^2 >= 0. Biased, low variance;
    its gradient is the gradient of the true KL (Liu et al. 2025, "On the design of KL-regularized PG")."""
    return 0.5 * (logp - ref_logp) ** 2


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str, n_tokens: float, n_seqs: float,
                   norm_tokens: float = 1.0) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar. The denominators are those of the whole batch
    the optimizer step covers, so micro-batch losses add up to the big-batch loss exactly.

    - token_mean (DAPO, Yu et al. 2025): sum_{i,t} l_{i,t} / n_tokens.
    - seq_mean_token_mean (original GRPO, Shao et al. 2024): sum_i (sum_t l_{i,t} / |o_i|) / n_seqs.
    - seq_sum_norm (Dr. GRPO, Liu et al. 2025): sum_{i,t} l_{i,t} / (n_seqs * norm_tokens), a constant
      normaliser (e.g. the generation budget) so that length does not rescale the gradient.
    """
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / max(n_tokens, 1.0)
    if mode == "seq_mean_token_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(n_seqs, 1.0)
    if mode == "seq_sum_norm":
        return masked.sum() / (max(n_seqs, 1.0) * norm_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def tis_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling, token level (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"): w_t = min(exp(old_logp_t - engine_logp_t), C).

    Corrects for the engine sampling from a slightly different distribution than the trainer's
    old policy (other kernels, precision, a stale engine). No gradient flows through it.
    """
    return torch.clamp(torch.exp(old_logp - engine_logp), max=cap).detach()


def sequence_ratio_mask(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                        low: float | None, high: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level masking of extreme trainer/engine ratios (as TRL's `sequence_mask` and
    verl's rollout rejection sampling), on the geometric-mean ratio

    rho_i = exp(mean_{t in mask} (old_logp_t - engine_logp_t)); keep_i = low <= rho_i <= high.
    Returns (keep [B, 1] as 0/1, rho [B]). A None bound is not applied.
    """
    n = mask.sum(-1).clamp(min=1)
    rho = torch.exp(((old_logp - engine_logp) * mask).sum(-1) / n)
    keep = torch.ones_like(rho, dtype=torch.bool)
    if low is not None:
        keep &= rho >= low
    if high is not None:
        keep &= rho <= high
    return keep.float()[:, None], rho
