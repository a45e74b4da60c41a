"""The policy trainer: GRPO/PPO-clip updates on a batch of trajectories, full or LoRA.

One `step` = one optimizer step over the whole batch, accumulated over micro-batches. The
loss is divided by the token count of the whole batch, so accumulation equals one big batch.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Sequence

import torch
from transformers import PreTrainedModel

from honing.config import LoraConfig, TrainConfig
from honing.engine.hf import autocast_ctx, bf16_supported
from honing.rollout.types import Trajectory
from honing.train.logprobs import completion_logprobs
from honing.train.losses import kl_k3, ppo_clip_loss, token_mean


def apply_lora(model: PreTrainedModel, lora: LoraConfig) -> PreTrainedModel:
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in present]
    if not targets:
        from honing.errors import ConfigError

        raise ConfigError(f"model.lora.target_modules: none of {lora.target_modules} exist in the model")
    cfg = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                         task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def padded(rows: Sequence[Sequence[float]], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out.to(device)


class PolicyTrainer:
    def __init__(self, model: PreTrainedModel, pad_id: int, cfg: TrainConfig, lora: LoraConfig,
                 bf16_autocast: bool, temperature: float) -> None:
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature
        self.lora = lora.enabled
        # The reference is the initial policy. With LoRA it is the base model with adapters off,
        # so it costs no memory; with full fine-tuning a frozen copy, only when kl_coef > 0.
        self.ref: PreTrainedModel | None = None
        if cfg.kl_coef > 0 and not self.lora:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = apply_lora(model, lora) if self.lora else model
        self.autocast = bf16_autocast and bf16_supported(self.model.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warm = cfg.warmup_steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        self.step_count = 0

    def _ref_logprobs(self, prompts: list, comps: list) -> torch.Tensor:
        with torch.no_grad(), autocast_ctx(self.autocast, self.model.device):
            if self.lora:
                with self.model.disable_adapter():
                    return completion_logprobs(self.model, prompts, comps, self.pad_id, self.temperature)[0]
            assert self.ref is not None
            return completion_logprobs(self.ref, prompts, comps, self.pad_id, self.temperature)[0]

    def step(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """One optimizer step on `trajs` (advantages already set). Returns metrics."""
        t0 = time.perf_counter()
        cfg = self.cfg
        total_tokens = float(sum(sum(t.loss_mask) for t in trajs))
        # With no KL term a zero-advantage sequence has zero gradient: skip its compute
        # (it still counts in the token-mean denominator, so the update is unchanged).
        active = [t for t in trajs if t.advantage != 0.0 or cfg.kl_coef > 0]
        self.model.train()
        sums = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "mismatch_abs": 0.0, "mismatch_max_ratio": 1.0}
        tokens_seen = 0.0
        for i in range(0, len(active), cfg.micro_batch_size):
            micro = active[i:i + cfg.micro_batch_size]
            prompts = [t.prompt_ids for t in micro]
            comps = [t.completion_ids for t in micro]
            with autocast_ctx(self.autocast, self.model.device):
                logp, cmask = completion_logprobs(self.model, prompts, comps, self.pad_id, self.temperature)
            width = cmask.shape[1]
            cmask = cmask * padded([t.loss_mask for t in micro], width, cmask.device)
            old = padded([t.logprobs for t in micro], width, cmask.device)
            adv = torch.tensor([t.advantage for t in micro], dtype=torch.float32, device=cmask.device)
            per_tok, clipped = ppo_clip_loss(logp, old, adv, cfg.clip_eps_low, cfg.clip_eps_high)
            if cfg.kl_coef > 0:
                kl = kl_k3(logp, self._ref_logprobs(prompts, comps))
                per_tok = per_tok + cfg.kl_coef * kl
                sums["kl"] += float((kl.detach() * cmask).sum())
            loss = token_mean(per_tok, cmask, total_tokens)
            loss.backward()
            n_tok = float(cmask.sum())
            tokens_seen += n_tok
            diff = (logp.detach() - old) * cmask
            sums["loss"] += float(loss.detach())
            sums["clip_frac"] += float((clipped * cmask).sum())
            sums["mismatch_abs"] += float(diff.abs().sum())
            if n_tok:
                sums["mismatch_max_ratio"] = max(sums["mismatch_max_ratio"], float(torch.exp(diff.abs()).max()))
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)) if active else 0.0
        lr = self.sched.get_last_lr()[0]
        if active:
            self.opt.step()
        with warnings.catch_warnings():  # an all-zero-advantage batch skips opt.step(); the schedule still advances
            warnings.simplefilter("ignore", UserWarning)
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_count += 1
        denom = max(tokens_seen, 1.0)
        return {
            "loss": sums["loss"],
            "grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
            "lr": lr,
            "clip_frac": sums["clip_frac"] / denom,
            "kl": sums["kl"] / denom,
            "logprob_mismatch": sums["mismatch_abs"] / denom,
            "mismatch_max_ratio": sums["mismatch_max_ratio"],
            "active_seqs": float(len(active)),
            "tokens": total_tokens,
            "update_s": time.perf_counter() - t0,
        }

    def state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(), "step": self.step_count}

    def export_model(self) -> PreTrainedModel:
        """A plain transformers model with the current weights (LoRA merged into a copy)."""
        if not self.lora:
            return self.model
        return copy.deepcopy(self.model).merge_and_unload()
