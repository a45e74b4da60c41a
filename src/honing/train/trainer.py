"""The policy trainer: GRPO-family updates on a batch of trajectories, full or LoRA.

One `step` reads top to bottom:

    forward-only pass (old / reference log-probs, once) -> KL in reward? -> off-policy weights
    -> for each epoch, for each mini-batch: micro-batches (forward, loss, backward) -> optimizer step

Losses are divided by the token / sequence counts of the whole mini-batch, so accumulation over
micro-batches equals one big batch. The algorithms themselves live in losses.py / advantages.py.
"""

from __future__ import annotations

import copy
import math
import random
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from honing.config import LoraConfig, TrainConfig
from honing.engine.hf import autocast_ctx, bf16_supported
from honing.rollout.types import Trajectory
from honing.train import memory
from honing.train.advantages import compute_advantages
from honing.train.distributed import PREFIX, Sharded, all_gather_objects, all_reduce_floats, broadcast_object, \
    full_optimizer_state, load_full_optimizer_state, max_int, optimizer_state_by_index, optimizer_state_by_name, \
    pad_micro_batches
from honing.train.logprobs import (
    completion_logprobs,
    shared_prompt_logprobs,
    shared_prompt_rows,
    shared_prompt_supported,
    token_budget_batches,
)
from honing.train.losses import (KL_ESTIMATORS, aggregate_loss, cispo_loss, gspo_loss, ppo_clip_loss,
                                 sequence_ratio_mask, tis_weights)


def apply_lora(model: PreTrainedModel, lora: LoraConfig) -> PreTrainedModel:
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    missing = [t for t in lora.target_modules if t not in linear]
    if missing:
        from honing.errors import ConfigError

        raise ConfigError(f"model.lora.target_modules: {missing} do not exist in the model; "
                          f"its linear modules are: {linear}")
    cfg = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                         target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft reads the deprecated property; transformers 5 warns on every LoRA run
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, cfg)


def adamw(params: list[torch.nn.Parameter], **kw: Any) -> torch.optim.AdamW:
    """AdamW with the fused kernel where the parameters allow it (one pass over all of them:
    42 ms a step for SmolLM2-135M on 2 cores, against 300-670 ms for the default foreach path)."""
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **kw)


def padded(rows: Sequence[Sequence[float] | torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        r = r if isinstance(r, torch.Tensor) else torch.tensor(list(r), dtype=torch.float32)
        out[i, :len(r)] = r
    return out.to(device)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """GPU: torch.cuda.max_memory_allocated since the step began. CPU: the process's peak RSS
    since the step began (Linux; elsewhere since the process started) and its RSS now."""
    out = {"peak_rss_mb": memory.peak_rss_mb()}
    if (now := memory.rss_mb()) is not None:
        out["rss_after_mb"] = now
    if device.type == "cuda":
        out["peak_gpu_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def policy_objective(cfg: TrainConfig, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, n_tokens: float, n_seqs: float, norm_tokens: float,
                     weight: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The scalar loss of one micro-batch as `cfg` composes it (the TRL peer test calls this):

    l_t = w_t * policy_loss_t(logp, old_logp, A) + kl_coef * KL_t(logp, ref_logp), aggregated over
    the mini-batch's n_tokens / n_seqs. w_t is the TIS weight x sequence mask (None: 1); the KL
    term only with ref_logp. Returns (loss, clipped [B, T] 0/1, KL [B, T] or None).
    """
    if cfg.policy_loss == "ppo_clip":
        per_tok, clipped = ppo_clip_loss(logp, old_logp, advantages, cfg.clip_eps_low, cfg.clip_eps_high)
    elif cfg.policy_loss == "gspo":
        per_tok, clipped = gspo_loss(logp, old_logp, advantages, mask, cfg.gspo_clip_low, cfg.gspo_clip_high)
    elif cfg.policy_loss == "cispo":
        per_tok, clipped = cispo_loss(logp, old_logp, advantages, cfg.cispo_max_weight)
    else:
        raise ValueError(f"unknown policy loss {cfg.policy_loss!r}")
    if weight is not None:
        per_tok = per_tok * weight
    kl = None
    if ref_logp is not None:
        kl = KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)
        per_tok = per_tok + cfg.kl_coef * kl
    return aggregate_loss(per_tok, mask, cfg.loss_aggregation, n_tokens, n_seqs, norm_tokens), clipped, kl


@dataclass
class _Seq:
    """One trajectory's per-token tensors for the step (all 1-D, length = its completion)."""

    traj: Trajectory
    mask: torch.Tensor
    engine: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor | None = None
    weight: torch.Tensor | None = None  # TIS weight x sequence mask (None: 1)


def _groups_of(trajs: Sequence[Trajectory]) -> int:
    """Group size of a batch of contiguous equal-sized groups (by Trajectory.group)."""
    sizes, prev = [], None
    for t in trajs:
        if t.group != prev:
            sizes.append(0)
            prev = t.group
        sizes[-1] += 1
    if len(set(sizes)) != 1:
        raise ValueError(f"kl_in_reward needs contiguous equal-sized groups, got sizes {sizes}")
    return sizes[0]


def set_activation_checkpointing(model: Any, on: bool) -> None:
    """Recompute activations in the backward pass instead of keeping them (memory for time), or stop."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw) if on \
            else model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw) if on else model.gradient_checkpointing_disable()


class PolicyTrainer:
    def __init__(self, model: PreTrainedModel, pad_id: int, cfg: TrainConfig, lora: LoraConfig,
                 bf16_autocast: bool, temperature: float, seed: int = 0, distributed: bool = False) -> None:
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
        if cfg.gradient_checkpointing:
            set_activation_checkpointing(self.model, True)
        self.autocast = bf16_autocast and bf16_supported(self.model.device)
        self.share_prompt = cfg.share_prompt and shared_prompt_supported(self.model)
        # Distributed mode (honing.train.distributed): the model becomes FSDP2 shards, every rank
        # gets the whole batch and computes its slice of each mini-batch.
        self.dist: Sharded | None = None
        if distributed:
            if self.lora:
                raise ValueError("distributed training supports full fine-tuning only (no LoRA)")
            self.dist = Sharded(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = adamw(params, lr=cfg.learning_rate, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warm = cfg.warmup_steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        self.gen = torch.Generator().manual_seed(seed)  # mini-batch shuffling; saved in state()
        self.step_count = 0
        self.opt_steps = 0

    # --- log-probs --------------------------------------------------------------------------------

    def _micro_batches(self, seqs: Sequence[_Seq]) -> list[list[_Seq]]:
        cfg = self.cfg
        if cfg.micro_batch_tokens and self.share_prompt:  # budget over [prompt | completions...] rows
            rows = shared_prompt_rows([s.traj.prompt_ids for s in seqs], [s.traj.completion_ids for s in seqs],
                                      cfg.packed_row_tokens)
            lengths = [(len(seqs[r[0]].traj.prompt_ids), sum(len(seqs[i].traj.completion_ids) for i in r))
                       for r in rows]
            return [[seqs[i] for j in b for i in rows[j]]
                    for b in token_budget_batches(lengths, cfg.micro_batch_tokens)]
        if cfg.micro_batch_tokens:
            lengths = [(len(s.traj.prompt_ids), len(s.traj.completion_ids)) for s in seqs]
            return [[seqs[i] for i in b] for b in token_budget_batches(lengths, cfg.micro_batch_tokens)]
        return [list(seqs[i:i + cfg.micro_batch_size]) for i in range(0, len(seqs), cfg.micro_batch_size)]

    def _logprobs(self, model: PreTrainedModel, micro: Sequence[_Seq]) -> torch.Tensor:
        if self.dist is not None and model is self.model:  # through the FSDP root (all-gathers)
            return self.dist.forward(lambda m: self._logprobs_of(m, micro))
        return self._logprobs_of(model, micro)

    def _logprobs_of(self, model: PreTrainedModel, micro: Sequence[_Seq]) -> torch.Tensor:
        prompts, completions = [s.traj.prompt_ids for s in micro], [s.traj.completion_ids for s in micro]
        with autocast_ctx(self.autocast, self.model.device):
            if self.share_prompt:
                return shared_prompt_logprobs(model, prompts, completions, self.pad_id, self.temperature,
                                              self.cfg.logprob_chunk_tokens, self.cfg.packed_row_tokens)[0]
            return completion_logprobs(model, prompts, completions, self.pad_id, self.temperature,
                                       self.cfg.logprob_chunk_tokens)[0]

    @torch.no_grad()
    def _forward_only(self, seqs: Sequence[_Seq], old: bool, ref: bool) -> None:
        """Old log-probs (trainer, before any update) and reference log-probs, once per step."""
        if self.dist is not None:
            return self._forward_only_dist(seqs, old, ref)
        was_training = self.model.training
        self.model.eval()  # no dropout in the numbers the update is measured against
        try:
            for micro in self._micro_batches(seqs):
                lens = [len(s.traj.completion_ids) for s in micro]
                if old:
                    lp = self._logprobs(self.model, micro).float().cpu()
                    for s, row, n in zip(micro, lp, lens):
                        s.old = row[:n].clone()
                if ref:
                    if self.lora:
                        with self.model.disable_adapter():
                            lp = self._logprobs(self.model, micro).float().cpu()
                    else:
                        assert self.ref is not None
                        lp = self._logprobs(self.ref, micro).float().cpu()
                    for s, row, n in zip(micro, lp, lens):
                        s.ref = row[:n].clone()
        finally:
            self.model.train(was_training)

    def _dummy(self) -> _Seq:
        """A one-token sequence with no loss: keeps a rank's forward/backward count equal to the others'."""
        t = Trajectory(task_id="", domain="", prompt_ids=(self.pad_id,), completion_ids=(self.pad_id,),
                       logprobs=(0.0,), completion_text="", finish_reason="pad", policy_version=-1, loss_mask=(0,))
        z = torch.zeros(1)
        return _Seq(t, z, z, z, z if self.cfg.kl_coef > 0 else None)

    @torch.no_grad()
    def _forward_only_dist(self, seqs: Sequence[_Seq], old: bool, ref: bool) -> None:
        """_forward_only with each rank computing its slice; the results are gathered to all ranks."""
        assert self.dist is not None
        idx = self.dist.mine(range(len(seqs)))
        mine = [seqs[i] for i in idx]
        micros = self._micro_batches(mine)
        micros = pad_micro_batches(micros, max_int(len(micros)), self._dummy) if old else micros
        was_training = self.model.training
        self.model.eval()
        try:
            for micro in micros:
                lens = [len(s.traj.completion_ids) for s in micro]
                lp_old = self._logprobs(self.model, micro).float().cpu() if old else None
                real = micro[0].traj.finish_reason != "pad"
                lp_ref = self._logprobs(self.ref, micro).float().cpu() if ref and real else None
                for j, (s, n) in enumerate(zip(micro, lens)):
                    if lp_old is not None:
                        s.old = lp_old[j, :n].clone()
                    if lp_ref is not None:
                        s.ref = lp_ref[j, :n].clone()
        finally:
            self.model.train(was_training)
        got = all_gather_objects({i: (seqs[i].old if old else None, seqs[i].ref if ref else None) for i in idx})
        for part in got:
            for i, (o, r) in part.items():
                if old:
                    seqs[i].old = o
                if ref:
                    seqs[i].ref = r

    # --- the step ----------------------------------------------------------------------------------

    def step(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """One RL step on `trajs` (advantages already set, contiguous groups): ppo_epochs x
        mini_batches optimizer steps. Returns metrics."""
        t0 = time.perf_counter()
        cfg = self.cfg
        dev = self.model.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        memory.reset_peak()
        seqs = []
        for t in trajs:  # old log-probs start as the engine's; replaced below when recomputed
            engine_lp = torch.tensor(t.logprobs, dtype=torch.float32)
            seqs.append(_Seq(t, torch.tensor(t.loss_mask, dtype=torch.float32), engine_lp, engine_lp))
        # Old log-probs from the trainer when the batch is reused or the engine's numbers are to be
        # corrected (TIS / sequence masking); else the engine's sampling log-probs are the old ones.
        off_policy = cfg.tis_cap is not None or cfg.seq_mask_low is not None or cfg.seq_mask_high is not None
        recompute = cfg.recompute_old_logprobs or cfg.ppo_epochs * cfg.mini_batches > 1 or off_policy
        kl_loss = cfg.kl_coef > 0 and not cfg.kl_in_reward
        # Only sequences that can carry a gradient need them (all, when the KL changes the advantages).
        needed = seqs if cfg.kl_in_reward else [s for s in seqs if self._active(s, kl_loss)]
        if needed and (recompute or cfg.kl_coef > 0):                                  # old / reference
            self._forward_only(needed, old=recompute, ref=cfg.kl_coef > 0)
        m: dict[str, float] = {}
        if cfg.kl_in_reward and trajs:                                                 # KL folded into reward
            m.update(self._kl_into_advantages(seqs))
        m.update(self._off_policy_weights(needed, recompute))                         # TIS, sequence mask
        # With no KL loss term a zero-advantage sequence has zero gradient: skip its compute
        # (it still counts in the aggregation denominators, so the update is unchanged).
        norm_tokens = float(cfg.loss_norm_tokens or max((len(t.completion_ids) for t in trajs), default=1))
        sums = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "tokens_seen": 0.0, "grad_norm": 0.0,
                "mismatch_abs": 0.0, "mismatch_max": 0.0, "mismatch_tokens": 0.0}
        n_updates = 0
        self.model.train()
        for epoch in range(cfg.ppo_epochs):                                            # epochs x mini-batches
            order = torch.randperm(len(seqs), generator=self.gen).tolist() if cfg.mini_batches > 1 else range(len(seqs))
            shuffled = [seqs[i] for i in order]
            size = math.ceil(len(seqs) / cfg.mini_batches) if seqs else 1
            for mb in range(0, max(len(shuffled), 1), size):
                mini = shuffled[mb:mb + size]
                first_pass = epoch == 0 and mb == 0 and not recompute
                gn = self._update(mini, kl_loss, norm_tokens, sums, first_pass)
                if gn is not None:
                    sums["grad_norm"] += gn
                    n_updates += 1
        if self.dist is not None:  # per-rank sums of the updates -> the whole batch's
            keys = ["loss", "clip_frac", "kl", "tokens_seen", "mismatch_abs", "mismatch_tokens"]
            sums.update(zip(keys, all_reduce_floats([sums[k] for k in keys])))
            sums["mismatch_max"] = all_reduce_floats([sums["mismatch_max"]], "max")[0]
        with warnings.catch_warnings():  # an all-zero-advantage batch skips opt.step(); the schedule still advances
            warnings.simplefilter("ignore", UserWarning)
            lr = self.sched.get_last_lr()[0]
            self.sched.step()
        self.step_count += 1
        memory.release_free_memory()  # activations of varying size: else RSS ratchets up (memory.py)
        if recompute:  # the trainer's own pre-update numbers against the engine's
            for s in needed:
                d = ((s.old - s.engine) * s.mask).abs()
                sums["mismatch_abs"] += float(d.sum())
                sums["mismatch_max"] = max(sums["mismatch_max"], float(d.max()) if d.numel() else 0.0)
                sums["mismatch_tokens"] += float(s.mask.sum())
        total_tokens = float(sum(float(s.mask.sum()) for s in seqs))
        denom = max(sums["tokens_seen"], 1.0)
        n_active = sum(1 for s in seqs if self._active(s, kl_loss))
        return {
            **m,
            "loss": sums["loss"] / max(n_updates, 1),
            "grad_norm": sums["grad_norm"] / n_updates if n_updates else 0.0,
            "lr": lr,
            "clip_frac": sums["clip_frac"] / denom,
            "kl": sums["kl"] / denom,
            "logprob_mismatch": sums["mismatch_abs"] / max(sums["mismatch_tokens"], 1.0),
            "mismatch_max_ratio": math.exp(sums["mismatch_max"]),
            "active_seqs": float(n_active),
            "optimizer_steps": float(n_updates),
            "tokens": total_tokens,
            "update_s": time.perf_counter() - t0,
            **peak_memory_mb(dev),
        }

    def _active(self, s: _Seq, kl_loss: bool) -> bool:
        return (s.traj.advantage != 0.0 or kl_loss) and bool(s.mask.any())

    def _kl_into_advantages(self, seqs: Sequence[_Seq]) -> dict[str, float]:
        """r_i <- r_i - kl_coef * sum_t KL_t (old policy vs reference), then advantages again."""
        est = KL_ESTIMATORS[self.cfg.kl_estimator]
        kls = [float((est(s.old, s.ref) * s.mask).sum()) for s in seqs]
        rewards = torch.tensor([s.traj.reward - self.cfg.kl_coef * k for s, k in zip(seqs, kls)])
        adv = compute_advantages(rewards, _groups_of([s.traj for s in seqs]), self.cfg)
        for s, a in zip(seqs, adv.tolist()):
            s.traj.advantage = a
        return {"kl_in_reward": sum(kls) / max(sum(float(s.mask.sum()) for s in seqs), 1.0)}

    def _off_policy_weights(self, seqs: Sequence[_Seq], recomputed: bool) -> dict[str, float]:
        cfg = self.cfg
        if not recomputed or not seqs or (cfg.tis_cap is None and cfg.seq_mask_low is None and cfg.seq_mask_high is None):
            return {"tis_clip_frac": 0.0, "seq_masked_frac": 0.0}
        clipped = tokens = masked = 0.0
        for s in seqs:
            w = torch.ones_like(s.old)
            if cfg.tis_cap is not None:
                w = tis_weights(s.old, s.engine, cfg.tis_cap)
                clipped += float(((torch.exp(s.old - s.engine) > cfg.tis_cap).float() * s.mask).sum())
            if cfg.seq_mask_low is not None or cfg.seq_mask_high is not None:
                keep, _ = sequence_ratio_mask(s.old[None], s.engine[None], s.mask[None], cfg.seq_mask_low,
                                              cfg.seq_mask_high)
                w = w * keep[0]
                masked += float(keep[0, 0] == 0)
            s.weight = w
            tokens += float(s.mask.sum())
        return {"tis_clip_frac": clipped / max(tokens, 1.0), "seq_masked_frac": masked / len(seqs)}

    def _normalisers(self, mini: Sequence[_Seq]) -> tuple[float, float]:
        """The loss tokens and sequences of the whole mini-batch (every rank sees all of it)."""
        return float(sum(float(s.mask.sum()) for s in mini)), float(sum(1 for s in mini if s.mask.any()))

    def _update(self, mini: Sequence[_Seq], kl_loss: bool, norm_tokens: float, sums: dict[str, float],
                first_pass: bool) -> float | None:
        """Accumulate the mini-batch's gradient over micro-batches and take one optimizer step.
        Returns the gradient norm, or None when nothing in the mini-batch carries a gradient."""
        cfg = self.cfg
        n_tokens, n_seqs = self._normalisers(mini)
        active = [s for s in mini if self._active(s, kl_loss)]
        if not active:
            return None
        dev = self.model.device
        if self.dist is None:
            micros = self._micro_batches(active)
        else:  # this rank's slice; the normalisers above are the whole mini-batch's
            micros = self._micro_batches(self.dist.mine(active))
            micros = pad_micro_batches(micros, max_int(len(micros)), self._dummy)
        for micro in micros:
            logp = self._logprobs(self.model, micro).float()
            width = logp.shape[1]
            mask = padded([s.mask for s in micro], width, dev)
            old = padded([s.old for s in micro], width, dev)
            adv = torch.tensor([s.traj.advantage for s in micro], dtype=torch.float32, device=dev)
            w = None
            if any(s.weight is not None for s in micro):
                w = padded([s.weight if s.weight is not None else torch.ones_like(s.mask) for s in micro], width, dev)
            ref = padded([s.ref for s in micro], width, dev) if kl_loss else None
            loss, clipped, kl = policy_objective(cfg, logp, old, adv, mask, n_tokens, n_seqs, norm_tokens, w, ref)
            loss.backward()
            if kl is not None:
                sums["kl"] += float((kl.detach() * mask).sum())
            sums["loss"] += float(loss.detach())
            sums["clip_frac"] += float((clipped * mask).sum())
            sums["tokens_seen"] += float(mask.sum())
            if first_pass:  # current weights == sampling weights: the engine/trainer mismatch
                d = ((logp.detach() - old) * mask).abs()
                sums["mismatch_abs"] += float(d.sum())
                sums["mismatch_max"] = max(sums["mismatch_max"], float(d.max()))
                sums["mismatch_tokens"] += float(mask.sum())
        params = [p for p in self.model.parameters() if p.requires_grad]
        total_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)  # sharded: the global norm
        grad_norm = float(total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.opt_steps += 1
        return grad_norm if math.isfinite(grad_norm) else float("nan")

    # --- checkpoints -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Optimizer, LR schedule, RNG states and counters: with the weights, an exact resume."""
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
               "trainer": self.gen.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        opt = self.opt.state_dict() if self.dist is None else full_optimizer_state(self.dist.root, self.opt)
        return {"optimizer": opt, "scheduler": self.sched.state_dict(), "step": self.step_count,
                "optimizer_steps": self.opt_steps, "rng_states": rng}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what `state()` returned (the model's weights are loaded separately). Distributed:
        rank 0's `state` goes to every rank (the others pass None)."""
        # by index (one process) or by parameter name (FSDP): either resumes with any number of ranks
        names = [PREFIX + n for n, p in self.model.named_parameters() if p.requires_grad]
        if self.dist is not None:
            osd = optimizer_state_by_name(state["optimizer"], names) if state else {}
            load_full_optimizer_state(self.dist.root, self.opt, osd)
            state = broadcast_object({k: v for k, v in state.items() if k != "optimizer"} if state else None)
        else:
            self.opt.load_state_dict(optimizer_state_by_index(state["optimizer"], names))
        self.sched.load_state_dict(state["scheduler"])
        self.step_count = int(state["step"])
        self.opt_steps = int(state.get("optimizer_steps", 0))
        rng = state.get("rng_states")
        if rng:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            np.random.set_state(rng["numpy"])
            self.gen.set_state(rng["trainer"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def export_model(self) -> PreTrainedModel:
        """A plain transformers model with the current weights (LoRA merged into a copy)."""
        if not self.lora:
            return self.model
        return copy.deepcopy(self.model).merge_and_unload()
