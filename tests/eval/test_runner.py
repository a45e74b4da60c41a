"""`honing eval`: suites, model resolution, reproducibility, endpoints failing, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from honing.errors import ConfigError, HoningError, ModelError, TaskError
from honing.eval.runner import evaluate_suite, resolve_model, summarise
from honing.eval.suite import load_suite, suite_tasks

HONING = Path(sys.executable).parent / "honing"


def write_suite(tmp_path: Path, file: str = "suite.yaml", **over) -> Path:
    body = {
        "name": "tiny", "version": 3, "seed": 2_000_003, "samples_per_task": 4, "batch_tasks": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 6},
        "sources": [{"name": "gym:basic_arithmetic", "count": 3,
                     "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                "operators": ["+"], "allow_negation": False, "allow_parentheses": False}},
                    {"name": "gym:chain_sum", "count": 2, "params": {"min_terms": 2, "max_terms": 2}}],
    }
    body.update(over)
    p = tmp_path / file
    import yaml

    p.write_text(yaml.safe_dump(body))
    return p


def _cli(args: list[str], tmp_path: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", **env}
    return subprocess.run([str(HONING), *args], capture_output=True, text=True, env=e, cwd=tmp_path, timeout=timeout)


# --- suites ----------------------------------------------------------------------------------------
def test_builtin_suites_load_and_hold_heldout_tasks_only() -> None:
    for name in ("quick", "regression"):
        s = load_suite(name)
        assert s.version >= 1 and s.samples_per_task >= 1
    st = suite_tasks(load_suite("quick"))
    assert len(st.tasks) == 64 and all("/heldout/" in t.id for t in st.tasks)
    assert {t.domain for t in st.tasks} == {"gym:basic_arithmetic", "gym:chain_sum", "gym:leg_counting",
                                            "code:functions"}


def test_suite_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"gym:basic_arithmatic.*closest: basic_arithmetic"):
        suite_tasks(load_suite(str(write_suite(tmp_path, sources=[{"name": "gym:basic_arithmatic"}]))))
    with pytest.raises(TaskError, match="yields no tasks of domain 'gym:nope'"):
        suite_tasks(load_suite(str(write_suite(tmp_path, sources=[{"name": "gym:chain_sum", "count": 2,
                                                                   "domains": ["gym:nope"]}]))))
    with pytest.raises(ConfigError, match="samples_per_tsk: unknown key.*samples_per_task"):
        load_suite(str(write_suite(tmp_path, samples_per_tsk=3)))
    with pytest.raises(ConfigError, match="overlaps the default training seeds"):
        load_suite(str(write_suite(tmp_path, seed=5)))
    with pytest.raises(ConfigError, match="unknown suite 'quik'.*did you mean 'quick'"):
        load_suite("quik")


def test_same_source_twice_gets_distinct_ids(tmp_path: Path) -> None:
    p = write_suite(tmp_path, sources=[{"name": "finance", "params": {"level": [1]}, "count": 3},
                                       {"name": "finance", "params": {"level": [2]}, "count": 3}])
    ids = [t.id for t in suite_tasks(load_suite(str(p))).tasks]
    assert len(set(ids)) == 6


# --- models ----------------------------------------------------------------------------------------
def test_run_dir_resolution(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {name: tiny-random}\n")
    with pytest.raises(ModelError, match="has no checkpoints"):
        resolve_model(str(run))
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "checkpoints" / "step-10").mkdir(parents=True)
    assert resolve_model(str(run)).spec.endswith("step-10")
    assert resolve_model(f"{run}@step-2").spec.endswith("step-2")
    with pytest.raises(ModelError, match="no checkpoint 'step-3'.*step-10, step-2"):
        resolve_model(f"{run}@step-3")
    (run / "checkpoints" / "final").mkdir()
    assert resolve_model(str(run)).spec.endswith("final")
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./no/such/model")


# --- reproducibility and numbers --------------------------------------------------------------------
def _strip(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "meta"}


@pytest.mark.slow
def test_same_checkpoint_same_seed_is_bit_for_bit(tmp_path: Path) -> None:
    from honing.models import load_policy

    run = tmp_path / "runs" / "r"  # a run directory with a saved checkpoint, as training leaves it
    model, tok = load_policy("tiny-random", seed=3)
    model.save_pretrained(run / "checkpoints" / "final")
    tok.save_pretrained(run / "checkpoints" / "final")
    (run / "config.yaml").write_text("model: {name: tiny-random}\n")
    suite = load_suite(str(write_suite(tmp_path)))
    a = evaluate_suite(str(run), suite)
    b = evaluate_suite(str(run), suite)
    assert a["meta"]["model_resolved"].endswith("checkpoints/final")
    assert json.dumps(_strip(a), sort_keys=True) == json.dumps(_strip(b), sort_keys=True)
    c = evaluate_suite(str(run), suite, seed=7)
    assert [s["text"] for s in c["samples"]] != [s["text"] for s in a["samples"]]  # the seed matters
    assert len(a["tasks"]) == 5 and all(t["n"] == 4 for t in a["tasks"])
    assert set(a["domains"]) == {"gym:basic_arithmetic", "gym:chain_sum"}
    for m in a["domains"].values():
        assert {"pass@1", "pass@4", "maj@4", "ci", "pass@k_curve"} <= set(m)
    assert len(a["samples"]) == 20 and a["meta"]["suite_version"] == 3


def test_a_killed_evaluation_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """Each finished chunk is handed out (the CLI writes it to --out); a run killed after its first
    chunk, resumed from that file, gives the same records as a run never stopped, and generates only
    the chunks it had not finished. Resuming another evaluation's file is refused by name."""
    from honing.eval.runner import finished_groups

    suite = load_suite(str(write_suite(tmp_path)))  # chunks of 2, never mixing sources: 2 + 1, then 2
    whole = evaluate_suite("tiny-random", suite)
    partials: list[dict] = []

    def killed(partial: dict) -> None:
        partials.append(partial)
        raise KeyboardInterrupt  # the process dies after its first chunk was written

    with pytest.raises(KeyboardInterrupt):
        evaluate_suite("tiny-random", suite, on_chunk=killed)
    first = partials[0]
    assert first["meta"]["incomplete"]["tasks_done"] == 2 and "--resume" in first["meta"]["incomplete"]["error"]
    first = json.loads(json.dumps(first))  # as read back from the file
    seen: list[dict] = []
    resumed = evaluate_suite("tiny-random", suite, resume=first, on_chunk=seen.append)
    assert resumed["meta"]["resumed_tasks"] == 2 and resumed["meta"]["incomplete"] is None
    assert json.dumps(_strip(resumed), sort_keys=True) == json.dumps(_strip(whole), sort_keys=True)
    assert [p["meta"]["n_tasks"] for p in seen] == [3]  # chunk 1 came from the file; 2 ran (3 is the end)
    with pytest.raises(HoningError, match="seed is 2000003, this one's is 7"):
        evaluate_suite("tiny-random", suite, seed=7, resume=first)
    with pytest.raises(HoningError, match="not this suite's tasks"):
        finished_groups(first, first["meta"], ["x", "y", "z"])


def test_summarise_numbers_from_records() -> None:
    from honing.tasks import Task, VerifierSpec

    t = Task("t1", "d", ({"role": "user", "content": "q"},), VerifierSpec("exact_match"))
    u = Task("t2", "d", ({"role": "user", "content": "q2"},), VerifierSpec("exact_match"))

    def rec(tid: str, passed: bool, ans: str | None, status: str = "ok") -> dict:
        return {"task_id": tid, "passed": passed, "answer": ans, "status": status, "score": float(passed),
                "finish_reason": "stop"}

    # t1: 1 of 4 right and the majority answer ("5") is wrong; one infra error is excluded
    r1 = [rec("t1", True, "4"), rec("t1", False, "5"), rec("t1", False, "5"), rec("t1", False, "5"),
          rec("t1", False, None, "infra_error")]
    r2 = [rec("t2", True, "x")] * 4
    out = summarise([t, u], [r1, r2], 4)
    row = out["tasks"][0]
    assert (row["n"], row["correct"], row["infra_errors"]) == (4, 1, 1)
    assert (row["pass@1"], row["pass@4"], row["maj@4"]) == (0.25, 1.0, 0.0)
    d = out["domains"]["d"]
    assert (d["pass@1"], d["pass@4"], d["maj@4"], d["infra_errors"]) == (0.625, 1.0, 0.5, 1)
    assert d["ci"]["pass@1"][0] <= 0.625 <= d["ci"]["pass@1"][1]
    assert d["pass@k_curve"]["1"] == 0.625 and d["pass@k_curve"]["4"] == 1.0


def test_layered_verdicts_are_summarised_per_layer() -> None:
    """A layered verifier (CAD's shape): the mean of each layer per domain, a layer a sample never
    reached counting 0, infra errors left out; and the lines `honing eval` prints under its table."""
    from honing.eval.cli import detail_lines
    from honing.tasks import Task, VerifierSpec

    t = Task("c1", "cad", ({"role": "user", "content": "q"},), VerifierSpec("exact_match"))

    def rec(comp: dict, status: str = "ok") -> dict:
        return {"task_id": "c1", "domain": "cad", "passed": False, "answer": None, "status": status,
                "score": 0.0, "finish_reason": "stop", "components": comp}

    recs = [rec({"build": 1.0, "valid": 1.0, "iou": 0.5}), rec({"build": 1.0, "valid": 0.0, "iou": 0.0}),
            rec({"build": 0.0}), rec({"build": 0.0, "iou": 0.0}), rec({"build": 1.0, "iou": 1.0}, "infra_error")]
    out = summarise([t], [recs], 4)
    assert out["domains"]["cad"]["layers"] == {"build": 0.5, "iou": 0.125, "valid": 0.25}
    assert detail_lines(out) == ["cad layers: build 0.50  iou 0.12  valid 0.25"]
    plain = summarise([t], [[rec({"correct": 1.0})] * 4], 4)  # one layer only: nothing to add to pass@1
    assert "layers" not in plain["domains"]["cad"] and detail_lines(plain) == []


# --- endpoints ---------------------------------------------------------------------------------------
class FlakyEndpoint:
    """An OpenAI-compatible /v1/chat/completions that answers `ok_requests` times, then 503s."""

    def __init__(self, ok_requests: int) -> None:
        state = {"n": 0}
        lock = threading.Lock()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with lock:
                    state["n"] += 1
                    ok = state["n"] <= ok_requests
                q = body["messages"][-1]["content"]
                reply = {"choices": [{"message": {"role": "assistant", "content": f"I think {len(q)}"}}]}
                data = json.dumps(reply if ok else {"error": "down"}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.state = state

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_endpoint_refusing_connections_is_a_clear_error(tmp_path: Path) -> None:
    suite = load_suite(str(write_suite(tmp_path)))
    with pytest.raises(HoningError, match=r"cannot evaluate openai:m@.*(refused|connection error)"):
        evaluate_suite(f"openai:m@http://127.0.0.1:{_free_port()}", suite, endpoint_retries=0)


def test_endpoint_failing_midway_keeps_partial_results(tmp_path: Path) -> None:
    suite = load_suite(str(write_suite(tmp_path)))  # chunks of 2 tasks x 4 samples = 8 requests
    ep = FlakyEndpoint(ok_requests=8)
    try:
        res = evaluate_suite(f"openai:m@{ep.url}", suite, endpoint_retries=1)
    finally:
        ep.close()
    inc = res["meta"]["incomplete"]
    assert inc and inc["tasks_done"] == 2 and inc["tasks_total"] == 5 and "503" in inc["error"]
    assert len(res["tasks"]) == 2 and all(t["n"] == 4 for t in res["tasks"])
    assert ep.state["n"] >= 8 + 2  # the failing chunk was retried
    assert res["samples"][0]["text"].startswith("I think")


@pytest.mark.slow
def test_cli_eval_table_json_and_errors(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    out = tmp_path / "e.json"
    p = _cli(["eval", "--model", "tiny-random", "--suite", str(suite), "--out", str(out), "--limit", "1"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "pass@1" in p.stdout and "maj@4" in p.stdout and "gym:basic_arithmetic" in p.stdout
    data = json.loads(out.read_text())
    assert {"tasks", "domains", "meta", "samples"} <= set(data)
    assert {"id", "domain", "n", "correct"} <= set(data["tasks"][0])
    assert {"pass@1", "pass@4", "maj@4", "ci"} <= set(data["domains"]["gym:chain_sum"])

    bad = write_suite(tmp_path, "bad.yaml", sources=[{"name": "gym:no_such_domain"}])
    p = _cli(["eval", "--model", "tiny-random", "--suite", str(bad)], tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("honing: error: ")
    assert "gym:no_such_domain" in p.stderr

    p = _cli(["eval", "--model", "tiny-random", "--suite", str(suite), "--out", str(tmp_path / "none.json"),
              "--resume"], tmp_path)
    assert p.returncode == 2 and "--resume: no earlier evaluation at" in p.stderr and "none.json" in p.stderr
    p = _cli(["eval", "--model", "tiny-random", "--suite", str(suite), "--out", str(out), "--limit", "1", "--resume"],
             tmp_path)  # a finished evaluation: every chunk comes from the file
    assert p.returncode == 0 and "resumed: 2 task(s)" in p.stdout, p.stderr
    assert json.loads(out.read_text())["samples"] == data["samples"]

    (tmp_path / "runs" / "empty").mkdir(parents=True)
    (tmp_path / "runs" / "empty" / "config.yaml").write_text("{}\n")
    p = _cli(["eval", "--model", "runs/empty", "--suite", str(suite)], tmp_path)
    assert p.returncode == 2 and "has no checkpoints" in p.stderr

    ep = FlakyEndpoint(ok_requests=8)
    try:
        part = tmp_path / "partial.json"
        p = _cli(["eval", "--model", f"openai:m@{ep.url}", "--suite", str(suite), "--out", str(part)], tmp_path)
    finally:
        ep.close()
    assert p.returncode == 2 and "stopped after 2/5 tasks" in p.stderr and "partial results in" in p.stderr
    assert len(json.loads(part.read_text())["tasks"]) == 2


def test_run_evaluations_are_stored_next_to_the_run(tmp_path: Path) -> None:
    from honing.eval.cli import _default_out

    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    assert _default_out(str(run), "quick") == run / "eval" / "quick.json"
    assert _default_out(f"{run}@step-4", "configs/suites/regression.yaml") == run / "eval" / "regression-step-4.json"
    assert _default_out("tiny-random", "quick") is None


def test_per_source_token_budget_and_chunks_never_mix_sources(tmp_path: Path) -> None:
    from honing.eval.runner import make_chunks

    p = write_suite(tmp_path, "budget.yaml", sources=[
        {"name": "gym:chain_sum", "count": 3, "max_new_tokens": 2},
        {"name": "gym:basic_arithmetic", "count": 2}])
    suite = load_suite(str(p))
    chunks = make_chunks(suite_tasks(suite), suite.batch_tasks)
    assert [(s, len(c)) for s, c in chunks] == [(0, 2), (0, 1), (1, 2)]
    res = evaluate_suite("tiny-random", suite)
    lens = {d: max(s["n_tokens"] for s in res["samples"] if s["domain"] == d) for d in res["domains"]}
    assert lens["gym:chain_sum"] <= 2 < lens["gym:basic_arithmetic"] <= 6
