"""`honing eval ...`: evaluate a model on a suite, compare two evaluations, check contamination."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console as _RichConsole

from honing.errors import HoningError
from honing.schedule.progress import bars_wanted


def Console() -> _RichConsole:
    """Wide enough for the tables when stdout is a file or pipe (rich would assume 80 columns)."""
    return _RichConsole() if sys.stdout.isatty() else _RichConsole(width=160)


def _default_out(model: str, suite: str) -> Optional[Path]:
    """A run directory keeps its evaluations next to it: runs/<name>/eval/<suite>[-step-N].json."""
    from honing.eval.runner import is_run_dir

    base, sep, step = model.rpartition("@")
    run = Path(base if sep and step.startswith("step-") else model)
    if run.is_dir() and is_run_dir(run):
        return run / "eval" / f"{Path(suite).stem}{'-' + step if sep and step.startswith('step-') else ''}.json"
    return None


def detail_lines(result: dict) -> list[str]:
    """Per domain, under the table: what multi-turn episodes did and the mean of each verdict layer."""
    from honing.eval.metrics import describe_behaviour

    lines = []
    for d, block in sorted(result["domains"].items()):
        if block.get("behaviour"):
            lines.append(f"{d} episodes: {describe_behaviour(block['behaviour'])}")
        if block.get("layers"):
            lines.append(f"{d} layers: " + "  ".join(f"{k} {v:.2f}" for k, v in block["layers"].items()))
    return lines


def eval_cmd(model: str, suite_name: str, out: Optional[Path], samples: Optional[int], seed: Optional[int],
             limit: Optional[int], show_progress: bool, engine: str = "hf", resume: bool = False) -> int:
    from honing.eval.runner import evaluate_suite, load_result, result_table, save_result
    from honing.eval.suite import load_suite
    from honing.schedule.progress import Progress

    suite = load_suite(suite_name)
    out = out or _default_out(model, suite_name)
    earlier = None
    if resume:
        if out is None or not out.is_file():
            raise HoningError(f"--resume: no earlier evaluation at {out or '(give --out FILE.json)'}")
        earlier = load_result(out)
    console = Console()
    with Progress(enabled=show_progress) as prog:
        bar: list = []

        def on_progress(done: int, total: int) -> None:
            if not bar:
                bar.append(prog.bar(f"eval {suite.name}", total))
                bar.append(0)
            while bar[1] < done:
                bar[0].advance()
                bar[1] += 1

        def keep(partial: dict) -> None:  # after every chunk: a killed evaluation keeps what it finished
            if out is not None:
                save_result(partial, out)

        result = evaluate_suite(model, suite, samples, seed, limit, on_progress, backend=engine, on_chunk=keep,
                                resume=earlier)
    if result["meta"].get("resumed_tasks"):
        console.print(f"resumed: {result['meta']['resumed_tasks']} task(s) from {out}")
    console.print(result_table(result))
    for line in detail_lines(result):
        console.print(line, highlight=False)
    t = result["meta"]["time"]
    console.print(f"time: {t['wall_s']:.0f} s (generate {t['generate_s']:.0f} s, grade {t['grade_s']:.0f} s)")
    if out is not None:
        save_result(result, out)
        console.print(f"wrote {out}")
    inc = result["meta"].get("incomplete")
    if inc:
        where = f"; partial results in {out}" if out else " (no --out given: partial results not saved)"
        raise HoningError(f"evaluation stopped after {inc['tasks_done']}/{inc['tasks_total']} tasks: "
                          f"{inc['error']}{where}")
    return 0


def compare_main(a: Path, b: Path, level: float = 0.95) -> int:
    from honing.eval.compare import compare, compare_table
    from honing.eval.runner import load_result

    cmp = compare(load_result(a), load_result(b), level)
    console = Console()
    console.print(compare_table(cmp, str(a), str(b)))
    for w in cmp["warnings"]:
        console.print(f"[yellow]note:[/yellow] {w}")
    if cmp["regressions"]:
        console.print("[bold red]significant regressions:[/bold red] "
                      + ", ".join(f"{d} ({m})" for d, m in cmp["regressions"]))
        return 1
    return 0


def contamination_main(train: list[str], suite_name: str, params: Optional[str], n: int, ngram: int,
                       threshold: float, out: Optional[Path]) -> int:
    from honing.eval.contamination import check_contamination, report_table
    from honing.eval.suite import load_suite, suite_tasks
    from honing.tasks import make_source

    try:
        parsed = json.loads(params) if params else {}
    except json.JSONDecodeError as e:
        raise HoningError(f"--params is not valid JSON: {e.msg}") from None
    sources = [make_source(name, parsed) for name in train]
    suite = load_suite(suite_name)
    report = check_contamination(sources, suite_tasks(suite).tasks, threshold, n_train=n, ngram=ngram)
    console = Console()
    console.print(report_table(report))
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
        console.print(f"wrote {out}")
    return 0


eval_app = typer.Typer(help="Evaluate a model on a suite; compare evaluations; check contamination.")


@eval_app.callback(invoke_without_command=True)
def eval_main(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", help="Model spec, run dir (runs/X or runs/X@step-N), or openai:<model>@<url>"),
    suite: str = typer.Option("quick", "--suite", help="Built-in suite name (configs/suites/) or a suite YAML path"),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the evaluation JSON here"),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Samples per task (default: the suite's)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: the suite's)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most this many tasks per source"),
    compare: Optional[tuple[str, str]] = typer.Option(None, "--compare", help="Compare two evaluation JSONs: --compare A.json B.json"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
    engine: str = typer.Option("hf", "--engine", help="Generation engine for a local model: hf, vllm or vllm-server (.venv-vllm)"),
    resume: bool = typer.Option(False, "--resume", help="Go on from the partial evaluation in --out (one that was stopped)"),
) -> None:
    """Evaluate a model on a suite's held-out tasks: pass@1, pass@k, maj@k per domain with 95% CIs."""
    if ctx.invoked_subcommand is not None:
        return
    if compare and compare[0]:
        raise typer.Exit(compare_main(Path(compare[0]), Path(compare[1])))
    if model is None:
        raise HoningError("honing eval needs --model SPEC (or a subcommand: compare, contamination)")
    if engine not in ("hf", "vllm", "vllm-server"):
        raise HoningError(f"--engine {engine!r}: hf, vllm or vllm-server")
    raise typer.Exit(eval_cmd(model, suite, out, samples, seed, limit,
                              bars_wanted(no_progress), engine, resume))


@eval_app.command("compare")
def eval_compare(
    a: Path = typer.Argument(..., help="Baseline evaluation JSON"),
    b: Path = typer.Argument(..., help="Candidate evaluation JSON"),
    level: float = typer.Option(0.95, "--level", help="Confidence level of the paired bootstrap"),
) -> None:
    """Per-domain deltas B - A with paired bootstrap CIs over shared tasks; flags significant regressions."""
    raise typer.Exit(compare_main(a, b, level))


@eval_app.command("contamination")
def eval_contamination(
    train_src: list[str] = typer.Option(..., "--train", help="Training source (repeatable): gym:<ds>, jsonl:<path>, ..."),
    suite: str = typer.Option("quick", "--suite", "--eval", help="Evaluation suite name or YAML path"),
    params: Optional[str] = typer.Option(None, "--params", help="Training source parameters as JSON"),
    n: int = typer.Option(2000, "--n", min=1, help="Training tasks scanned per source"),
    ngram: int = typer.Option(13, "--ngram", min=1, help="n-gram length (words)"),
    threshold: float = typer.Option(0.8, "--threshold", help="MinHash Jaccard threshold for near-duplicates"),
    as_json: Optional[Path] = typer.Option(None, "--out", help="Write the report as JSON here"),
) -> None:
    """n-gram and near-duplicate (MinHash LSH) overlap between training sources and a suite's tasks."""
    raise typer.Exit(contamination_main(train_src, suite, params, n, ngram, threshold, as_json))
