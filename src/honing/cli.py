"""The `honing` command. User errors print one line naming the problem and exit 2."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from honing.envcli import env_app
from honing.errors import HoningError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="honing: RL post-training for language models.")
tasks_app = typer.Typer(help="Look at task domains and sources.")
app.add_typer(tasks_app, name="tasks")
from honing.sandbox.cli import sandbox_app  # noqa: E402 - `honing sandbox ...`

app.add_typer(sandbox_app, name="sandbox")
app.add_typer(env_app, name="env")
from honing.eval.cli import eval_app  # noqa: E402 - `honing eval ...`

app.add_typer(eval_app, name="eval")
from honing.release.cli import export_cmd, release_app  # noqa: E402 - issue 20: releases, export, serve
from honing.serve.cli import serve_cmd  # noqa: E402

app.add_typer(release_app, name="release")
app.command("export")(export_cmd)
app.command("serve")(serve_cmd)
from honing.flywheel.cli import flywheel_app  # noqa: E402 - the data flywheel (issue 20)
app.add_typer(flywheel_app, name="flywheel")


@app.command(context_settings={"allow_extra_args": False})
def train(
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides, e.g. train.learning_rate=2e-5"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Recipe path or name in configs/ (default: quickstart)"),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: runs/<name>)"),
    help_config: bool = typer.Option(False, "--help-config", help="Print every config key with its help and exit"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars: one plain line per step instead"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars and no per-step lines"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this directory where it stopped"),
    from_step: Optional[int] = typer.Option(None, "--from-step", help="With --resume: go back to this checkpoint step"),
    steps: Optional[int] = typer.Option(None, "--steps", help="With --resume: train to this many RL steps in all "
                                        "(more than the run had: a finished run goes on)"),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Train data-parallel on N ranks of this machine (FSDP2 "
                                        "over torch.distributed, torchrun underneath; rank 0 runs the rest)"),
) -> None:
    """Train a policy with GRPO on verifiable tasks (default recipe: configs/quickstart.yaml)."""
    from honing.config import help_config as help_lines, load_config

    if nproc is not None or os.environ.get(NPROC_DIR_ENV):  # `--nproc N`, or one of its ranks
        from honing.train import distributed as dp, launch

        if launch.join_as_rank():  # a follower rank: it only trains, on rank 0's word
            dp.follow()
            dp.teardown()
            return
        if nproc is not None:
            launch.check_nproc(nproc, launch.available_cores(), launch.gpu_count())  # before anything starts
    if help_config:
        typer.echo("\n".join(help_lines()))
        return
    if resume is not None:
        if config or overrides or out:
            raise HoningError("--resume takes the run's own config.yaml; drop --config, --out and overrides")
        if not (resume / "config.yaml").is_file():
            raise HoningError(f"--resume {resume}: no config.yaml there (is it a run directory?)")
        config = str(resume / "config.yaml")
        overrides = [f"train.steps={steps}"] if steps is not None else []
    elif from_step is not None or steps is not None:
        raise HoningError(f"{'--from-step' if from_step is not None else '--steps'} needs --resume <run directory>")
    cfg, path = load_config(config, overrides or [])
    if steps is not None and cfg.stages:  # each stage is a run of its own; extend one, not the recipe
        from honing.schedule.stages import stage_dir

        rl = [stage_dir(resume, i, st) for i, st in enumerate(cfg.stages) if st.kind == "rl"]
        hint = f": extend its last RL stage with honing train --resume {rl[-1]} --steps {steps}" if rl else ""
        raise HoningError(f"--steps is for one run, and {resume} is a staged recipe{hint}")
    if nproc is not None and nproc > 1:
        raise typer.Exit(launch.run_ranks(nproc, sys.argv[1:]))
    from honing import api
    from honing.schedule.loop import StoppedEarly, default_run_dir
    from honing.train.distributed import releasing_followers

    run_dir = resume or out or default_run_dir(cfg, path.stem)
    bars = _bars_wanted(no_progress or quiet)

    def announce() -> None:  # after the start-up checks, before the run starts
        verb = "resuming" if resume else "recipe"
        typer.echo(f"honing train: {verb} {path}, model {cfg.model.name}, run directory {run_dir}", err=True)

    # the CLI is the Python API's `honing.train` with a recipe, plus the table below
    with releasing_followers(clean_stops=(StoppedEarly,)):  # --nproc N (rank 0); nothing in one process
        summary = api.train(cfg, out=run_dir, show_progress=bars, resume=resume is not None, from_step=from_step,
                            plain_progress=not bars and not quiet, on_start=announce)  # nohup, CI: a line per step
    if "stages" in summary:  # a staged recipe (stages:): one line per stage
        from honing.schedule.stages import stage_table

        typer.echo("\n".join(["", f"run directory   {run_dir}", *stage_table(summary),
                              *_domain_lines(summary.get("heldout_ci") or {}),
                              f"wall time       {summary['wall_s']:.0f} s",
                              f"checkpoint      {summary['final_checkpoint']}"]))
        return
    b, a = summary["heldout_before"], summary["heldout_after"]
    lines = [
        "",
        f"run directory   {run_dir}",
        f"held-out tasks  {a['n_tasks']}",
        f"pass@1          {b['pass@1']:.3f} -> {a['pass@1']:.3f}",
        f"mean reward     {b['mean_reward']:.3f} -> {a['mean_reward']:.3f}",
    ]
    if summary.get("heldout_after_sft"):
        lines.insert(3, f"after SFT       pass@1 {summary['heldout_after_sft']['pass@1']:.3f}")
    lines += _ci_lines(summary.get("heldout_ci") or {})
    lines += _domain_lines(summary.get("heldout_ci") or {})
    lines += _behaviour_lines(summary)
    lines += [f"steps           {summary['steps']}", f"wall time       {summary['wall_s']:.0f} s",
              f"samples/s (RL)  {summary['samples_per_s']:.2f}", f"checkpoint      {summary['final_checkpoint']}"]
    if summary.get("health_events"):  # the run-health monitor (honing report RUN lists them)
        names = sorted({e["name"] for e in summary["health_events"]})
        lines.append(f"health events   {len(summary['health_events'])} ({', '.join(names)})")
    typer.echo("\n".join(lines))


@app.command("sft", context_settings={"allow_extra_args": False})
def sft_cmd(
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides, e.g. sft.steps=200"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Recipe path or name in configs/ (default: quickstart)"),
    data: Optional[str] = typer.Option(None, "--data", help="Demonstrations: reference, rejection, teacher:SPEC "
                                       "(model spec, or http://HOST/v1#MODEL) or file:PATH (JSONL/Parquet transcripts)"),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: runs/<name>)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars: plain lines instead"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars and no per-step lines"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the SFT run in this directory"),
) -> None:
    """Supervised fine-tuning on graded demonstrations: a recipe's SFT stage alone (train.steps=0).

    Writes a run directory like `honing train` (demos.jsonl with every demonstration's source and
    verdict, checkpoints/sft); start RL from it with `honing train model.name=<run>/checkpoints/sft`."""
    from honing.config import load_config

    if resume is not None:
        if config or overrides or out or data:
            raise HoningError("--resume takes the run's own config.yaml; drop --config, --data, --out and overrides")
        if not (resume / "config.yaml").is_file():
            raise HoningError(f"--resume {resume}: no config.yaml there (is it a run directory?)")
        config = str(resume / "config.yaml")
    extra = [f"sft.source={data}"] if data else []
    cfg, path = load_config(config, [*(overrides or []), *extra, "train.steps=0"])
    if cfg.sft.steps == 0:
        raise HoningError(f"sft.steps is 0 in {path}: nothing to train (set sft.steps=N)")
    from honing import api
    from honing.schedule.loop import default_run_dir

    run_dir = resume or out or default_run_dir(cfg, f"{path.stem}-sft")
    bars = _bars_wanted(no_progress or quiet)
    summary = api.train(cfg, out=run_dir, show_progress=bars, resume=resume is not None,
                        plain_progress=not bars and not quiet,
                        on_start=lambda: typer.echo(f"honing sft: {path}, demonstrations {cfg.sft.source}, "
                                                    f"model {cfg.model.name}, run directory {run_dir}", err=True))
    b, a = summary["heldout_before"], summary["heldout_after_sft"] or summary["heldout_after"]
    counts = (summary.get("sft") or {}).get("counts", {})
    typer.echo("\n".join([
        "", f"run directory   {run_dir}", f"demonstrations  {cfg.sft.source}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        f"held-out tasks  {a['n_tasks']}", f"pass@1          {b['pass@1']:.3f} -> {a['pass@1']:.3f}",
        f"mean reward     {b['mean_reward']:.3f} -> {a['mean_reward']:.3f}",
        *_ci_lines(summary.get("heldout_ci") or {}), *_domain_lines(summary.get("heldout_ci") or {}),
        f"wall time       {summary['wall_s']:.0f} s", f"checkpoint      {summary['final_checkpoint']}"]))


def _ci_lines(ci: dict) -> list[str]:
    """The held-out stages' pass@1 with 95% CIs and their paired differences (summary heldout_ci)."""
    stages = " ".join(f"{k} {m:.3f} [{lo:.3f}, {hi:.3f}]" for k, (m, lo, hi) in ci.get("pass@1", {}).items())
    deltas = " ".join(f"{k} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for k, (d, lo, hi) in ci.get("delta", {}).items())
    rewards = " ".join(f"{k} {m:.3f} [{lo:.3f}, {hi:.3f}]" for k, (m, lo, hi) in ci.get("mean_reward", {}).items())
    r_deltas = " ".join(f"{k} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for k, (d, lo, hi) in ci.get("reward_delta", {}).items())
    return (([f"pass@1 95% CI   {stages}"] if stages else []) + ([f"paired delta    {deltas}"] if deltas else [])
            + ([f"reward 95% CI   {rewards}"] if rewards else []) + ([f"reward delta    {r_deltas}"] if r_deltas else []))


def _domain_lines(ci: dict) -> list[str]:
    """A mixed run's held-out pass@1 per domain at each stage, with the paired change of the last stage
    (summary heldout_ci's per_domain); REGRESSED where a change's whole CI lies below zero."""
    from honing.eval.metrics import domain_rows

    rows = domain_rows(ci)
    if not rows:
        return []
    lines = ["held-out by domain: pass@1 [95% CI] per stage; paired change of the last stage"]
    for r in rows:
        stages = " -> ".join(f"{k} {m:.3f} [{lo:.3f}, {hi:.3f}]" for k, (m, lo, hi) in r["pass@1"].items())
        changes = ", ".join(f"{k} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for k, (d, lo, hi) in r["changes"].items())
        flag = "  REGRESSED" if r["regressed"] else ""
        lines.append(f"  {r['domain']} ({r['tasks']} tasks): {stages}" + (f"; {changes}" if changes else "") + flag)
    return lines


def _behaviour_lines(summary: dict) -> list[str]:
    """Multi-turn domains: what the held-out episodes did at each evaluation (before -> after SFT -> after)."""
    evals = [e.get("per_domain_behaviour") or {} for e in (summary.get("heldout_before"),
                                                           summary.get("heldout_after_sft"),
                                                           summary.get("heldout_after")) if e]
    lines = []
    for d in sorted({d for e in evals for d, b in e.items() if b}):
        cells = []
        for key, label in (("valid_tool_call", "valid tool call"), ("ran_tests", "ran tests"),
                           ("passed_after_failing_tests", "passed after a failing test run")):
            vals = [(e.get(d) or {}).get(key) for e in evals]
            cells.append(f"{label} " + " -> ".join("-" if v is None else f"{v:.2f}" for v in vals))
        lines.append(f"{d} episodes".ljust(16) + "  ".join(cells))
    return lines


def _bars_wanted(disabled: bool) -> bool:
    from honing.schedule.progress import bars_wanted

    return bars_wanted(disabled)


@tasks_app.command("list")
def tasks_list(contains: Optional[str] = typer.Argument(None, help="Only names containing this")) -> None:
    """List the reasoning-gym domains usable as gym:<name>."""
    from honing.tasks import gym_dataset_names

    for n in gym_dataset_names():
        if not contains or contains in n:
            typer.echo(f"gym:{n}")


@tasks_app.command("show")
def tasks_show(
    name: str = typer.Argument(..., help="Source: gym:<dataset> or jsonl:<path>"),
    n: int = typer.Option(3, "--n", help="How many tasks"),
    split: str = typer.Option("train", "--split", help="train or heldout"),
    params: Optional[str] = typer.Option(None, "--params", help="Source parameters as JSON"),
    as_json: bool = typer.Option(False, "--json", help="One task per line, the format `honing verify --task` reads"),
) -> None:
    """Show a few tasks of a source: the prompt, and the hidden fields marked as hidden."""
    from honing.tasks import make_source, task_to_json

    try:
        parsed = json.loads(params) if params else {}
    except json.JSONDecodeError as e:
        raise HoningError(f"--params is not valid JSON: {e.msg}") from None
    src = make_source(name, parsed)
    for i, t in enumerate(src.tasks(split, 0)):
        if i >= n:
            break
        if as_json:
            typer.echo(json.dumps(task_to_json(t), default=str))
            continue
        typer.echo(f"── {t.id}  (verifier {t.verifier.name})")
        for m in t.prompt:
            typer.echo(f"[{m['role']}] {m['content']}")
        for k, v in t.hidden.items():
            typer.echo(f"[hidden {k}] {str(v)[:200]}")


@tasks_app.command("validate")
def tasks_validate(path: Path = typer.Argument(..., help="A JSONL task file")) -> None:
    """Check a user JSONL task file line by line; report the first problem with file:line."""
    from honing.tasks import JsonlSource
    from honing.verify import get_verifier

    src = JsonlSource(str(path))
    count, verifiers = 0, set()
    for split in ("train", "heldout"):
        for t in src.tasks(split, 0):
            count += 1
            verifiers.add(t.verifier.name)
    for v in sorted(verifiers):
        get_verifier(v)
    typer.echo(f"{path}: {count} tasks OK (verifiers: {', '.join(sorted(verifiers)) or '-'})")


MAX_COMPLETION_BYTES = 1 << 20


def _read_completion(ref: str) -> str:
    raw = sys.stdin.buffer.read(MAX_COMPLETION_BYTES + 1) if ref == "-" else _read_file_bytes(ref)
    if len(raw) > MAX_COMPLETION_BYTES:
        raise HoningError(f"completion {ref}: larger than {MAX_COMPLETION_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HoningError(f"completion {ref}: not UTF-8 (byte {e.start})") from None


def _read_file_bytes(ref: str) -> bytes:
    p = Path(ref)
    if not p.is_file():
        raise HoningError(f"completion file not found: {ref}")
    with p.open("rb") as f:
        return f.read(MAX_COMPLETION_BYTES + 1)


@app.command("verify")
def verify_cmd(
    completion: Optional[str] = typer.Option(None, "--completion", help="File with the completion, or - for stdin"),
    task: Optional[Path] = typer.Option(None, "--task", help="A task as JSON (one line of `honing tasks show --json`)"),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Verifier name, with --reference instead of --task"),
    reference: Optional[str] = typer.Option(None, "--reference", help="Reference answer for --verifier"),
    extractor: str = typer.Option("auto", "--extractor", help="auto (the verifier's own), answer_tag, boxed, last_number, full"),
    batch: Optional[Path] = typer.Option(None, "--batch", help="JSONL of cases, each {completion, reference} (with --verifier) "
                                         "or {completion, task}; prints one verdict line per case"),
) -> None:
    """Grade one completion (or a --batch of them) and print the Verdict as JSON."""
    from honing.tasks import Task, VerifierSpec, task_from_json
    from honing.verify import VerifyContext, get_verifier, grade

    if extractor not in ("auto", "answer_tag", "boxed", "last_number", "full"):
        raise HoningError(f"unknown extractor '{extractor}' (auto, answer_tag, boxed, last_number, full)")
    if verifier is not None:
        get_verifier(verifier)

    def ref_task(ref: str) -> Task:
        return Task(id="cli", domain="cli", prompt=({"role": "user", "content": ""},), verifier=VerifierSpec(verifier),
                    hidden={"answer": ref})

    if batch is not None:
        if completion is not None or task is not None or reference is not None:
            raise HoningError("--batch takes completions and references from the file; drop --completion/--task/--reference")
        cases = _read_batch(batch, need_reference=verifier is not None)
        ctx = VerifyContext(extractor)
        infra = 0
        for n, case in cases:
            t = ref_task(case["reference"]) if verifier is not None else task_from_json(case["task"], f"{batch}:{n}")
            v = grade(t, case["completion"], ctx)
            infra += v.infra_error
            typer.echo(json.dumps({"line": n, **_verdict_json(v)}))
        if infra:
            raise typer.Exit(3)
        return
    if completion is None:
        raise HoningError("give --completion FILE (or - for stdin), or --batch FILE.jsonl")
    if (task is None) == (verifier is None):
        raise HoningError("give either --task TASK.json or --verifier NAME --reference ANSWER")
    if task is not None:
        if not task.is_file():
            raise HoningError(f"task file not found: {task}")
        try:
            obj = json.loads(task.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HoningError(f"{task}: not valid JSON: {e}") from None
        t = task_from_json(obj, str(task))
    else:
        if reference is None:
            raise HoningError("--verifier needs --reference ANSWER")
        t = ref_task(reference)
    get_verifier(t.verifier.name)
    v = grade(t, _read_completion(completion), VerifyContext(extractor))
    typer.echo(json.dumps(_verdict_json(v), indent=1))
    if v.infra_error:
        raise typer.Exit(3)


def _verdict_json(v: object) -> dict:
    return {"score": v.score, "passed": v.passed, "components": dict(v.components),  # type: ignore[attr-defined]
            "details": v.details, "infra_error": v.infra_error, "cost_s": round(v.cost_s, 6)}  # type: ignore[attr-defined]


def _read_batch(path: Path, need_reference: bool) -> list[tuple[int, dict]]:
    """Every case of a --batch file, checked before any is graded (errors name file:line)."""
    if not path.is_file():
        raise HoningError(f"batch file not found: {path}")
    key = "reference" if need_reference else "task"
    cases = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                case = json.loads(raw.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise HoningError(f"{path}:{n}: not valid JSON: {e}") from None
            if not isinstance(case, dict):
                raise HoningError(f"{path}:{n}: expected an object with 'completion' and '{key}'")
            for k in ("completion", key):
                if k not in case:
                    raise HoningError(f"{path}:{n}: missing key '{k}'")
            if not isinstance(case["completion"], str) or (need_reference and not isinstance(case[key], (str, int, float))):
                raise HoningError(f"{path}:{n}: 'completion' must be a string and '{key}' a string or number")
            if need_reference:
                case["reference"] = str(case["reference"])
            if len(case["completion"].encode()) > MAX_COMPLETION_BYTES:
                raise HoningError(f"{path}:{n}: completion larger than {MAX_COMPLETION_BYTES} bytes")
            cases.append((n, case))
    return cases


@app.command("rollout")
def rollout_cmd(
    task: Optional[str] = typer.Option(None, "--task", help="Task domain/source, e.g. repair or gym:basic_arithmetic"),
    task_file: Optional[Path] = typer.Option(None, "--task-file", help="One task as JSON (`honing tasks show --json`)"),
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="Model spec (tokenizer only for scripted policies)"),
    policy: str = typer.Option("model", "--policy", help="model, reference, or scripted:FILE.jsonl (one turn per line)"),
    n: int = typer.Option(1, "--n", help="How many tasks of the domain"),
    samples: int = typer.Option(1, "--samples", help="Episodes per task"),
    split: str = typer.Option("train", "--split", help="train or heldout"),
    seed: int = typer.Option(0, "--seed"),
    params: Optional[str] = typer.Option(None, "--params", help="Source parameters as JSON"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens"),
    temperature: float = typer.Option(1.0, "--temperature"),
    extractor: str = typer.Option("auto", "--extractor", help="Answer extractor for single-turn tasks"),
    backend: str = typer.Option("bwrap", "--backend", help="Sandbox backend for multi-turn tasks"),
    show: bool = typer.Option(False, "--show", help="Print each trajectory readably (turns, tools, observations)"),
    as_json: bool = typer.Option(False, "--json", help="Print each trajectory's verdict as one JSON line"),
    engine: str = typer.Option("hf", "--engine", help="Generation engine for --policy model: hf, vllm or vllm-server (.venv-vllm)"),
) -> None:
    """Run a few episodes with a model or scripted policy, grade them, and show what happened."""
    from honing.rollout.show import RolloutOptions, main as rollout_main

    try:
        parsed = json.loads(params) if params else {}
    except json.JSONDecodeError as e:
        raise HoningError(f"--params is not valid JSON: {e.msg}") from None
    if engine not in ("hf", "vllm", "vllm-server"):
        raise HoningError(f"--engine {engine!r}: hf, vllm or vllm-server")
    opts = RolloutOptions(task, task_file, model, policy, n, samples, split, seed, parsed, max_turns, max_new_tokens,
                          temperature, extractor, backend, engine=engine)
    raise typer.Exit(rollout_main(opts, show, as_json))


@app.command("workers")
def workers_cmd(
    run_dir: Path = typer.Argument(..., help="Run directory of a run with schedule.workers=ray"),
    rollout: int = typer.Option(..., "--rollout", help="How many rollout actors the run should have"),
) -> None:
    """Resize a run's Ray rollout pool while it trains: writes RUN_DIR/workers.json, which the run reads
    about once a second. New actors get work from the next request; removed ones finish their current
    request first. Events go to RUN_DIR/workers.log; a resumed run starts with the size asked here."""
    from honing.schedule.pool import request_size

    typer.echo(f"asked {run_dir} for {rollout} rollout worker(s): {request_size(run_dir, rollout)}")


@app.command("report")
def report_cmd(
    target: Path = typer.Argument(..., help="A run directory or an evaluation JSON"),
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file (default: <run>/report.html or <eval>.html)"),
    evals: Optional[list[Path]] = typer.Option(None, "--eval", help="Extra evaluation JSONs to include (repeatable)"),
) -> None:
    """Write a self-contained report.html: curves, per-domain tables, pass@k, trajectory browser."""
    from honing.eval.report import write_report

    typer.echo(str(write_report(target, out, evals or [])))


NPROC_DIR_ENV = "HONING_NPROC_DIR"  # set for the ranks of `honing train --nproc N` (launch.CHILD_ENV)


def main() -> None:
    try:
        _main()
    except SystemExit as e:
        _note_rank_exit(e.code)
        raise
    _note_rank_exit(0)


def _note_rank_exit(code: object) -> None:
    if os.environ.get(NPROC_DIR_ENV):  # a rank of `--nproc N`: rank 0's code goes to the launcher
        from honing.train.launch import exit_rank

        exit_rank(code)


def _main() -> None:
    try:
        app()
    except HoningError as e:
        print(f"honing: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("honing: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # a clean stop on Ctrl-C / SIGTERM
        if type(e).__name__ != "StoppedEarly":
            raise
        print(f"honing: {e}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
