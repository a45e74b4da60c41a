"""Training: pure loss/advantage functions, the policy trainer, SFT warm start."""

from honing.train.advantages import (check_train_config, compute_advantages, dr_grpo_advantages, grpo_advantages,
                                     reinforce_pp_advantages, rloo_advantages)
from honing.train.losses import (aggregate_loss, cispo_loss, gspo_loss, kl_k1, kl_k2, kl_k3, ppo_clip_loss,
                                 sequence_ratio_mask, tis_weights, token_mean)
from honing.train.trainer import PolicyTrainer

__all__ = ["PolicyTrainer", "aggregate_loss", "check_train_config", "cispo_loss", "compute_advantages",
           "dr_grpo_advantages", "grpo_advantages", "gspo_loss", "kl_k1", "kl_k2", "kl_k3", "ppo_clip_loss",
           "reinforce_pp_advantages", "rloo_advantages", "sequence_ratio_mask", "tis_weights", "token_mean"]
