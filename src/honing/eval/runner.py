"""Evaluate a model on a suite: roll out, grade, and summarise per task and per domain.

A model is one of:

- a model spec (`smollm2-135m-instruct`, `tiny-random`, a Hugging Face directory, a hub id);
- a run directory (`runs/<name>`: its final checkpoint, else its latest `step-N`), or one
  checkpoint of it (`runs/<name>@step-N`);
- an OpenAI-compatible endpoint, `openai:<model>@<base_url>` (key from `$OPENAI_API_KEY`),
  for single-turn suites.

Determinism: tasks are generated in fixed chunks of `suite.batch_tasks` with a seed derived
from (seed, chunk index), so the same checkpoint, suite and seed give bit-for-bit the same
completions on the same CPU build, whatever else runs. Infra errors (a broken sandbox) are
excluded from every denominator and counted, never scored as failures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from honing.engine.factory import describe_engine
from honing.errors import HoningError, ModelError
from honing.eval.metrics import (bootstrap_ci, episode_behaviour, maj_at_k, pass_at_k, pass_at_k_curve,
                                 task_structure, verdict_layers)
from honing.eval.suite import Suite, suite_tasks
from honing.tasks.types import Task

Progress = Callable[[int, int], None]  # (tasks done, tasks total)


# --- models ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelRef:
    kind: str  # "local" or "endpoint"
    spec: str  # what load_policy / make_chat takes
    label: str  # what the user wrote


def _checkpoint_of(run: Path, step: Optional[str]) -> Path:
    root = run / "checkpoints"
    if step is not None:
        ck = root / step
        if not ck.is_dir():
            have = sorted(p.name for p in root.glob("*") if p.is_dir() and not p.name.startswith(".")) \
                if root.is_dir() else []
            raise ModelError(f"run {run} has no checkpoint '{step}' (it has: {', '.join(have) or 'none'})")
        return ck
    if (root / "final").is_dir():
        return root / "final"
    steps = sorted((int(p.name[5:]), p) for p in root.glob("step-*") if p.name[5:].isdigit()) if root.is_dir() else []
    if not steps:
        raise ModelError(f"run directory {run} has no checkpoints (expected {root}/final or {root}/step-N); "
                         "was it trained with checkpoint.every_steps or did it finish?")
    return steps[-1][1]


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "checkpoints").exists() or (path / "metrics.jsonl").exists()
                              or (path / "config.yaml").exists()) and not (path / "config.json").exists()


def resolve_model(spec: str) -> ModelRef:
    """A model spec, run directory (`@step-N` picks a checkpoint) or `openai:` endpoint -> ModelRef."""
    spec = spec.strip()
    if spec.startswith("openai:"):
        from honing.engine.chat import parse_openai_spec

        parse_openai_spec(spec)  # fails now on a missing model name or URL
        return ModelRef("endpoint", spec, spec)
    base, sep, step = spec.rpartition("@")
    if sep and step.startswith("step-") and Path(base).is_dir():
        return ModelRef("local", str(_checkpoint_of(Path(base), step)), spec)
    path = Path(spec).expanduser()
    if is_run_dir(path):
        return ModelRef("local", str(_checkpoint_of(path, None)), spec)
    from honing.models import resolve_model_dir

    resolve_model_dir(spec)  # a bad path or name fails here, before any work
    return ModelRef("local", spec, spec)


# --- sampling --------------------------------------------------------------------------------
def chunk_seed(seed: int, chunk: int) -> int:
    return (seed * 1_000_003 + chunk * 7_919) % (2**62)


def _sampling(suite: Suite, n: int, source: int) -> Any:
    from honing.engine.types import SamplingParams

    s = suite.sampling
    tokens = suite.sources[source].max_new_tokens or s.max_new_tokens
    return SamplingParams(tokens, s.temperature, s.top_p, s.top_k, n)


def make_chunks(st: Any, batch: int) -> list[tuple[int, list[Task]]]:
    """(source index, tasks): at most `batch` tasks each, never mixing sources (each may have its
    own token budget). Fixed by the suite alone, so results do not depend on the machine."""
    out: list[tuple[int, list[Task]]] = []
    i = 0
    while i < len(st.tasks):
        j = i
        while j < len(st.tasks) and j - i < batch and st.source_of[j] == st.source_of[i]:
            j += 1
        out.append((st.source_of[i], st.tasks[i:j]))
        i = j
    return out


class LocalRunner:
    """In-process model (TransformersEngine) through honing's rollout loops."""

    def __init__(self, ref: ModelRef, suite: Suite, tasks: Sequence[Task], engine: Any = None,
                 tokenizer: Any = None, backend: str = "hf") -> None:
        if engine is None:
            from honing.rollout.show import model_engine

            engine, tokenizer = model_engine(ref.spec, 0, backend)
            if hasattr(engine, "max_batch_size"):
                engine.max_batch_size = max(engine.max_batch_size, suite.batch_tasks * 64)
        self.engine, self.tok = engine, tokenizer
        self.multiturn = None
        if any(t.environment for t in tasks):
            from honing.rollout.multiturn import MultiTurnConfig

            self.multiturn = MultiTurnConfig()

    def run(self, tasks: Sequence[Task], params: Any, seed: int, sandbox: Any) -> list[Any]:
        from honing.rollout.mixed import rollout_tasks

        return rollout_tasks(self.engine, self.tok, tasks, params, seed, sandbox, self.multiturn)


class EndpointRunner:
    """An OpenAI-compatible endpoint: text in, text out (single-turn tasks only). Each sample is
    one request (seeded; whether the server honours the seed is up to it)."""

    def __init__(self, ref: ModelRef, tasks: Sequence[Task], retries: int = 3, concurrency: int = 8,
                 timeout_s: float = 120.0) -> None:
        multi = [t.id for t in tasks if t.environment]
        if multi:
            raise HoningError(f"endpoint models evaluate single-turn suites only; task {multi[0]} is multi-turn")
        from honing.engine.chat import make_chat

        self.chat = make_chat(ref.spec, max_retries=retries, timeout_s=timeout_s)
        self.concurrency = concurrency

    def run(self, tasks: Sequence[Task], params: Any, seed: int, sandbox: Any) -> list[Any]:
        from honing.rollout.types import Trajectory

        jobs = [(g, i) for g in range(len(tasks)) for i in range(params.n)]

        def one(job: tuple[int, int]) -> Any:
            g, i = job
            text = self.chat.chat([dict(m) for m in tasks[g].prompt], params.max_new_tokens, params.temperature,
                                  seed=seed + i)
            t = Trajectory.from_text(tasks[g].id, tasks[g].domain, text)
            t.group = g
            return t

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, jobs))  # the first failure propagates (after the client's retries)


def _sandbox_for(suite: Suite, tasks: Sequence[Task]) -> Any:
    from honing.verify import get_verifier

    needs = any(t.environment for t in tasks) or any(
        getattr(get_verifier(n), "needs_sandbox", False) for n in {t.verifier.name for t in tasks})
    if not needs:
        return None
    from honing.sandbox import Sandbox

    return Sandbox(suite.sandbox_backend)


# --- per-sample records and answers -----------------------------------------------------------
def answer_key(task: Task, traj: Any, extractor: str) -> Optional[str]:
    """The normalised final answer maj@k votes over (None: no answer, or a multi-turn task)."""
    if task.environment:
        return None
    text = traj.completion_text
    if task.verifier.name == "code":
        from honing.verify.code import extract_program

        prog, _ = extract_program(text)
        lines = [ln.rstrip() for ln in prog.strip().splitlines() if ln.strip()]
        return "\n".join(lines) or None
    from honing.verify.extract import EXTRACTORS
    from honing.verify.math import extract_answer, normalize

    # the answer the task's verifier reads: the maths reading for `math`, else the named extractor
    ans, _ = extract_answer(text, extractor) if task.verifier.name == "math" else EXTRACTORS[extractor](text)
    return normalize(ans) if ans is not None else None


def sample_record(task: Task, traj: Any, index: int, answer: Optional[str]) -> dict[str, Any]:
    v = traj.verdict
    rec: dict[str, Any] = {
        "task_id": task.id, "domain": task.domain, "sample": index, "passed": bool(v and v.passed),
        "score": round(float(v.score), 6) if v else 0.0, "status": traj.status,
        "finish_reason": traj.finish_reason, "answer": answer, "text": traj.completion_text,
        "n_tokens": len(traj.completion_ids), "details": (v.details if v else "")[:2000],
        "components": {k: round(float(x), 6) for k, x in (v.components.items() if v else ())},
        "reward_layers": {k: round(float(x), 6) for k, x in traj.reward_layers.items()},
    }
    if traj.turns:
        rec["turns"] = [{"index": t.index, "action": t.action_text, "tool": t.tool, "ok": t.ok,
                         "observation": t.observation_text[:4000]} for t in traj.turns]
    if traj.stop_reason:
        rec["stop_reason"] = traj.stop_reason
    if traj.turns and traj.stats:
        rec["episode"] = {k: int(v) for k, v in traj.stats.items()}
    return rec


# --- the evaluation ---------------------------------------------------------------------------
def evaluate_suite(model: str, suite: Suite, samples: Optional[int] = None, seed: Optional[int] = None,
                   limit: Optional[int] = None, progress: Optional[Progress] = None, engine: Any = None,
                   tokenizer: Any = None, endpoint_retries: int = 3, backend: str = "hf",
                   on_chunk: Optional[Callable[[dict], None]] = None,
                   resume: Optional[dict] = None) -> dict[str, Any]:
    """Evaluate `model` on `suite`'s held-out tasks. Returns the result dict (see `summarise`).

    An endpoint that fails after its retries stops the evaluation: the tasks finished so far are
    kept and `meta.incomplete` says what happened (nothing finished at all raises HoningError).
    `on_chunk` gets the result so far after every chunk (marked incomplete until the last), which
    `honing eval --out` writes, so a killed evaluation keeps what it finished; `resume` (such a
    partial result, of the same model, suite, seed and samples) supplies its finished chunks, and
    since each chunk's seed comes from its index the result is the one an uninterrupted run gives.
    """
    t_start = time.time()
    ref = resolve_model(model) if engine is None else ModelRef("local", model, model)
    st = suite_tasks(suite, limit)
    tasks = st.tasks
    n = samples or suite.samples_per_task
    base_seed = suite.seed if seed is None else seed
    runner: Any = (EndpointRunner(ref, tasks, endpoint_retries) if ref.kind == "endpoint"
                   else LocalRunner(ref, suite, tasks, engine, tokenizer, backend))
    sandbox = _sandbox_for(suite, tasks)
    from honing.verify import Verdict, VerifyContext
    from honing.verify.batch import BatchOptions, grade_batch

    ctx = VerifyContext(suite.extractor, 0.0, {"sandbox": sandbox} if sandbox else {})
    per_task: list[list[dict]] = []
    incomplete: Optional[dict] = None
    gen_s = grade_s = 0.0
    meta_base = {
        "suite": suite.name, "suite_version": suite.version, "model": ref.label, "model_resolved": ref.spec,
        "model_kind": ref.kind, "seed": base_seed, "samples_per_task": n, "extractor": suite.extractor,
        "sampling": suite.sampling.model_dump(), "limit": limit, "batch_tasks": suite.batch_tasks,
    }
    earlier = finished_groups(resume, meta_base, [t.id for t in tasks]) if resume is not None else {}
    if progress:
        progress(0, len(tasks))
    for ci, (src, chunk) in enumerate(make_chunks(st, suite.batch_tasks)):
        if chunk and all(t.id in earlier for t in chunk):  # finished before: its records as they were
            per_task.extend(earlier[t.id] for t in chunk)
            if progress:
                progress(len(per_task), len(tasks))
            continue
        t0 = time.perf_counter()
        try:
            params = _sampling(suite, n, src)
            trajs = runner.run(chunk, params, chunk_seed(base_seed, ci), sandbox)
        except Exception as e:  # noqa: BLE001 - endpoint failures end the run; partial results are kept
            if ref.kind != "endpoint":
                raise
            msg = f"{type(e).__name__}: {e}"
            if not per_task:
                raise HoningError(f"cannot evaluate {ref.label}: {msg}") from None
            incomplete = {"error": msg, "tasks_done": len(per_task), "tasks_total": len(tasks)}
            break
        t1 = time.perf_counter()
        graded = grade_batch([chunk[t.group] for t in trajs], trajs, ctx,
                             opts=BatchOptions(max_new_tokens=params.max_new_tokens))
        for t, g in zip(trajs, graded):
            t.verdict, t.reward, t.reward_layers = g.verdict, g.reward.value, dict(g.reward.layers)
            if getattr(t, "stop_reason", "") == "infra_error":
                t.verdict = Verdict.infra(f"episode stopped by an infrastructure error: {t.verdict.details}")
        grade_s += time.perf_counter() - t1
        gen_s += t1 - t0
        groups: list[list[dict]] = [[] for _ in chunk]
        for t in trajs:
            task = chunk[t.group]
            groups[t.group].append(sample_record(task, t, len(groups[t.group]), answer_key(task, t, suite.extractor)))
        per_task.extend(groups)
        if progress:
            progress(len(per_task), len(tasks))
        if on_chunk is not None and len(per_task) < len(tasks):
            on_chunk(result_of(tasks, per_task, n, meta_base, runner, suite, t_start, gen_s, grade_s, earlier,
                               {"error": "stopped before the end (interrupted or killed): resume with --resume",
                                "tasks_done": len(per_task), "tasks_total": len(tasks)}))
    return result_of(tasks, per_task, n, meta_base, runner, suite, t_start, gen_s, grade_s, earlier, incomplete)


def result_of(tasks: Sequence[Task], per_task: list[list[dict]], n: int, meta_base: dict, runner: Any,
              suite: Suite, t_start: float, gen_s: float, grade_s: float, earlier: dict,
              incomplete: Optional[dict]) -> dict[str, Any]:
    done = tasks[:len(per_task)]
    meta = {
        **meta_base,
        "engine": "endpoint" if meta_base["model_kind"] == "endpoint" else describe_engine(runner.engine),
        "max_new_tokens_by_source": {s.name: s.max_new_tokens for s in suite.sources if s.max_new_tokens},
        "n_tasks": len(done), "n_tasks_planned": len(tasks), "incomplete": incomplete,
        "resumed_tasks": sum(t.id in earlier for t in done),
        "time": {"wall_s": round(time.time() - t_start, 3), "generate_s": round(gen_s, 3),
                 "grade_s": round(grade_s, 3)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out = summarise(done, per_task, n)
    out["meta"] = meta
    return out


RESUME_KEYS = ("suite", "suite_version", "model_resolved", "seed", "samples_per_task", "extractor", "sampling",
               "limit", "batch_tasks")


def finished_groups(prev: dict, meta: dict, task_ids: Sequence[str]) -> dict[str, list[dict]]:
    """A partial evaluation's per-task sample records, by task id, once it is checked to be this same
    evaluation (model, suite, seed, samples, sampling, chunking) over the same tasks in the same order."""
    pm = prev.get("meta", {})
    for key in RESUME_KEYS:
        if pm.get(key) != meta.get(key):
            raise HoningError(f"cannot resume: the earlier evaluation's {key} is {pm.get(key)!r}, this one's is "
                              f"{meta.get(key)!r} (resume only the same model, suite, seed and samples)")
    ids = [r["id"] for r in prev.get("tasks", [])]
    if ids != list(task_ids[:len(ids)]):
        raise HoningError("cannot resume: the earlier evaluation's tasks are not this suite's tasks in order")
    groups: dict[str, list[dict]] = {i: [] for i in ids}
    for rec in prev.get("samples", []):
        if rec.get("task_id") in groups:
            groups[rec["task_id"]].append(rec)
    return {i: sorted(g, key=lambda r: r.get("sample", 0)) for i, g in groups.items()}


def _ci(rows: Sequence[dict], key: str) -> list[float] | None:
    """Bootstrap CI of `key` over the rows that have it, resampling structures where rows carry one."""
    have = [r for r in rows if r.get(key) is not None]
    if not have:
        return None
    lo, hi = bootstrap_ci([r[key] for r in have], clusters=[r.get("structure", r["id"]) for r in have])
    return [round(lo, 6), round(hi, 6)]


def _metric_block(rows: Sequence[dict], k: int) -> dict[str, Any]:
    """pass@1, pass@k, maj@k (+ bootstrap CIs over tasks, clustered by structure where rows have one), the
    pass@k curve, rewards, counts."""
    graded = [r for r in rows if r["n"] > 0]
    p1 = [r["pass@1"] for r in graded]
    pk = [r[f"pass@{k}"] for r in graded if r.get(f"pass@{k}") is not None]
    mk = [r[f"maj@{k}"] for r in graded if r.get(f"maj@{k}") is not None]
    block: dict[str, Any] = {
        "n_tasks": len(rows), "n_graded": len(graded), "samples": sum(r["n"] for r in rows),
        "infra_errors": sum(r["infra_errors"] for r in rows),
        "pass@1": round(sum(p1) / len(p1), 6) if p1 else None,
        f"pass@{k}": round(sum(pk) / len(pk), 6) if pk else None,
        f"maj@{k}": round(sum(mk) / len(mk), 6) if mk else None,
        "mean_reward": round(sum(r["mean_reward"] for r in graded) / len(graded), 6) if graded else None,
        "truncated_frac": round(sum(r["truncated"] for r in rows) / max(sum(r["n"] for r in rows), 1), 6),
        "ci": {m: _ci(graded, m) for m in ("pass@1", f"pass@{k}", f"maj@{k}", "mean_reward")},
    }
    if graded:
        block["pass@k_curve"] = {str(kk): round(v, 6) for kk, v in
                                 pass_at_k_curve([r["n"] for r in graded], [r["correct"] for r in graded]).items()}
    return block


def task_row(task: Task, recs: Sequence[dict], k: int) -> dict[str, Any]:
    """One task's numbers: n graded samples, correct, pass@1, pass@k, maj@k."""
    ok = [r for r in recs if r["status"] != "infra_error"]
    n, c = len(ok), sum(r["passed"] for r in ok)
    answers = [r["answer"] for r in ok]
    good = {r["answer"] for r in ok if r["passed"] and r["answer"] is not None}
    row: dict[str, Any] = {
        "id": task.id, "domain": task.domain, "difficulty": task.difficulty, "n": n, "correct": c,
        "infra_errors": len(recs) - n, "truncated": sum(r["finish_reason"] == "length" for r in ok),
        "pass@1": round(c / n, 6) if n else None,
        f"pass@{k}": round(pass_at_k(n, c, k), 6) if n >= k else None,
        f"maj@{k}": None, "mean_reward": round(sum(r["score"] for r in ok) / n, 6) if n else None,
        "question": task.question, "prompt": [dict(m) for m in task.prompt],
    }
    if task_structure(task):  # tasks of one structure: their CIs cluster by it
        row["structure"] = task_structure(task)
    if n >= k and not task.environment:
        row[f"maj@{k}"] = round(maj_at_k(answers, lambda a: a in good, k), 6)
    return row


def summarise(tasks: Sequence[Task], per_task: Sequence[Sequence[dict]], k: int) -> dict[str, Any]:
    """{"tasks": [...], "domains": {d: metrics}, "overall": metrics, "difficulty": {d: {level: metrics}},
    "samples": [per-sample records]}."""
    rows = [task_row(t, recs, k) for t, recs in zip(tasks, per_task)]
    by_dom: dict[str, list[dict]] = defaultdict(list)
    by_diff: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_dom[r["domain"]].append(r)
        if r["difficulty"] is not None:
            by_diff[r["domain"]][f"{r['difficulty']:.3g}"].append(r)
    domains = {d: _metric_block(rs, k) for d, rs in by_dom.items()}
    for d, block in domains.items():
        recs_d = [rec for recs in per_task for rec in recs if rec.get("domain") == d]
        beh = episode_behaviour(recs_d)
        if beh is not None:
            block["behaviour"] = beh
        layers = verdict_layers(recs_d)
        if layers is not None and set(layers) != {"correct"}:
            block["layers"] = layers
    return {
        "tasks": rows,
        "domains": domains,
        "overall": _metric_block(rows, k) if rows else {},
        "difficulty": {d: {lv: _metric_block(rs, k) for lv, rs in sorted(lvs.items())}
                       for d, lvs in by_diff.items() if len(lvs) > 1},
        "samples": [rec for recs in per_task for rec in recs],
    }


def save_result(result: dict, path: Path) -> Path:
    import json

    from honing.schedule.runlog import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1, default=str))
    return path


def load_result(path: Path) -> dict:
    import json

    if not path.is_file():
        raise HoningError(f"evaluation file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HoningError(f"{path}: not an evaluation JSON: {e}") from None
    if not isinstance(data, dict) or "tasks" not in data or "domains" not in data:
        raise HoningError(f"{path}: not an evaluation JSON (expected 'tasks' and 'domains'; "
                          "write one with `honing eval --out FILE.json`)")
    return data


# --- display ----------------------------------------------------------------------------------
def _fmt(value: Any, ci: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.3f}"


def result_table(result: dict) -> Any:
    """A rich Table: one row per domain (and 'all') with pass@1, pass@k, maj@k and 95% CIs."""
    from rich.table import Table

    meta = result.get("meta", {})
    k = int(meta.get("samples_per_task", 1))
    title = f"{meta.get('model', '?')} on {meta.get('suite', '?')}@v{meta.get('suite_version', '?')} " \
            f"({meta.get('n_tasks', len(result['tasks']))} tasks x {k} samples, seed {meta.get('seed', '?')})"
    table = Table(title=title, title_justify="left")
    for col in ("domain", "tasks", "pass@1", f"pass@{k}", f"maj@{k}", "reward", "infra"):
        table.add_column(col, justify="left" if col == "domain" else "right", no_wrap=True)
    rows = sorted(result["domains"].items())
    if len(rows) > 1 and result.get("overall"):
        rows.append(("all", result["overall"]))
    for name, m in rows:
        ci = m.get("ci", {})
        table.add_row(name, str(m["n_tasks"]), _fmt(m.get("pass@1"), ci.get("pass@1")),
                      _fmt(m.get(f"pass@{k}"), ci.get(f"pass@{k}")), _fmt(m.get(f"maj@{k}"), ci.get(f"maj@{k}")),
                      _fmt(m.get("mean_reward"), ci.get("mean_reward")), str(m["infra_errors"]))
    return table
