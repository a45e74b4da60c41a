"""`honing env check NAME`: an environment package's self-test (solvability and hygiene).

`check_environment(name_or_env, n=8)` draws tasks of both splits and checks, in order:

- package: the package loads (its entry point gives an `Environment`), with version and description;
- fields: every task drawn passes honing's field checks, its verifier resolves, its ids are unique
  within its split, and a multi-turn task's environment kind and tools resolve;
- splits: train and held-out task ids and questions are disjoint;
- hidden: no hidden value (a top-level string or number of `task.hidden`, at least 4 characters)
  appears in a prompt message or in a workspace file the model can read; for multi-turn tasks
  also in the real first observation and the real workspace after the environment's `reset`;
- reference: the reference solution of `n` tasks per split scores 1 (`Environment.reference`,
  else the hidden answer); multi-turn tasks play a scripted reference episode through the real
  agent loop in the real sandbox, and each of its tool calls must succeed (but those marked
  "train": false, shown-only turns such as a deliberate mistake that a later turn corrects);
- junk: a junk answer scores 0 (single-turn: "" and "I don't know"; multi-turn: an episode that
  says "I don't know" and then only submits);
- suite: the package's eval suite (if any) loads and yields tasks.

The report prints as a table (`EnvReport.table()`); `ok` is False if any check failed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from honing.errors import HoningError
from honing.envpkg import Environment, load_environment, register, source_of
from honing.tasks.types import SPLITS, Task

JUNK_ANSWERS = ("", "I don't know")
MIN_HIDDEN_LEN = 4


@dataclass
class Check:
    name: str
    ok: bool | None  # None: skipped (not applicable)
    detail: str = ""

    @property
    def result(self) -> str:
        return "skip" if self.ok is None else ("ok" if self.ok else "FAIL")


@dataclass
class EnvReport:
    name: str
    version: str = ""
    description: str = ""
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def table(self) -> str:
        rows = [("check", "result", "detail")] + [(c.name, c.result, c.detail) for c in self.checks]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
        lines.insert(1, "-" * max(len(x) for x in lines))
        verdict = "passed" if self.ok else f"FAILED ({len(self.failed())} of {len(self.checks)} checks)"
        lines.append(f"env:{self.name} {self.version}: {verdict}")
        return "\n".join(lines)


# --- helpers ------------------------------------------------------------------------------------
def _err(e: BaseException) -> str:
    return str(e) if isinstance(e, HoningError) else f"{type(e).__name__}: {e}"


def hidden_values(task: Task) -> dict[str, str]:
    """The hidden values a leak check looks for: top-level strings and numbers of >= 4 characters."""
    out = {}
    for k, v in task.hidden.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            continue
        s = str(v).strip()
        if len(s) >= MIN_HIDDEN_LEN:
            out[str(k)] = s
    return out


def _visible_texts(task: Task) -> list[tuple[str, str]]:
    """(where, text) of everything the model reads before acting: prompt messages, workspace files."""
    out = [(f"prompt[{i}] ({m.get('role')})", str(m.get("content", ""))) for i, m in enumerate(task.prompt)]
    for name, data in dict((task.environment or {}).get("files") or {}).items():
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data)
        out.append((f"file {name}", text))
    return out


def find_leak(task: Task, texts: Iterable[tuple[str, str]] | None = None) -> str:
    """'' when no hidden value of `task` appears in `texts` (default: its prompt and files)."""
    values = hidden_values(task)
    if not values:
        return ""
    for where, text in (texts if texts is not None else _visible_texts(task)):
        for key, value in values.items():
            if value in text:
                return f"task {task.id}: hidden[{key!r}] ({value[:40]!r}) appears in {where}"
    return ""


def _draw(env: Environment, split: str, seed: int, k: int) -> list[Task]:
    return list(itertools.islice(source_of(env).tasks(split, seed), k))


def _check_task_parts(task: Task) -> str:
    """'' or what is wrong beyond the field checks: verifier, environment kind, tools, files."""
    from honing.verify import get_verifier

    try:
        get_verifier(task.verifier.name)
    except HoningError as e:
        return f"task {task.id}: {e}"
    if task.environment is None:
        return ""
    env = dict(task.environment)
    files = env.get("files") or {}
    if not isinstance(files, Mapping) or not all(isinstance(k, str) and isinstance(v, (str, bytes))
                                                  for k, v in files.items()):
        return f"task {task.id}: environment['files'] must map file names to str or bytes"
    from honing.rollout.env import make_environment
    from honing.rollout.tools import get_tools

    try:
        if "tools" in env:
            get_tools(env["tools"])
        make_environment(task)
    except (ValueError, HoningError) as e:
        return f"task {task.id}: environment: {e}"
    return ""


def reference_of(env: Environment, task: Task) -> Any:
    """The package's reference for `task`: a completion, or a list of assistant turns (multi-turn)."""
    if env.reference is not None:
        return env.reference(task)
    if task.environment is not None:
        from honing.rollout.show import reference_script

        try:
            return reference_script(task)
        except HoningError:
            raise HoningError(f"task {task.id}: multi-turn, and the package gives no reference episode "
                              "(set Environment.reference to a fn(task) -> list of assistant turns)") from None
    if "answer" not in task.hidden:
        raise HoningError(f"task {task.id}: no hidden 'answer' and no Environment.reference to solve it")
    return str(task.hidden["answer"])


class Replies(list):
    """A reference episode's reply texts, and the turns that are shown but not trained on
    (`shown_only`: played in the episode, the model sees them and their observations in its
    context, but an SFT demonstration's loss mask is 0 on them; e.g. a deliberately wrong first
    attempt whose observation the trained turn then corrects)."""

    shown_only: frozenset[int] = frozenset()


def script_of(ref: Any, where: str) -> Replies:
    """A reference episode as reply texts: each turn raw text or {"name": tool, "arguments": {...}},
    a tool call optionally with "train": False (shown, not trained on: `Replies.shown_only`)."""
    from honing.rollout.show import tool_call

    turns = [ref] if isinstance(ref, (str, Mapping)) else list(ref)
    out = Replies()
    shown: set[int] = set()
    for i, t in enumerate(turns):
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, Mapping) and isinstance(t.get("name"), str):
            out.append(tool_call(t["name"], **dict(t.get("arguments") or {})))
            train = t.get("train", True)
            if not isinstance(train, bool):
                raise HoningError(f"{where}: turn {i} of the reference episode: 'train' must be true or false, "
                                  f"got {train!r}")
            if not train:
                shown.add(i)
        else:
            raise HoningError(f"{where}: turn {i} of the reference episode must be text or "
                              f"{{'name': tool, 'arguments': {{...}}}}, got {type(t).__name__}")
    if not out:
        raise HoningError(f"{where}: the reference episode has no turns")
    if len(shown) == len(out):
        raise HoningError(f"{where}: every turn of the reference episode is marked train: false")
    out.shown_only = frozenset(shown)
    return out


@dataclass
class _Episode:
    task: Task
    script: list[str]
    trajectory: Any = None
    leak: str = ""


def _run_episodes(items: Sequence[_Episode], tok: Any, sandbox: Any, check_leaks: bool) -> None:
    """Play each item's script as a multi-turn episode in its own sandbox session (the real loop).
    Episodes whose prompts coincide run in separate rounds, so each gets its own script."""
    from honing.engine import SamplingParams
    from honing.rollout.env import make_environment
    from honing.rollout.multiturn import ChatFormat, Episode, MultiTurnConfig, ScriptedEngine, run_episodes, \
        workspace_files
    from honing.rollout.show import RoutedEngine

    cfg = MultiTurnConfig(max_turns=64, context_tokens=1 << 20, max_total_tokens=1 << 22)
    fmt = ChatFormat(tok)
    params = SamplingParams(max_new_tokens=1 << 14, temperature=0.0, n=1)
    eps: list[tuple[_Episode, Any]] = []
    try:
        for it in items:
            env_cfg = dict(it.task.environment or {})
            tcfg = replace(cfg, max_turns=max(int(env_cfg.get("max_turns", cfg.max_turns)), 1))
            session = sandbox.open(cfg.profile, limits=cfg.session_limits)
            try:
                e = Episode(it.task, session, make_environment(it.task), fmt, tcfg)
            except BaseException:
                session.close()
                raise
            eps.append((it, e))
            if check_leaks:
                seen = [(f"message[{i}] ({m.get('role')}) after reset", m.get("content", ""))
                        for i, m in enumerate(e.messages)]
                seen += [(f"workspace file {k} after reset", v) for k, v in workspace_files(session).items()]
                it.leak = find_leak(it.task, seen)
        rounds: list[list[tuple[_Episode, Any]]] = []
        for pair in eps:
            key = tuple(pair[1].prompt_ids)
            for r in rounds:
                if all(tuple(o[1].prompt_ids) != key for o in r):
                    r.append(pair)
                    break
            else:
                rounds.append([pair])
        for r in rounds:
            engine = RoutedEngine([(tuple(e.prompt_ids), ScriptedEngine(tok, it.script)) for it, e in r])
            run_episodes(engine, tok, [e for _, e in r], params, cfg, seed=0, max_workers=sandbox.max_concurrency)
        for it, e in eps:
            it.trajectory = e.to_trajectory(0)
    finally:
        for _, e in eps:
            e.session.close()


def _first(problems: Sequence[str]) -> str:
    return problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "") if problems else ""


def _score_line(task: Task, verdict: Any) -> str:
    return f"task {task.id}: score {verdict.score:g} ({str(verdict.details)[:120]})"


# --- the check ----------------------------------------------------------------------------------
def check_environment(name_or_env: str | Environment, n: int = 8, *, model: str = "tiny-random",
                      backend: str = "bwrap", seeds: tuple[int, int] | None = None) -> EnvReport:
    """Run an environment package's self-test; see the module docstring. `model` names the
    tokenizer the multi-turn episodes are rendered with; `backend` the sandbox backend."""
    from honing.config import TasksConfig
    from honing.verify import VerifyContext, get_verifier, grade

    if n < 1:
        raise HoningError("--n must be at least 1")
    label = name_or_env.name if isinstance(name_or_env, Environment) else str(name_or_env).removeprefix("env:")
    report = EnvReport(label)
    add = report.checks.append
    try:
        env = register(name_or_env) if isinstance(name_or_env, Environment) else load_environment(label)
    except HoningError:
        raise  # an unknown name is a user error: the CLI prints it (with the nearest names)
    except Exception as e:  # noqa: BLE001 - the package's own code failed
        add(Check("package", False, _err(e)))
        return report
    report.version, report.description = env.version, env.description
    problems = [p for p in (
        "" if env.description.strip() else "no description",
        "" if env.version and env.version != "0.0.0" else "no version") if p]
    add(Check("package", not problems, "; ".join(problems) or f"{env.version}: {env.description[:100]}"))

    # fields
    defaults = TasksConfig()
    seed_of = dict(zip(SPLITS, seeds or (defaults.train_seed, defaults.heldout_seed)))
    pool = max(n, 64)
    drawn: dict[str, list[Task]] = {}
    try:
        for split in SPLITS:
            drawn[split] = _draw(env, split, seed_of[split], pool)
    except Exception as e:  # noqa: BLE001 - a malformed task (TaskError) or the generator crashed
        add(Check("fields", False, _err(e)))
        return report
    problem = ""
    for split, tasks in drawn.items():
        if not tasks:
            problem = f"the {split} split yields no tasks"
            break
        ids = [t.id for t in tasks]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup is not None:
            problem = f"{split}: task id {dup!r} occurs more than once"
            break
        problem = next((p for p in map(_check_task_parts, tasks) if p), "")
        if problem:
            break
    train, held = drawn.get("train", []), drawn.get("heldout", [])
    add(Check("fields", not problem, problem or f"{len(train)} train + {len(held)} held-out tasks well-formed"))
    if problem:
        return report

    # splits
    same_ids = {t.id for t in train} & {t.id for t in held}
    same_q = {t.question for t in train} & {t.question for t in held}
    detail = (f"task id {sorted(same_ids)[0]!r} is in both splits" if same_ids else
              f"question {sorted(same_q)[0][:60]!r} is in both splits" if same_q else
              "train and held-out ids and questions disjoint")
    add(Check("splits", not (same_ids or same_q), detail))

    # hidden (static part; the multi-turn reference run adds what reset really shows)
    leak = next((x for x in map(find_leak, train + held) if x), "")
    n_hidden = sum(bool(hidden_values(t)) for t in train + held)
    static_hidden = Check("hidden", not leak, leak or f"no hidden value in prompts or files ({n_hidden} tasks "
                                                       "with hidden values of >= 4 characters)")

    # reference and junk
    graded = train[:n] + held[:n]
    single = [t for t in graded if t.environment is None]
    multi = [t for t in graded if t.environment is not None]
    sandbox = None
    ref_fail: list[str] = []
    junk_fail: list[str] = []
    dyn_leak = ""
    junk_ran = False
    try:
        needs_box = bool(multi) or any(getattr(get_verifier(t.verifier.name), "needs_sandbox", False) for t in graded)
        if needs_box:
            from honing.sandbox import Sandbox

            sandbox = Sandbox(backend)
        ctx = VerifyContext("auto", 0.0, {"sandbox": sandbox} if sandbox is not None else {})
        for t in single:
            try:
                ref = reference_of(env, t)
                if not isinstance(ref, str):
                    raise HoningError(f"task {t.id}: the reference of a single-turn task must be a string, "
                                      f"got {type(ref).__name__}")
                v = grade(t, ref, ctx)
            except Exception as e:  # noqa: BLE001 - the package's reference solver or verifier
                ref_fail.append(_err(e))
                continue
            if v.infra_error or v.score < 1.0:
                ref_fail.append(_score_line(t, v) if not v.infra_error else f"task {t.id}: {v.details}")
            for junk in JUNK_ANSWERS:
                try:
                    j = grade(t, junk, ctx)
                except Exception as e:  # noqa: BLE001
                    junk_fail.append(f"task {t.id}: junk answer {junk!r}: {_err(e)}")
                    continue
                if j.infra_error or j.score != 0:
                    junk_fail.append(f"task {t.id}: junk answer {junk!r} scores {j.score:g} ({str(j.details)[:80]})")
        if multi:
            from honing.models import load_tokenizer

            tok = load_tokenizer(model)
            refs, junks = [], []
            for t in multi:
                try:
                    refs.append(_Episode(t, script_of(reference_of(env, t), f"task {t.id}")))
                except Exception as e:  # noqa: BLE001
                    ref_fail.append(_err(e))
                junks.append(_Episode(t, ["I don't know"]))
            _run_episodes(refs, tok, sandbox, check_leaks=True)
            _run_episodes(junks, tok, sandbox, check_leaks=False)
            dyn_leak = next((it.leak for it in refs if it.leak), "")
            verdicts = [grade(it.task, it.trajectory, ctx) for it in refs + junks]
            for it, v in zip(refs, verdicts[: len(refs)]):
                turns = it.trajectory.turns[: len(it.script)]
                shown = getattr(it.script, "shown_only", frozenset())  # deliberately wrong turns may fail
                bad = [k for k, turn in enumerate(turns) if k not in shown and (turn.parse_error or not turn.ok)]
                if v.infra_error or v.score < 1.0:
                    ref_fail.append(_score_line(it.task, v) + f", stop {it.trajectory.stop_reason}")
                elif bad:
                    turn = turns[bad[0]]
                    ref_fail.append(f"task {it.task.id}: reference turn {bad[0] + 1} ({turn.tool or 'no tool'}) "
                                    f"failed: {turn.observation_text[:100]!r}")
            for it, v in zip(junks, verdicts[len(refs):]):
                if v.infra_error or v.score != 0:
                    junk_fail.append(f"task {it.task.id}: an empty episode scores {v.score:g} ({str(v.details)[:80]})")
        junk_ran = True
    except Exception as e:  # noqa: BLE001 - the sandbox, the verifier or the environment broke
        ref_fail.append(_err(e))
    finally:
        if sandbox is not None:
            sandbox.close()
    if dyn_leak and static_hidden.ok:
        static_hidden = Check("hidden", False, dyn_leak)
    report.checks.append(static_hidden)
    kind = f"{len(single)} single-turn" if not multi else (f"{len(multi)} multi-turn episodes" + (
        f" + {len(single)} single-turn" if single else ""))
    add(Check("reference", not ref_fail,
              _first(ref_fail) or f"{len(graded)}/{len(graded)} score 1 ({kind}, both splits)"))
    junk_what = "'' and \"I don't know\"" if single else "empty episodes"
    if not junk_ran and not junk_fail:
        add(Check("junk", None, "not run: grading stopped (see reference)"))
    else:
        add(Check("junk", not junk_fail,
                  _first(junk_fail) or f"{junk_what} score 0 on {len(graded)}/{len(graded)} tasks"))

    # suite
    if env.eval_suite:
        add(_check_suite(env))
    else:
        add(Check("suite", None, "no eval suite (optional: Environment.eval_suite)"))
    return report


def suite_path(env: Environment) -> Path | None:
    if not env.eval_suite:
        return None
    p = Path(env.eval_suite)
    return p if p.is_absolute() or env.package_dir is None else env.package_dir / p


def _check_suite(env: Environment) -> Check:
    from honing.eval.suite import load_suite, suite_tasks

    path = suite_path(env)
    try:
        suite = load_suite(str(path))
        got = suite_tasks(suite, limit=2)
    except Exception as e:  # noqa: BLE001
        return Check("suite", False, f"{path}: {_err(e)}")
    if not got.tasks:
        return Check("suite", False, f"{path}: yields no tasks")
    return Check("suite", True, f"{suite.label} loads ({len(suite.sources)} source(s)): {path}")
