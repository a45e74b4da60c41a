"""`honing verify`, `honing tasks show --json` and `honing tasks validate` through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HONING = str(Path(sys.executable).parent / "honing")


def _run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([HONING, *args], input=stdin, capture_output=True, timeout=120)


def test_show_json_round_trips_into_verify(tmp_path: Path) -> None:
    p = _run("tasks", "show", "gym:basic_arithmetic", "--n", "2", "--json",
             "--params", '{"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2, "operators": ["+"]}')
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 2
    task = json.loads(lines[0])
    assert set(task["hidden"]) >= {"answer"} and task["verifier"]["name"] == "reasoning_gym"
    (tmp_path / "task.json").write_text(lines[0])
    good = _run("verify", "--task", str(tmp_path / "task.json"), "--completion", "-",
                stdin=f"The answer is {task['hidden']['answer']}".encode())
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["passed"] is True
    wrong = _run("verify", "--task", str(tmp_path / "task.json"), "--completion", "-", stdin=b"no idea")
    assert json.loads(wrong.stdout)["score"] == 0.0


def test_verify_with_reference() -> None:
    p = _run("verify", "--verifier", "numeric", "--reference", "1000", "--completion", "-", stdin=b"it is 1,000")
    assert p.returncode == 0 and json.loads(p.stdout)["passed"] is True


def _one_error_line(p: subprocess.CompletedProcess, needle: str) -> None:
    err = [x for x in p.stderr.decode().splitlines() if x.strip()]
    assert p.returncode == 2 and len(err) == 1 and err[0].startswith("honing: error:") and needle in err[0], err


def test_verify_bad_input(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    _one_error_line(_run("verify", "--task", str(bad_json), "--completion", "-", stdin=b"1"), "not valid JSON")
    missing = tmp_path / "t.json"
    missing.write_text(json.dumps({"id": "x", "prompt": "q"}))
    _one_error_line(_run("verify", "--task", str(missing), "--completion", "-", stdin=b"1"), "missing key 'verifier'")
    _one_error_line(_run("verify", "--verifier", "exakt", "--reference", "1", "--completion", "-", stdin=b"1"),
                    "unknown verifier 'exakt'")
    _one_error_line(_run("verify", "--verifier", "exact", "--reference", "1", "--completion", "-", stdin=b"\xff\xfe"),
                    "not UTF-8")
    big = tmp_path / "big.txt"
    big.write_bytes(b"1" * (10 << 20))
    _one_error_line(_run("verify", "--verifier", "exact", "--reference", "1", "--completion", str(big)), "larger than")


def test_tasks_validate(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "2+2?", "answer": "4", "verifier": "numeric"}\n{"prompt": "cap?", "answer": "Paris"}\n')
    p = _run("tasks", "validate", str(good))
    assert p.returncode == 0 and b"2 tasks OK" in p.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "2+2?", "answer": "4"}\n{"prompt": "x"}\n')
    _one_error_line(_run("tasks", "validate", str(bad)), f"{bad}:2: missing key 'answer'")
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text('{"prompt": "2+2?", "answer": "4", "verifier": "nope"}\n')
    _one_error_line(_run("tasks", "validate", str(unknown)), "unknown verifier 'nope'")
