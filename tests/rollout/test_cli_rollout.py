"""`honing rollout` through the console script: scripted and reference policies on repair tasks
(sandbox: skipped without bwrap), a single-turn domain with the tiny model, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import call, needs_bwrap

HONING = str(Path(sys.executable).parent / "honing")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HONING, "rollout", *args], check=False, capture_output=True, text=True, timeout=300)


def _repair_task_file(tmp_path: Path) -> tuple[Path, dict]:
    from honing.tasks import task_to_json
    from honing.tasks.repair import RepairSource

    obj = task_to_json(next(RepairSource({"levels": [1]}).tasks("train", 0)))
    path = tmp_path / "task.json"
    path.write_text(json.dumps(obj))
    return path, obj


@needs_bwrap
def test_scripted_policy_on_a_task_file_repairs_and_shows_the_turns(tmp_path: Path) -> None:
    task_path, task = _repair_task_file(tmp_path)
    bug_file = task["hidden"]["bugs"][0]["file"]
    lines = [
        json.dumps(call("read_file", path=bug_file)),  # raw text of one assistant turn, as a JSON string
        json.dumps({"name": "apply_patch", "arguments": {"patch": task["hidden"]["reference_patch"]}}),
        "",  # blank lines are skipped
        json.dumps({"text": call("run_tests")}),
        json.dumps(call("submit")),
    ]
    script = tmp_path / "policy.jsonl"
    script.write_text("\n".join(lines) + "\n")
    p = _run("--task-file", str(task_path), "--policy", f"scripted:{script}", "--model", "tiny-random", "--show")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for needle in ("turn 1 · read_file", "turn 2 · apply_patch", "turn 3 · run_tests", "turn 4 · submit",
                   "tests passed", "observation:", "PASSED", "stop submit", "passed 1/1"):
        assert needle in out, (needle, out[-3000:])
    assert bug_file in out


@needs_bwrap
def test_reference_policy_passes_and_json_has_verdicts() -> None:
    p = _run("--task", "repair", "--n", "2", "--policy", "reference", "--model", "tiny-random", "--json", "--show")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    assert len(rows) == 2 and len({r["task_id"] for r in rows}) == 2
    for r in rows:
        assert r["passed"] is True and r["score"] == 1.0 and r["infra_error"] is False
        tools = r["tools"]  # a read of each file the patch changes, before patching
        assert r["stop_reason"] == "submit" and tools[0] == "run_tests" and tools[-3:] == ["apply_patch", "run_tests", "submit"]
        assert len(tools) >= 5 and set(tools[1:-3]) == {"read_file"}
        assert r["turns"] == len(tools) and r["tokens"] > 0 and set(r["time_s"]) == {"gen", "sandbox", "verify"}
    assert "turn 2 · read_file" in p.stderr and "turn 3 · apply_patch" in p.stderr  # --show with --json renders on stderr


def test_single_turn_domain_with_the_tiny_model() -> None:
    p = _run("--task", "gym:basic_arithmetic", "--n", "2", "--model", "tiny-random", "--max-new-tokens", "8",
             "--json", "--params", '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}')
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(rows) == 2 and all(r["turns"] == 1 and r["tools"] == [] for r in rows)
    assert all(r["score"] is not None and r["infra_error"] is False for r in rows)
    ref = _run("--task", "gym:basic_arithmetic", "--n", "1", "--model", "tiny-random", "--policy", "reference", "--show")
    assert ref.returncode == 0, ref.stderr
    assert "completion" in ref.stdout and "PASSED" in ref.stdout and "passed 1/1" in ref.stdout


def _one_error_line(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("honing: error:"), p.stderr
    for n in needles:
        assert n in err[0], err[0]


@pytest.mark.parametrize("args, needles", [
    (("--task", "nosuch:domain"), ("unknown task source",)),
    (("--task-file", "/nonexistent/task.json"), ("task file not found", "/nonexistent/task.json")),
    (("--task", "repair", "--policy", "oracle"), ("unknown policy 'oracle'",)),
    (("--task", "repair", "--policy", "scripted:/nonexistent/p.jsonl", "--model", "tiny-random"),
     ("scripted policy file not found",)),
    ((), ("--task DOMAIN", "--task-file")),
])
def test_bad_input_is_one_error_line(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    _one_error_line(_run(*args), *needles)


def test_malformed_scripted_line_names_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "bad.jsonl"
    script.write_text(json.dumps(call("run_tests")) + "\n{not json\n")
    _one_error_line(_run("--task", "repair", "--policy", f"scripted:{script}", "--model", "tiny-random"),
                    f"{script}:2:", "not valid JSON")
    bad_task = tmp_path / "task.json"
    bad_task.write_text("{oops")
    _one_error_line(_run("--task-file", str(bad_task), "--policy", "reference"), "not valid JSON")
