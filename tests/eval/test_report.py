"""`honing report`: a self-contained report.html for a demo run, checked as text and in headless Chromium.

The demo run is a real (tiny) training run, so its trajectory shards and state.sqlite are what
`honing train` writes, plus a synthetic multi-turn shard and two evaluations in eval/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from honing.errors import HoningError
from honing.eval.report import write_report
from honing.eval.report_data import decode
from honing.schedule.trajstore import read_columns, read_shard

HONING = Path(sys.executable).parent / "honing"
LONG = "x = 1\n" * 1200  # a 7,200-character action: the page previews it and expands on request


def multiturn_trajectories() -> list:
    """A multi-turn repair episode (2 turns), an infra error and a long single action: one shard."""
    from honing.rollout.types import Trajectory, Turn
    from honing.verify.types import Verdict

    prompt = [{"role": "system", "content": "You are a careful engineer."},
              {"role": "user", "content": "Fix the bug in textkit."}]
    t1 = Turn(index=0, action_ids=(1, 2), action_logprobs=(-0.1, -0.2),
              action_text='<tool_call>{"name": "run_tests"}</tool_call>', observation_ids=(3,),
              observation_text="<obs>FAILED test_count_long_words</obs>", tool="run_tests")
    t2 = Turn(index=1, action_ids=(4,), action_logprobs=(-0.3,),
              action_text='<tool_call>{"name": "submit"}</tool_call>', observation_ids=(), observation_text="",
              tool="submit")
    msgs = (*prompt, {"role": "assistant", "content": t1.action_text},
            {"role": "tool", "content": "FAILED test_count_long_words (AssertionError: 2 != 3)"},
            {"role": "assistant", "content": t2.action_text})
    ok = Trajectory(task_id="repair/train/7", domain="repair", prompt_ids=(9,) * 12, completion_ids=(1, 2, 3, 4),
                    logprobs=(-0.1, -0.2, 0.0, -0.3), completion_text="...", finish_reason="stop", policy_version=2,
                    verdict=Verdict(score=1.0, passed=True, components={"tests": 1.0}, details="hidden tests 12/12"),
                    reward=1.0, turns=(t1, t2), messages=msgs, stop_reason="submit")
    infra = Trajectory(task_id="repair/train/8", domain="repair", prompt_ids=(9,) * 12, completion_ids=(1,),
                       logprobs=(-0.1,), completion_text="", finish_reason="stop", policy_version=2, group=1,
                       verdict=Verdict.infra("sandbox crashed: exit 137"), stop_reason="infra_error",
                       turns=(Turn(index=0, action_ids=(1,), action_logprobs=(-0.1,), action_text="ls",
                                   observation_ids=(), observation_text=""),),
                       messages=(*prompt, {"role": "assistant", "content": "ls"}))
    long = Trajectory(task_id="repair/train/9", domain="repair", prompt_ids=(9,) * 12, completion_ids=(1,) * 20,
                      logprobs=(-0.1,) * 20, completion_text=LONG, finish_reason="length", policy_version=2, group=2,
                      verdict=Verdict(score=0.0, passed=False, details="hidden tests 0/12"), reward=0.0,
                      turns=(Turn(index=0, action_ids=(1,) * 20, action_logprobs=(-0.1,) * 20, action_text=LONG,
                                  observation_ids=(), observation_text="", finish_reason="length"),),
                      messages=(*prompt, {"role": "assistant", "content": LONG}))
    return [ok, infra, long]


def demo_run(tmp_path: Path) -> Path:
    """A run directory as `honing train` leaves it (a real 6-step smoke run: shards, state.sqlite,
    summary.json, config.yaml), its metrics.jsonl replaced by synthetic rows covering every plot,
    one more shard of multi-turn trajectories, and two evaluations in eval/: a real tiny-random
    one, and a copy with one multi-turn trajectory appended."""
    from honing.config import load_config
    from honing.eval.runner import evaluate_suite, save_result
    from honing.eval.suite import Suite
    from honing.schedule.loop import train
    from honing.schedule.trajstore import write_shard

    run = tmp_path / "runs" / "demo"
    cfg, _ = load_config("smoke", ["train.steps=6", "tasks.prompts_per_step=4", "sft.steps=40",
                                   "eval.heldout_tasks=8"])
    train(cfg, run, show_progress=False)
    write_shard(run / "trajectories" / "batch-900000.parquet", multiturn_trajectories(), step=3)
    (run / "eval").mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "heldout/pass@1": 0.2, "heldout/gym:chain_sum/pass@1": 0.1}]
    for s in range(1, 21):
        rows.append({"step": s, "train/reward": 0.2 + 0.03 * s, "reward/gym:chain_sum/total": 0.2 + 0.03 * s,
                     "reward/gym:chain_sum/correct": 0.1 + 0.03 * s, "reward/gym:chain_sum/format": 0.9,
                     "reward/repair/total": 0.1, "reward/repair/tests": 0.05 * (s % 3),
                     "time/gen_s": 2.0, "train/update_s": 1.0, "time/step_s": 3.5, "time/samples_per_s": 9.0})
    rows.append({"step": 20, "heldout/pass@1": 0.7, "heldout/gym:chain_sum/pass@1": 0.6})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 21, "trunc')
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


def page_data(page: str) -> dict:
    m = re.search(r'<script type="application/octet-stream" id="report-data" '
                  r'data-encoding="gzip\+base64">(.*?)</script>', page, re.S)
    return decode(m.group(1))


def shard_truth(run: Path) -> list[dict]:
    """Every trajectory of the run's shards, as the page should show it (shard order, then row)."""
    out = []
    for path in sorted((run / "trajectories").glob("*.parquet")):
        steps = [r["step"] for r in read_columns(path, ["step"])]
        for i, t in enumerate(read_shard(path)):
            v = t.verdict
            label = "none" if v is None else "infra" if v.infra_error else "pass" if v.passed else "fail"
            out.append({"loc": f"{path.name}:{i}", "traj": t, "label": label, "step": steps[i]})
    return out


def test_report_sections_self_contained(run_dir: Path) -> None:
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text()
    for sid in ("training", "layers", "time", "domains", "compare", "passk", "browser", "config"):
        assert f"id='{sid}'" in page, sid
    assert page.count("<svg") >= 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched when opened
    assert "gym:chain_sum" in page and "reward by layer" in page
    data = page_data(page)
    truth = shard_truth(run_dir)
    assert len(truth) == 6 * 4 * 8 + 3
    train_rows = [r for r in data["rows"] if data["sources"][r["s"]] == "training"]
    assert len(data["rows"]) == len(truth) + 32 + 33 and len(train_rows) == len(truth)
    assert "held-out examples (summary.json)" not in data["sources"]  # the shards are there: no fallback
    for row, want in zip(train_rows, truth):  # every trajectory, in order, labelled by its own verdict
        t = want["traj"]
        assert row["loc"] == want["loc"] and row["v"] == want["label"] and row["st"] == want["step"]
        assert row["d"] == t.domain and data["tasks"][row["t"]]["id"] == t.task_id
        assert row["r"] == pytest.approx(t.reward) and row.get("nt") == len(t.completion_ids)
        assert row.get("det") == (t.verdict.details or None)
        assert (row.get("x") == (t.completion_text or None)) if not t.turns else len(row["tu"]) == len(t.turns)
    labels = Counter(w["label"] for w in truth)
    assert labels["pass"] > 0 and labels["fail"] > 0 and labels["infra"] == 1
    # single-turn prompts come from state.sqlite (the tasks as the model saw them), with the reference answer
    first = next(r for r in train_rows if r["d"] != "repair")
    task = data["tasks"][first["t"]]
    assert task["p"][0]["content"].startswith("Calculate ") and task["ref"].isdigit()
    # advantages: recomputed as the step computed them (GRPO over each group of 8, Bessel std)
    assert all(r.get("u") == "used" for r in train_rows if r["d"] != "repair")
    by_group: dict = {}
    for r in train_rows:
        if r["d"] != "repair":
            by_group.setdefault(r["loc"].split(":")[0] + f"/{r['g']}", []).append(r)
    mixed = [g for g in by_group.values() if 0 < sum(r["r"] for r in g) < len(g)]
    assert mixed, "the demo run has no group with both passes and fails"
    for g in mixed:
        rs = [r["r"] for r in g]
        mean = sum(rs) / len(rs)
        std = (sum((x - mean) ** 2 for x in rs) / (len(rs) - 1)) ** 0.5
        assert [r["a"] for r in g] == pytest.approx([(x - mean) / (std + 1e-6) for x in rs], abs=1e-4)
    # the multi-turn episode: turns with the readable observation, and the conversation's opening as prompt
    ep = next(r for r in train_rows if data["tasks"][r["t"]]["id"] == "repair/train/7")
    assert [u.get("tool") for u in ep["tu"]] == ["run_tests", "submit"]
    assert ep["tu"][0]["o"].startswith("FAILED test_count_long_words (AssertionError")
    assert data["tasks"][ep["t"]]["p"][0]["content"] == "You are a careful engineer."


def test_old_run_without_shards_falls_back_to_summary_examples(tmp_path: Path) -> None:
    """An old run: summary.json's held-out examples, labelled by their verdict, never "fail" by default."""
    run = tmp_path / "old"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward": 0.5}) + "\n")
    examples = [{"task": "Calculate 8 + 2.", "completion": "8 + 2 = 10."},
                {"task": "Calculate 3 + 4.", "completion": "7", "passed": True, "score": 1.0},
                {"task": "Calculate 1 + 1.", "completion": "3", "passed": False, "score": 0.0}]
    (run / "summary.json").write_text(json.dumps({"heldout_before": {"pass@1": 0.4}, "heldout_after": {"pass@1": 0.8},
                                                  "examples_after": examples}))
    data = page_data(write_report(run).read_text())
    assert data["sources"] == ["held-out examples (summary.json)"]
    assert [r["v"] for r in data["rows"]] == ["none", "pass", "fail"]  # no verdict recorded: not "fail"
    assert data["rows"][0]["x"] == "8 + 2 = 10." and data["tasks"][data["rows"][0]["t"]]["p"][0]["content"] \
        == "Calculate 8 + 2."
    assert any("no trajectory shards" in n for n in data["notes"])


def test_text_cap_keeps_every_trajectory(run_dir: Path) -> None:
    from honing.eval.report_data import browser_data, choose_cap

    assert choose_cap([10, 20, 30], budget=1000) == 40_000
    assert choose_cap([5000, 5000, 100], budget=4100, least=100) == 2000
    data = browser_data(run_dir, [], None, budget=6_000)  # all text is about 11,000 characters, one 7,200
    assert len(data.rows) == 6 * 4 * 8 + 3 and data.cap and data.cap < len(LONG)
    long = next(r for r in data.rows if r.get("tu") and r["tu"][0].get("a_n"))
    assert long["tu"][0]["a_n"] == len(LONG) and len(long["tu"][0]["a"]) == data.cap
    assert any("embedded up to" in n for n in data.notes)


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
    truth = shard_truth(run_dir)
    n_train, n_all = len(truth), len(truth) + 32 + 33
    fails = [w for w in truth if w["label"] == "fail"]
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
            page.wait_for_selector("#traj-list[data-ready='1']", state="attached", timeout=30_000)
            plots = page.locator(".plot svg")
            assert plots.count() >= 4
            for i in range(plots.count()):
                plots.nth(i).scroll_into_view_if_needed()
                assert plots.nth(i).is_visible()
                box = plots.nth(i).bounding_box()
                assert box and box["width"] > 200 and box["height"] > 100
            assert page.locator("table.metrics").first.is_visible()
            count = page.locator("#f-count")
            rows = page.locator("#traj-list tr.traj")
            assert count.inner_text().startswith(f"{n_all} of {n_all} shown") and rows.count() == 50

            # training trajectories only, failures only: the counts and labels are the shards'
            page.select_option("#f-source", label="training")
            assert count.inner_text().startswith(f"{n_train} of {n_all} shown")
            page.select_option("#f-verdict", "fail")
            assert count.inner_text().startswith(f"{len(fails)} of {n_all} shown") and len(fails) > 50
            n_pages = -(-len(fails) // 50)
            assert page.inner_text("#pg-info") == f"page 1 of {n_pages}"
            labels = [rows.nth(i).locator(".badge").first.inner_text() for i in range(rows.count())]
            assert labels == ["fail"] * 50
            assert [rows.nth(i).get_attribute("data-verdict") for i in range(rows.count())] == ["fail"] * 50
            page.click("#pg-next")
            assert page.inner_text("#pg-info") == f"page 2 of {n_pages}"
            page.click("#pg-last")
            assert rows.count() == len(fails) - 50 * (n_pages - 1)

            # expand one failure: its prompt, completion and verdict details are the shard's
            page.click("#pg-first")
            rows.nth(3).click()
            want = fails[3]["traj"]
            detail = page.locator("#traj-list tr.detail")
            assert detail.count() == 1
            text = detail.inner_text()
            assert f"trajectories/{fails[3]['loc']}" in text and want.task_id in text
            assert want.verdict.details in text and "verdict: fail" in text and "reference answer:" in text
            assert "Calculate " in text and "training use: used" in text
            assert detail.locator(".turn pre").inner_text() == want.completion_text
            rows.nth(3).click()  # collapses again
            assert page.locator("#traj-list tr.detail").count() == 0

            # step range, reward range and a text search narrow it as the shards say
            page.select_option("#f-verdict", "")
            page.fill("#f-step-min", "2")
            page.fill("#f-step-max", "4")
            page.press("#f-step-max", "Enter")
            in_range = [w for w in truth if 2 <= w["step"] <= 4]
            assert count.inner_text().startswith(f"{len(in_range)} of {n_all} shown")
            page.fill("#f-reward-min", "0.5")
            page.press("#f-reward-min", "Enter")
            want_n = sum(1 for w in in_range if w["traj"].reward >= 0.5)
            assert count.inner_text().startswith(f"{want_n} of {n_all} shown")
            page.fill("#f-step-min", "")
            page.fill("#f-step-max", "")
            page.fill("#f-reward-min", "")
            page.fill("#f-search", "FAILED test_count_long")
            page.press("#f-search", "Enter")
            assert count.inner_text().startswith(f"1 of {n_all} shown")

            # the multi-turn episode: two turns, the tool and the readable observation
            rows.first.click()
            detail = page.locator("#traj-list tr.detail")
            assert detail.locator(".turn").count() == 2
            text = detail.inner_text()
            assert "tool run_tests" in text.lower() and "FAILED test_count_long_words (AssertionError" in text
            assert "hidden tests 12/12" in text and "You are a careful engineer." in text

            # the infra error is labelled by its verdict; a long action expands to its full text
            page.fill("#f-search", "")
            page.select_option("#f-domain", "repair")
            page.select_option("#f-verdict", "infra")
            assert count.inner_text().startswith(f"1 of {n_all} shown")
            assert rows.first.locator(".badge").first.inner_text() == "infra error"
            page.select_option("#f-verdict", "")
            page.click("th[data-key=nt]")  # sort by tokens, then again: descending, the long one first
            page.click("th[data-key=nt]")
            assert page.locator("th[data-key=nt]").get_attribute("class") == "num desc"
            rows.first.click()
            detail = page.locator("#traj-list tr.detail")
            assert len(detail.locator(".turn pre").inner_text()) < len(LONG)
            detail.locator("button.more").click()
            assert detail.locator(".turn pre").inner_text() == LONG

            # the evaluations' samples are there too
            page.select_option("#f-domain", "")
            page.select_option("#f-source", label="eval: base (tiny-random)")
            assert count.inner_text().startswith(f"32 of {n_all} shown")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    assert problems == []



def test_run_report_shows_held_out_per_domain_with_cis_and_marks_a_regression(tmp_path: Path) -> None:
    """A mixed run's summary.json: one row per domain, pass@1 [CI] at each stage, the paired change, and
    REGRESSION only on the domain whose change lies wholly below zero."""
    from honing.eval.metrics import heldout_deltas

    fin, code = [f"f{i}" for i in range(8)], [f"c{i}" for i in range(8)]
    dom = {**{t: "finance" for t in fin}, **{t: "code:functions" for t in code}}
    before = {"pass@1": 0.5, "per_task_pass@1": {**{t: 1.0 for t in fin}, **{t: 0.0 for t in code}},
              "per_task_domain": dom}
    after = {"pass@1": 0.625, "per_task_pass@1": {**{t: 0.0 for t in fin[:6]}, **{t: 1.0 for t in fin[6:]},
                                                  **{t: 1.0 for t in code}}, "per_task_domain": dom}
    run = tmp_path / "mixed"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"heldout_before": before, "heldout_after": after,
                                                  "heldout_ci": heldout_deltas({"before": before, "after": after})}))
    page = write_report(run).read_text()
    section = page[page.index("id='heldout-domains'"):]
    section = section[:section.index("</section>")]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>([^<]+)</td>.*?</tr>", section)}
    assert set(rows) == {"finance", "code:functions"}
    assert "REGRESSION" in rows["finance"] and "REGRESSION" not in rows["code:functions"]
    assert "-0.750" in rows["finance"] and "+1.000" in rows["code:functions"]
    assert "<th>after-before</th>" in section
    (run / "summary.json").write_text(json.dumps({"heldout_before": {"pass@1": 0.5}, "heldout_after": {"pass@1": 0.6}}))
    assert "id='heldout-domains'" not in write_report(run).read_text()  # one domain, or an old run: no section


def test_run_report_lists_the_schedulers_weight_and_level_changes(tmp_path: Path) -> None:
    """Curriculum steps and regression-guard weight changes (state.sqlite `events`) are a table under
    Scheduling, with the reason; other event kinds are not listed there."""
    import sqlite3

    run = tmp_path / "mixed"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"heldout_before": {"pass@1": 0.1}, "heldout_after": {"pass@1": 0.2}}))
    db = sqlite3.connect(run / "state.sqlite")
    db.execute("CREATE TABLE events(id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER NOT NULL, kind TEXT NOT NULL, "
               "domain TEXT, detail TEXT NOT NULL)")
    for step, e in ((4, {"kind": "level", "domain": "finance", "old": 0, "new": 1, "reason": "pass rate 0.53 >= 0.5"}),
                    (10, {"kind": "weight", "domain": "code:functions", "old": 1.0, "new": 1.6666667,
                          "reason": "held-out pass@1 0.20 below best 0.31"}),
                    (11, {"kind": "retry", "domain": "repair", "reason": "sandbox"})):
        db.execute("INSERT INTO events(step, kind, domain, detail) VALUES(?,?,?,?)", (step, e["kind"], e["domain"],
                                                                                     json.dumps({"step": step, **e})))
    db.commit()
    db.close()
    page = write_report(run).read_text()
    section = page[page.index("id='schedule'"):]
    section = section[:section.index("</section>")]
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td><td>(\w+)</td><td>([^<]+)</td><td>([^<]*)</td></tr>", section)
    assert rows == [("4", "finance", "level", "0 → 1", "pass rate 0.53 &gt;= 0.5"),
                    ("10", "code:functions", "weight", "1 → 1.67", "held-out pass@1 0.20 below best 0.31")]
