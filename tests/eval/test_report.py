"""`honing report`: a self-contained report.html for a demo run, checked as text and in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from honing.errors import HoningError
from honing.eval.report import write_report

HONING = Path(sys.executable).parent / "honing"


def demo_run(tmp_path: Path) -> Path:
    """A run directory as `honing train` leaves it (metrics.jsonl, summary.json, config.yaml) plus two
    evaluations in eval/: a real tiny-random one, and a copy with one multi-turn trajectory appended."""
    from honing.eval.runner import evaluate_suite, save_result
    from honing.eval.suite import Suite

    run = tmp_path / "runs" / "demo"
    (run / "eval").mkdir(parents=True)
    rows = [{"step": 0, "heldout/pass@1": 0.2, "heldout/gym:chain_sum/pass@1": 0.1}]
    for s in range(1, 21):
        rows.append({"step": s, "train/reward": 0.2 + 0.03 * s, "reward/gym:chain_sum/total": 0.2 + 0.03 * s,
                     "reward/gym:chain_sum/correct": 0.1 + 0.03 * s, "reward/gym:chain_sum/format": 0.9,
                     "reward/repair/total": 0.1, "reward/repair/tests": 0.05 * (s % 3),
                     "time/gen_s": 2.0, "train/update_s": 1.0, "time/step_s": 3.5, "time/samples_per_s": 9.0})
    rows.append({"step": 20, "heldout/pass@1": 0.7, "heldout/gym:chain_sum/pass@1": 0.6})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 21, "trunc')
    (run / "summary.json").write_text(json.dumps({"heldout_before": {"pass@1": 0.2}, "heldout_after": {"pass@1": 0.7},
                                                  "steps": 20, "wall_s": 70.0, "samples_per_s": 9.0}))
    (run / "config.yaml").write_text("model:\n  name: tiny-random\n")
    suite = Suite.model_validate({
        "name": "demo", "seed": 2_000_003, "samples_per_task": 4, "batch_tasks": 4,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "sources": [{"name": "gym:chain_sum", "count": 4, "params": {"min_terms": 2, "max_terms": 2}},
                    {"name": "gym:basic_arithmetic", "count": 4}]})
    before = evaluate_suite("tiny-random", suite)
    save_result(before, run / "eval" / "base.json")
    after = json.loads(json.dumps(before))
    after["tasks"].append({"id": "repair/heldout/7", "domain": "repair", "n": 1, "correct": 1, "infra_errors": 0,
                           "truncated": 0, "pass@1": 1.0, "pass@4": None, "maj@4": None, "mean_reward": 1.0,
                           "difficulty": 0.4, "question": "Fix the bug in textkit.",
                           "prompt": [{"role": "system", "content": "You are a careful engineer."},
                                      {"role": "user", "content": "Fix the bug in textkit."}]})
    after["samples"].append({
        "task_id": "repair/heldout/7", "domain": "repair", "sample": 0, "passed": True, "score": 1.0,
        "status": "ok", "finish_reason": "stop", "answer": None, "text": "...", "n_tokens": 80,
        "details": "hidden tests 12/12", "components": {"tests": 1.0}, "reward_layers": {},
        "stop_reason": "submit",
        "turns": [{"index": 0, "action": '<tool_call>{"name": "run_tests"}</tool_call>', "tool": "run_tests",
                   "ok": True, "observation": "FAILED test_count_long_words (AssertionError: 2 != 3)"},
                  {"index": 1, "action": '<tool_call>{"name": "submit"}</tool_call>', "tool": "submit",
                   "ok": True, "observation": ""}]})
    after["meta"]["model"] = "runs/demo"
    save_result(after, run / "eval" / "final.json")
    os.utime(run / "eval" / "final.json", (2e9, 2e9))  # newest: the "after" evaluation
    return run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_run(tmp_path_factory.mktemp("report"))


def test_report_sections_self_contained(run_dir: Path) -> None:
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text()
    for sid in ("training", "layers", "time", "domains", "compare", "passk", "browser", "config"):
        assert f"id='{sid}'" in page, sid
    assert page.count("<svg") >= 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched when opened
    assert "gym:chain_sum" in page and "reward by layer" in page
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                                re.S).group(1).replace("<\\/", "</"))
    assert len(data["trajectories"]) == 32 + 33 and any(t.get("turns") for t in data["trajectories"])


def test_report_for_an_eval_json_and_errors(run_dir: Path, tmp_path: Path) -> None:
    src = run_dir / "eval" / "base.json"
    shutil.copy(src, tmp_path / "base.json")
    out = write_report(tmp_path / "base.json")
    assert out == tmp_path / "base.html" and "id='passk'" in out.read_text() and "id='training'" not in out.read_text()
    with pytest.raises(HoningError, match="not found"):
        write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HoningError, match="not a run directory"):
        write_report(tmp_path / "empty")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(HoningError, match="not an evaluation JSON"):
        write_report(tmp_path / "bad.json")
    p = subprocess.run([str(HONING), "report", str(tmp_path / "nope")], capture_output=True, text=True)
    assert p.returncode == 2 and "honing: error: report target not found" in p.stderr


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (Debian: apt-get install chromium)")
def test_report_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    out = write_report(run_dir, tmp_path / "report.html")
    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning")
                    else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("request", lambda r: problems.append(f"network: {r.url}") if not r.url.startswith(("file:", "data:"))
                    else None)
            page.goto(out.as_uri())
            page.wait_for_load_state("load")
            plots = page.locator(".plot svg")
            assert plots.count() >= 4
            for i in range(plots.count()):
                plots.nth(i).scroll_into_view_if_needed()
                assert plots.nth(i).is_visible()
                box = plots.nth(i).bounding_box()
                assert box and box["width"] > 200 and box["height"] > 100
            assert page.locator("table.metrics").first.is_visible()
            assert "65 of 65 shown" in page.locator("#f-count").inner_text()
            page.select_option("#f-domain", "repair")  # filter, then open the multi-turn trajectory
            assert "1 of 65 shown" in page.locator("#f-count").inner_text()
            page.locator(".traj").first.click()
            view = page.locator("#traj-view")
            assert view.locator(".turn").count() == 2
            text = view.inner_text()
            assert "tool run_tests" in text.lower() and "FAILED test_count_long_words" in text
            assert "hidden tests 12/12" in text and "You are a careful engineer." in text
            page.select_option("#f-domain", "")
            page.select_option("#f-result", "fail")
            n_fail = page.locator(".traj").count()
            assert 0 < n_fail < 65
            page.locator(".traj").nth(1).click()
            assert view.locator(".turn").count() == 1 and "assistant · turn 1" in view.inner_text().lower()
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    assert problems == []
