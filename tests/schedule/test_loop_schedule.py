"""The scheduler inside a real run (tiny model): the curriculum advances a domain to its next
level once its pass rate crosses the threshold, logs the move, and draws the harder tasks."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from honing.config import load_config
from honing.schedule.loop import train

ONE = "{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+'], allow_negation: false, allow_parentheses: false}"
TWO = "{min_terms: 2, max_terms: 2, min_digits: 3, max_digits: 3, operators: ['+'], allow_negation: false, allow_parentheses: false}"


@pytest.mark.slow
def test_curriculum_advances_a_domain_in_a_real_run(tmp_path: Path) -> None:
    cfg, _ = load_config("smoke", [
        "train.steps=10", "eval.heldout_tasks=8", "tasks.prompts_per_step=8",
        f"tasks.sources=[{{name: 'gym:basic_arithmetic', params: {ONE}, level: 0}},"
        f" {{name: 'gym:basic_arithmetic', params: {TWO}, level: 1}}]",
        "schedule.curriculum.enabled=true", "schedule.curriculum.advance_at=0.1",
        "schedule.curriculum.min_samples=128", "schedule.curriculum.window=128",
    ])
    run = tmp_path / "run"
    train(cfg, run, show_progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward" in r]
    level = [next(v for k, v in r.items() if k.startswith("sched/level/")) for r in steps]
    assert level[0] == 0 and level[-1] == 1, level  # after SFT the 1-digit pass rate is ~0.15
    assert level.index(1) >= 1  # not before min_samples (2 steps of 64) were seen
    db = sqlite3.connect(run / "state.sqlite")
    events = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind='level'")]
    assert len(events) == 1 and events[0]["reason"], events
    # tasks drawn before the move are 1-digit sums, after it 3-digit ones
    payloads = [(s, json.loads(p)) for s, p in db.execute("SELECT for_step, payload FROM batches ORDER BY batch_id")]
    digits = {s: max(len(n) for t in p["tasks"] for n in re.findall(r"\d+", t["prompt"][-1]["content"]))
              for s, p in payloads}
    assert digits[1] < 3 and digits[max(digits)] == 3, digits
