"""Training: pure loss/advantage functions, the policy trainer, SFT warm start."""

from honing.train.losses import grpo_advantages, kl_k3, ppo_clip_loss, token_mean
from honing.train.trainer import PolicyTrainer

__all__ = ["PolicyTrainer", "grpo_advantages", "kl_k3", "ppo_clip_loss", "token_mean"]
