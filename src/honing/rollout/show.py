"""`honing rollout`: run a few episodes of a domain (or of one task file) with a model or a
scripted policy, grade them, and print each trajectory for a person to read.

Policies: ``model`` (the --model, sampled), ``reference`` (replays the task's hidden reference
solution: for repair tasks run_tests, read_file of each file the patch changes, apply_patch(reference_patch),
run_tests, submit; for
single-turn tasks the hidden answer), ``scripted:FILE.jsonl`` (one assistant turn's raw text
per line: a JSON string, ``{"text": ...}``, or a tool call ``{"name": ..., "arguments": ...}``).
Tasks with an ``environment`` run as multi-turn episodes in the sandbox; others get one
generation. Grading goes through `honing.verify.batch.grade_batch`.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from honing.errors import HoningError
from honing.rollout.types import Trajectory

SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@dataclass
class RolloutOptions:
    task: str | None = None
    task_file: Path | None = None
    model: str = "smollm2-135m-instruct"
    policy: str = "model"
    n: int = 1  # tasks from the domain
    samples: int = 1  # episodes per task
    split: str = "train"
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    max_new_tokens: int | None = None
    temperature: float = 1.0
    extractor: str = "auto"
    backend: str = "bwrap"
    max_obs_chars: int = 1500
    engine: str = "hf"  # generation backend for --policy model: hf or vllm


# --- inputs -------------------------------------------------------------------------------------
def load_tasks(opts: RolloutOptions) -> list[Any]:
    from honing.tasks import make_source
    from honing.tasks.types import task_from_json

    if (opts.task is None) == (opts.task_file is None):
        raise HoningError("give either --task DOMAIN or --task-file TASK.json")
    if opts.task_file is not None:
        p = Path(opts.task_file)
        if not p.is_file():
            raise HoningError(f"task file not found: {p}")
        text = p.read_text(encoding="utf-8", errors="replace").strip()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            first = text.splitlines()[0] if text else ""
            try:  # several lines of `honing tasks show --json`: the first task
                obj = json.loads(first)
            except json.JSONDecodeError:
                raise HoningError(f"{p}: not valid JSON: {e}") from None
        return [task_from_json(obj, str(p))]
    if opts.n < 1:
        raise HoningError("--n must be at least 1")
    src = make_source(opts.task, opts.params or None)
    out = []
    for t in src.tasks(opts.split, opts.seed):
        out.append(t)
        if len(out) >= opts.n:
            break
    return out


def read_script(path: str) -> list[str]:
    """One assistant turn per line; errors name file:line."""
    p = Path(path)
    if not p.is_file():
        raise HoningError(f"scripted policy file not found: {path}")
    replies = []
    for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HoningError(f"{path}:{i}: not valid JSON ({e.msg}); each line is one assistant turn: "
                              f'a JSON string, {{"text": ...}} or {{"name": ..., "arguments": {{...}}}}') from None
        if isinstance(obj, str):
            replies.append(obj)
        elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
            replies.append(obj["text"])
        elif isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", {})
            if not isinstance(args, dict):
                raise HoningError(f"{path}:{i}: 'arguments' must be a JSON object")
            replies.append(tool_call(obj["name"], **args))
        else:
            raise HoningError(f"{path}:{i}: expected a JSON string, {{\"text\": ...}} or "
                              f"{{\"name\": ..., \"arguments\": {{...}}}}, got {type(obj).__name__}")
    if not replies:
        raise HoningError(f"{path}: no assistant turns (the file is empty)")
    return replies


def patched_files(patch: str) -> list[str]:
    """The existing files a unified diff changes, in order (none when it does not parse)."""
    from honing.rollout.tools import PatchError, parse_unified_diff

    try:
        return list(dict.fromkeys(old for old, _, _ in parse_unified_diff(patch) if old))
    except PatchError:
        return []


def reference_script(task: Any) -> list[str]:
    """The replies that replay a task's hidden reference solution (an environment package's
    `Environment.reference` when the task comes from one)."""
    if str(task.domain).startswith("env:") or str(task.verifier.name).startswith("env:"):
        from honing.envcheck import reference_of, script_of
        from honing.envpkg import load_environment

        name = (task.verifier.name if task.verifier.name.startswith("env:") else task.domain)[len("env:"):]
        env = load_environment(name.split("/")[0])
        if env.reference is not None:
            return script_of(reference_of(env, task), f"task {task.id}")
    hidden = dict(task.hidden or {})
    if task.environment is not None:
        patch = hidden.get("reference_patch")
        if patch:  # look before patching: the patch's context lines are then in the episode, not recalled
            reads = [tool_call("read_file", path=p) for p in patched_files(patch)]
            return [tool_call("run_tests"), *reads, tool_call("apply_patch", patch=patch), tool_call("run_tests"),
                    tool_call("submit")]
        solution = hidden.get("solution")
        if isinstance(solution, dict) and solution:
            return [*(tool_call("write_file", path=k, content=v) for k, v in solution.items()),
                    tool_call("run_tests"), tool_call("submit")]
        raise HoningError(f"task {task.id}: no hidden reference solution (reference_patch) to replay")
    for key in ("answer", "reference", "solution"):
        if isinstance(hidden.get(key), (str, int, float)):
            return [str(hidden[key])]
    raise HoningError(f"task {task.id}: no hidden answer to replay with --policy reference")


def parse_policy(spec: str) -> tuple[str, str | None]:
    kind, _, arg = spec.partition(":")
    if kind in ("model", "reference") and not arg:
        return kind, None
    if kind == "scripted" and arg:
        return kind, arg
    raise HoningError(f"unknown policy '{spec}' (model, reference, scripted:FILE.jsonl)")


# --- engines ------------------------------------------------------------------------------------
class RoutedEngine:
    """Sends each prompt to the engine registered for its prefix (per-task scripted replies)."""

    version = 0

    def __init__(self, routes: Sequence[tuple[tuple[int, ...], Any]]) -> None:
        self.routes = sorted(routes, key=lambda r: -len(r[0]))
        self.calls = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: Any, seed: int | None = None) -> list[list[Any]]:
        self.calls += 1
        out = []
        for p in prompts:
            eng = next((e for pre, e in self.routes if tuple(p[: len(pre)]) == pre), None)
            if eng is None:
                raise RuntimeError("no scripted policy for this prompt")
            out.append(eng.generate([p], params, seed)[0])
        return out

    def load_weights(self, state: object, version: int) -> None:
        self.version = version


def model_engine(spec: str, seed: int, backend: str = "hf") -> tuple[Any, Any]:
    """An engine over the model `spec` names: honing's transformers loop ('hf') or vLLM ('vllm')."""
    from honing.engine import TransformersEngine
    from honing.models import load_policy

    if backend == "vllm":
        from honing.engine.vllm import import_vllm

        import_vllm()  # a missing vllm fails before the model loads
    model, tok = load_policy(spec, seed=seed)
    eos_ids = [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int)
               and i >= 0 and i != tok.unk_token_id]
    if backend == "hf":
        return TransformersEngine(model, eos_ids, tok.pad_token_id), tok
    from honing.config import RunConfig
    from honing.engine.factory import make_engine

    cfg = RunConfig.model_validate({"seed": seed, "generation": {"backend": backend}})
    return make_engine(cfg, model, tok, eos_ids, need_weight_sync=False), tok


# --- running ------------------------------------------------------------------------------------
@dataclass
class Result:
    task: Any
    trajectory: Trajectory
    episode: int
    verify_s: float = 0.0


def _scripts(kind: str, arg: str | None, tasks: Sequence[Any]) -> list[list[str]] | None:
    if kind == "model":
        return None
    if kind == "reference":
        return [reference_script(t) for t in tasks]
    lines = read_script(arg or "")
    return [lines for _ in tasks]


def run(opts: RolloutOptions) -> list[Result]:
    """Load tasks, run the episodes, grade them; results in task order, episodes contiguous."""
    from honing.engine import SamplingParams
    from honing.rollout.env import make_environment
    from honing.rollout.multiturn import (
        ChatFormat,
        Episode,
        MultiTurnConfig,
        ScriptedEngine,
        run_episodes,
    )
    from honing.rollout.single import prompt_ids, rollout
    from honing.verify import VerifyContext, get_verifier
    from honing.verify.batch import grade_batch

    kind, arg = parse_policy(opts.policy)
    if opts.samples < 1:
        raise HoningError("--samples must be at least 1")
    tasks = load_tasks(opts)
    for t in tasks:
        get_verifier(t.verifier.name)  # unknown verifier names fail before anything runs
    scripts = _scripts(kind, arg, tasks)
    if kind == "model":
        engine, tok = model_engine(opts.model, opts.seed, opts.engine)
    else:
        from honing.models import load_tokenizer

        tok, engine = load_tokenizer(opts.model), None
    scripted = scripts is not None
    max_new = opts.max_new_tokens or (1 << 14 if scripted else 256)
    params = SamplingParams(max_new_tokens=max_new, temperature=opts.temperature, n=opts.samples)

    multi = [i for i, t in enumerate(tasks) if t.environment is not None]
    single = [i for i, t in enumerate(tasks) if t.environment is None]
    trajs: dict[int, list[Trajectory]] = {}
    sandbox = None
    try:
        if multi:
            from honing.sandbox import Sandbox

            sandbox = Sandbox(opts.backend)
            cfg = MultiTurnConfig(max_turns=opts.max_turns or 12)
            if scripted:  # no model context to respect: never truncate a script's observations
                cfg = replace(cfg, context_tokens=1 << 20, max_total_tokens=1 << 22)
            fmt = ChatFormat(tok)
            eps: list[tuple[int, Any]] = []
            try:
                for i in multi:
                    task = tasks[i]
                    env_cfg = dict(task.environment or {})
                    tcfg = replace(cfg, max_turns=min(int(env_cfg.get("max_turns", cfg.max_turns)), cfg.max_turns)
                                   if opts.max_turns is None else opts.max_turns)
                    for _ in range(opts.samples):
                        session = sandbox.open(cfg.profile, limits=cfg.session_limits)
                        try:
                            eps.append((i, Episode(task, session, make_environment(task), fmt, tcfg, group=i)))
                        except BaseException:
                            session.close()
                            raise
                eng = engine
                if scripted:
                    eng = RoutedEngine([(tuple(e.prompt_ids), ScriptedEngine(tok, scripts[i]))  # type: ignore[index]
                                        for i, e in eps])
                run_episodes(eng, tok, [e for _, e in eps], params, cfg, opts.seed,
                             max_workers=sandbox.max_concurrency)
                for i, e in eps:
                    trajs.setdefault(i, []).append(e.to_trajectory(eng.version))
            finally:
                for _, e in eps:
                    e.session.close()
        if single:
            stasks = [tasks[i] for i in single]
            eng = engine
            if scripted:
                eng = RoutedEngine([(tuple(prompt_ids(tok, tasks[i])), ScriptedEngine(tok, scripts[i]))  # type: ignore[index]
                                    for i in single])
            t0 = time.perf_counter()
            out = rollout(eng, tok, stasks, params, seed=opts.seed)
            gen_s = time.perf_counter() - t0
            for tr in out:
                tr.timings["gen_s"] = gen_s
                trajs.setdefault(single[tr.group], []).append(tr)
        results = [Result(tasks[i], tr, k) for i in range(len(tasks)) for k, tr in enumerate(trajs.get(i, []))]
        ctx = VerifyContext(opts.extractor, 0.0, {"sandbox": sandbox} if sandbox is not None else {})
        graded = grade_batch([r.task for r in results], [r.trajectory for r in results], ctx)
        for r, g in zip(results, graded):
            r.trajectory.verdict, r.trajectory.reward = g.verdict, g.reward.value
            r.trajectory.reward_layers = dict(g.reward.layers)
            r.verify_s = g.verdict.cost_s
        return results
    finally:
        if sandbox is not None:
            sandbox.close()


# --- output -------------------------------------------------------------------------------------
def verdict_json(r: Result) -> dict[str, Any]:
    tr, v = r.trajectory, r.trajectory.verdict
    tm = tr.timings
    return {
        "task_id": tr.task_id, "domain": tr.domain, "episode": r.episode,
        "score": v.score if v else None, "passed": v.passed if v else None,
        "components": dict(v.components) if v else {}, "details": v.details if v else "",
        "infra_error": v.infra_error if v else None, "reward": tr.reward,
        "stop_reason": tr.stop_reason or tr.finish_reason, "turns": len(tr.turns) or 1,
        "tokens": len(tr.prompt_ids) + len(tr.completion_ids),
        "tools": [t.tool for t in tr.turns], "stats": dict(tr.stats),
        "time_s": {"gen": round(tm.get("gen_s", 0.0), 4), "sandbox": round(tm.get("env_s", 0.0) + tm.get("snapshot_s", 0.0), 4),
                   "verify": round(r.verify_s, 4)},
    }


def _cap(text: str, n: int) -> str:
    if len(text) <= n:
        return text
    return text[:n] + f"\n… [{len(text) - n} more characters]"


_CALL_RE = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def _turn_title(t: Any, tools: Sequence[Any]) -> tuple[str, str]:
    from honing.rollout.tools import parse_call

    call = parse_call(t.action_text, tools)
    if call.error:
        return "no valid tool call", ""
    args = {k: (v if not isinstance(v, str) or len(v) <= 120 else v[:120] + f"… ({len(v)} chars)")
            for k, v in dict(call.arguments or {}).items()}
    return call.name or "", json.dumps(args, ensure_ascii=False)


def render(results: Sequence[Result], console: Any, max_obs_chars: int = 1500) -> None:
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.text import Text

    from honing.rollout.tools import get_tools

    tools = get_tools()
    for r in results:
        tr = r.trajectory
        console.print(Rule(Text(f"{tr.task_id} · episode {r.episode} · {tr.domain}")))
        user = next((m["content"] for m in reversed(r.task.prompt) if m.get("role") == "user"), "")
        console.print(Panel(Text(_cap(user, 800)), title="task", title_align="left", border_style="blue"))
        if tr.turns:
            for t in tr.turns:
                name, args = _turn_title(t, tools)
                status = "parse error" if t.parse_error else ("ok" if t.ok else "failed")
                tm = t.timings
                title = (f"turn {t.index + 1} · {name} · {status} · gen {tm.get('gen_s', 0):.2f}s "
                         f"tool {tm.get('env_s', 0):.2f}s snap {tm.get('snapshot_s', 0):.3f}s")
                body = Text()
                said = _CALL_RE.sub("", t.action_text).strip() if args or name else t.action_text.strip()
                if said or not name or name == "no valid tool call":
                    body.append("assistant: ", style="bold")
                    body.append(_cap(said, 1200) + "\n")
                if args:
                    body.append(f"tool: {name} ", style="bold cyan")
                    body.append(args + "\n")
                body.append("observation: ", style="bold")
                body.append(_cap(t.observation_text.strip(), max_obs_chars)
                            + (" [truncated for context]" if t.observation_truncated else ""))
                style = "red" if (t.parse_error or not t.ok) else "green"
                console.print(Panel(body, title=title, title_align="left", border_style=style))
        else:
            console.print(Panel(Text(_cap(tr.completion_text.strip(), 3000)),
                                title=f"completion · {tr.finish_reason} · gen {tr.timings.get('gen_s', 0):.2f}s",
                                title_align="left", border_style="white"))
        j = verdict_json(r)
        ts = j["time_s"]
        line = Text()
        line.append("PASSED" if j["passed"] else ("INFRA ERROR" if j["infra_error"] else "FAILED"),
                    style="bold green" if j["passed"] else "bold red")
        line.append(f"  score {j['score']:.3f}  stop {j['stop_reason']}  tokens {j['tokens']}  turns {j['turns']}  "
                    f"time gen {ts['gen']:.2f}s / sandbox {ts['sandbox']:.2f}s / verify {ts['verify']:.2f}s")
        if j["details"]:
            line.append(f"\n  details: {_cap(str(j['details']), 300)}")
        if tr.stats:
            line.append("\n  stats: " + ", ".join(f"{k}={v}" for k, v in tr.stats.items()))
        console.print(line)
        console.print()


def summary_lines(results: Sequence[Result]) -> list[str]:
    out = []
    for r in results:
        j = verdict_json(r)
        out.append(f"{j['task_id']}#{j['episode']}  {'pass' if j['passed'] else 'fail'}  score {j['score']:.3f}  "
                   f"stop {j['stop_reason']}  turns {j['turns']}  tokens {j['tokens']}")
    n_pass = sum(bool(r.trajectory.verdict and r.trajectory.verdict.passed) for r in results)
    out.append(f"passed {n_pass}/{len(results)}")
    return out


def main(opts: RolloutOptions, show: bool, as_json: bool) -> int:
    """What `honing rollout` does; returns the exit code (3 when an episode hit an infra error)."""
    from rich.console import Console

    results = run(opts)
    if show:
        console = Console(file=sys.stderr if as_json else sys.stdout, highlight=False, soft_wrap=False)
        render(results, console, opts.max_obs_chars)
    if as_json:
        for r in results:
            print(json.dumps(verdict_json(r), default=str))
    elif not show:
        print("\n".join(summary_lines(results)))
    elif results:
        print(summary_lines(results)[-1])
    return 3 if any(r.trajectory.verdict and r.trajectory.verdict.infra_error for r in results) else 0
