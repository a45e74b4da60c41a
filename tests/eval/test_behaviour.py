"""Multi-turn behaviour shares in an evaluation: tool calls, test runs, passing after a failing run."""

from __future__ import annotations

from honing.eval.runner import episode_behaviour


def _rec(passed: bool, **stats: int) -> dict:
    base = {"tool_calls": 0, "failed_tool_calls": 0, "test_runs": 0, "failed_test_runs": 0, "correction_rounds": 0}
    return {"passed": passed, "status": "ok", "episode": {**base, **stats}}


def test_episode_behaviour_shares() -> None:
    recs = [
        _rec(False),                                                            # prose only: no tool call
        _rec(False, tool_calls=2, failed_tool_calls=2),                         # only malformed calls
        _rec(True, tool_calls=4, test_runs=2, failed_test_runs=1, correction_rounds=1),  # fixed it
        _rec(False, tool_calls=3, test_runs=1, failed_test_runs=1),             # saw failure, gave up
        {"passed": True, "status": "ok"},                                       # single-turn: not an episode
        {**_rec(False, tool_calls=9), "status": "infra_error"},                 # broken sandbox: not counted
    ]
    b = episode_behaviour(recs)
    assert b["episodes"] == 4
    assert b["valid_tool_call"] == 0.5 and b["ran_tests"] == 0.5 and b["saw_failing_tests"] == 0.5
    assert b["passed_after_failing_tests"] == 0.5
    assert b["mean_tool_calls"] == 2.25 and b["mean_correction_rounds"] == 0.25
    assert episode_behaviour([{"passed": True, "status": "ok"}]) is None
    assert episode_behaviour([_rec(True, tool_calls=1)])["passed_after_failing_tests"] is None
