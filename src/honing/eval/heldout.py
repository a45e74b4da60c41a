"""Held-out evaluation during training: pass@1 and mean reward on tasks training never sees."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from honing.engine.types import Engine, SamplingParams
from honing.eval.metrics import episode_behaviour, task_structure
from honing.rollout.single import rollout
from honing.tasks.types import Task
from honing.verify import VerifyContext
from honing.verify.batch import BatchOptions, grade_batch


def evaluate(engine: Engine, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Task], params: SamplingParams,
             ctx: VerifyContext, seed: int = 0, opts: BatchOptions = BatchOptions(),
             roll_out: Callable[..., list] | None = None) -> dict:
    """pass@1 = mean over tasks of the fraction of samples that pass (the unbiased estimator for k=1).

    Infra errors are excluded from the denominators and counted.
    """
    if not tasks:
        return {"pass@1": float("nan"), "mean_reward": float("nan"), "n_tasks": 0, "infra_errors": 0,
                "truncated_frac": 0.0, "per_domain_pass@1": {}, "per_task_pass@1": {}, "per_domain_behaviour": {},
                "per_task_reward": {}, "per_task_domain": {}, "examples": []}
    trajs = (roll_out or (lambda e, tok, ts, p, sd: rollout(e, tok, ts, p, seed=sd)))(engine, tokenizer, tasks, params,
                                                                                      seed)
    per_task: dict[int, list] = defaultdict(list)
    infra = 0
    graded = grade_batch([tasks[t.group] for t in trajs], trajs, ctx, opts=opts)
    for t, g in zip(trajs, graded):
        v = g.verdict
        if v.infra_error:
            infra += 1
            continue
        per_task[t.group].append(v)
    pass1 = [sum(v.passed for v in vs) / len(vs) for vs in per_task.values() if vs]
    rewards = [v.score for vs in per_task.values() for v in vs]
    by_domain: dict[str, list[float]] = defaultdict(list)
    for g, vs in per_task.items():
        by_domain[tasks[g].domain].append(sum(v.passed for v in vs) / len(vs))
    episodes: dict[str, list[dict]] = defaultdict(list)  # multi-turn: what the episodes did, per domain
    for t, g in zip(trajs, graded):
        if t.turns and t.stats and not g.verdict.infra_error:
            episodes[tasks[t.group].domain].append({"episode": t.stats, "status": t.status,
                                                    "passed": g.verdict.passed})
    structure = {tasks[g].id: task_structure(tasks[g]) for g in sorted(per_task) if task_structure(tasks[g])}
    return {
        "pass@1": sum(pass1) / max(len(pass1), 1),
        "mean_reward": sum(rewards) / max(len(rewards), 1),
        "n_tasks": len(per_task),
        "infra_errors": infra,
        "truncated_frac": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        "per_domain_pass@1": {d: sum(x) / len(x) for d, x in by_domain.items()},
        "per_task_pass@1": {tasks[g].id: sum(v.passed for v in vs) / len(vs) for g, vs in sorted(per_task.items())},
        "per_domain_behaviour": {d: episode_behaviour(recs) for d, recs in sorted(episodes.items())},
        "per_task_reward": {tasks[g].id: sum(v.score for v in vs) / len(vs) for g, vs in sorted(per_task.items())},
        "per_task_domain": {tasks[g].id: tasks[g].domain for g in sorted(per_task)},
        **({"per_task_cluster": structure} if len(set(structure.values())) < len(structure) else {}),
        "examples": [{"task": tasks[t.group].question, "completion": t.completion_text, "task_id": tasks[t.group].id,
                      "domain": tasks[t.group].domain, "passed": g.verdict.passed, "score": g.verdict.score,
                      "details": g.verdict.details, "infra_error": g.verdict.infra_error}
                     for t, g in list(zip(trajs, graded))[:3]],
    }
