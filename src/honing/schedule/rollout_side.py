"""The rollout side of a run: generate and grade one batch of tasks with a given policy version.

It runs in the trainer's process (synchronous runs share the trainer's module) or in a worker
process with its own copy of the policy (asynchronous runs; `build` is the worker's factory).
Each request carries its tasks and the cost-model state to bucket them with, so a batch's
result depends only on the request: that is what makes async runs and resumes reproducible.
"""

from __future__ import annotations

from typing import Any

import torch

from honing.config import RunConfig
from honing.engine import SamplingParams, TransformersEngine, engine_weights_dtype, make_engine
from honing.schedule.orchestrate import CostModel, Orchestrator, RolloutBatch
from honing.tasks.types import task_from_json


def eos_ids_of(tok: Any) -> list[int]:
    return [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int)
            and i >= 0 and i != tok.unk_token_id]


def train_params(cfg: RunConfig) -> SamplingParams:
    g = cfg.generation
    return SamplingParams(g.max_new_tokens, g.temperature, g.top_p, g.top_k, cfg.tasks.samples_per_prompt)


class LocalRollout:
    """Rolls out and grades batches (see the module docstring). `engine=None` builds a private
    copy of the policy (worker processes, or stale generation in one process)."""

    def __init__(self, cfg: RunConfig, engine: TransformersEngine | None = None, tok: Any = None,
                 setup: Any = None, remote_grade: Any = None) -> None:
        from honing.schedule.loop import build_tasks

        self.cfg = cfg
        if engine is None:
            from honing.models import load_policy

            model, tok = load_policy(cfg.model.name, seed=cfg.seed)
            if cfg.generation.backend == "hf":
                dtype = engine_weights_dtype(cfg.generation.weights, cfg.model.bf16_autocast, model.device)
                if dtype is not None:  # the process's own copy: in the engine's dtype, no second copy
                    model = model.to(dtype).requires_grad_(False)
                engine = TransformersEngine(model, eos_ids_of(tok), tok.pad_token_id, cfg.model.bf16_autocast,
                                            cfg.generation.max_batch_size, dtype,
                                            max_batch_tokens=cfg.generation.max_batch_tokens)
            else:
                engine = make_engine(cfg, model, tok, eos_ids_of(tok))
        self.engine, self.tok = engine, tok
        self.setup = setup or build_tasks(cfg)
        params = train_params(cfg)
        self.orch = Orchestrator(lambda tasks, seed: self.setup.roll_out(self.engine, self.tok, tasks, params, seed),
                                 self.setup.ctx, self.setup.reward, self.setup.grading, cfg.schedule.orchestration,
                                 cost=CostModel(), max_batch_tasks=0, remote_grade=remote_grade)

    def load_weights(self, state: dict[str, torch.Tensor] | None, version: int) -> None:
        self.engine.load_weights(state or None, version)

    def run(self, payload: dict, seed: int) -> RolloutBatch:
        tasks = [task_from_json(t) for t in payload["tasks"]]
        if payload.get("cost") is not None:
            self.orch.cost.load_state_dict(payload["cost"])
        return self.orch.run(tasks, seed)

    def close(self) -> None:
        if self.setup.sandbox is not None:
            self.setup.sandbox.close()


def worker_config(cfg_dict: dict) -> RunConfig:
    """A worker's view of the run's config, with the parent's plugins registered (absolute paths by now)."""
    cfg = RunConfig.model_validate(cfg_dict)
    from honing.plugins import load_plugins

    load_plugins(cfg.plugins)
    if cfg.run.deterministic:
        torch.use_deterministic_algorithms(True)
    return cfg


def build(cfg_dict: dict, remote_grade: Any = None) -> LocalRollout:
    """Worker-process factory: a LocalRollout with its own policy copy, from the run's config;
    `remote_grade` grades single-turn samples elsewhere (Ray grading actors)."""
    return LocalRollout(worker_config(cfg_dict), remote_grade=remote_grade)
