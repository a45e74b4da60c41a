"""Training: pure loss/advantage functions, the policy trainer, SFT warm start."""

from honing.train.advantages import (check_train_config, compute_advantages, dr_grpo_advantages, grpo_advantages,
                                     reinforce_pp_advantages, rloo_advantages)
from honing.train.losses import (aggregate_loss, cispo_loss, gspo_loss, kl_k1, kl_k2, kl_k3, ppo_clip_loss,
                                 sequence_ratio_mask, tis_weights, token_mean)
from honing.train.trainer import PolicyTrainer

__all__ = ["PolicyTrainer", "aggregate_loss", "check_train_config", "cispo_loss", "compute_advantages",
           "dr_grpo_advantages", "grpo_advantages", "gspo_loss", "kl_k1", "kl_k2", "kl_k3", "ppo_clip_loss",
           "reinforce_pp_advantages", "rloo_advantages", "sequence_ratio_mask", "tis_weights", "token_mean"]


class _CallableModule(type(__import__("sys"))):
    """`honing.train` is this package once it is imported, and the API's `honing.train(...)`
    too: calling the package runs honing.api.train (the two names would otherwise collide)."""

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        from honing.api import train

        return train(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
