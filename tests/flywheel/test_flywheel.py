"""The data flywheel: logs -> de-identified, deduped pool snapshot -> tasks that verify and train.

Presidio's set-up is slow (its import pulls in transformers), so one Deidentifier is built per
module, under a guard that fails any network connection and any spaCy model download.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("presidio_analyzer")

from honing.flywheel.deid import Deidentifier  # noqa: E402
from honing.flywheel.ingest import ingest  # noqa: E402
from honing.flywheel.logs import LogError  # noqa: E402
from honing.flywheel.pool import history, preference_pairs, read_rows  # noqa: E402

HONING = str(Path(sys.executable).with_name("honing"))

PII = {  # planted values: none may appear in any stored pool file
    "EMAIL_ADDRESS": ["dana.whitfield@example.org", "kbrooks77@mailbox.net"],
    "PHONE_NUMBER": ["(415) 867-2391", "+44 20 7946 0958"],
    "CREDIT_CARD": ["4539 1488 0343 6467", "5500-0000-0000-0004"],
    "IBAN_CODE": ["DE89 3704 0044 0532 0130 00"],
    "US_SSN": ["536-22-8143"],
    "IP_ADDRESS": ["203.0.113.77"],
    "API_KEY": ["sk-proj-Q2x9LmTz8RvB4nKw7YpJ1cFd", "ghp_4fGh7JkL9mNpQrStUvWxYz0123456789Ab"],
    "PERSON": ["Dana Whitfield", "Kevin Brooks"],
}
HELDOUT = ["A farmer has 17 sheep and buys 8 more sheep at the market; how many sheep does the farmer own now?",
           "Compute the greatest common divisor of 84 and 126 and explain each step of the Euclidean algorithm."]


def _net_blocked(*a: Any, **k: Any) -> None:
    raise AssertionError("the flywheel tried to open a network connection")


@pytest.fixture(scope="module")
def deid() -> Iterator[Deidentifier]:
    import spacy.cli

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _net_blocked)
        mp.setattr(socket, "create_connection", _net_blocked)
        mp.setattr(spacy.cli, "download", lambda *a, **k: _net_blocked())
        d = Deidentifier()
        assert d.scrub("mail dana.whitfield@example.org") == "mail <EMAIL_ADDRESS>"  # first use, still offline
        yield d


def _rec(i: int, content: str, **kw: Any) -> dict[str, Any]:
    return {"id": f"chatcmpl-{i}", "messages": [{"role": "user", "content": content}], **kw}


def _logs(tmp: Path) -> Path:
    rows = []
    for i in range(30):  # accepted numeric answers
        rows.append(_rec(i, f"How much is {i} plus {i + 7}? Please show the sum.",
                         response=f"The sum is \\boxed{{{2 * i + 7}}}", metadata={"accepted": True}))
    rows += [
        _rec(100, f"Hi, my name is {PII['PERSON'][0]}, email {PII['EMAIL_ADDRESS'][0]}, phone {PII['PHONE_NUMBER'][0]}. "
                  "What is 12 times 12?", metadata={"accepted_answer": "144"}),
        _rec(101, f"Extract the invoice: Invoice INV-881 from Acme Tools, total $2,310.00. Paid with card "
                  f"{PII['CREDIT_CARD'][0]}, IBAN {PII['IBAN_CODE'][0]}.", response='{"invoice": "INV-881"}',
             metadata={"correction": {"invoice": "INV-881", "vendor": "Acme Tools", "total": 2310.0}}),
        _rec(102, f"Write add(a, b). Our deploy key is {PII['API_KEY'][0]} and token {PII['API_KEY'][1]}.",
             response="```python\ndef add(a, b):\n    return a + b\n```",
             metadata={"tests": "assert add(2, 3) == 5\nassert add(-4, 4) == 0"}),
        {"id": "chatcmpl-103", "messages": [
            {"role": "user", "content": f"Dear support, I'm {PII['PERSON'][1]} (SSN {PII['US_SSN'][0]}, from "
                                        f"{PII['IP_ADDRESS'][0]}). How many open tickets do I have?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": "tickets", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "open tickets: 3"}],
         "response": "You have 3 open tickets.", "metadata": {"outcome": {"success": True, "answer": "3"}}},
        _rec(104, f"Call me on {PII['PHONE_NUMBER'][1]} or {PII['EMAIL_ADDRESS'][1]}: write a haiku about rain",
             response="Rain on the window", metadata={"feedback": "thumbs_down"}),
        _rec(105, "Write a haiku about rain", response="Soft rain", metadata={"feedback": "thumbs_up"}),
        # planted held-out questions: verbatim, re-cased and re-punctuated, and with one word changed
        _rec(200, HELDOUT[0], metadata={"accepted_answer": "25"}),
        _rec(201, HELDOUT[1].upper().replace(";", " -"), metadata={"accepted_answer": "42"}),
        _rec(202, HELDOUT[0].replace("market", "fair"), metadata={"accepted_answer": "25"}),
        _rec(300, "How much is 3 plus 10? Please show the sum.", metadata={"accepted_answer": "13"}),  # dup of #3
        _rec(301, "ignored", metadata={"opt_out": True}),
    ]
    d = tmp / "logs"
    d.mkdir()
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    serve = [  # the shape honing.serve's LogStore records: the request body whole, the reply as choices
        {"id": "srv-1", "time": 1.0, "endpoint": "/v1/chat/completions", "model": "m", "release": "v1",
         "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is 9 squared?"}]}],
                     "metadata": {"accepted": "true"}},
         "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "<answer>81</answer>"},
                                   "finish_reason": "stop"}], "usage": {}}, "latency_s": 0.1},
        {"id": "srv-2", "time": 2.0, "endpoint": "/v1/completions", "model": "m", "release": "v1",
         "request": {"prompt": f"Email {PII['EMAIL_ADDRESS'][0]}: def square(x):", "metadata": {
             "tests": "assert square(3) == 9"}},
         "response": {"choices": [{"index": 0, "text": " return x * x", "finish_reason": "stop"}], "usage": {}}},
    ]
    (d / "requests-20261202T000000-1-0001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in serve))
    return d


def _suite(tmp: Path) -> str:
    src = tmp / "heldout.jsonl"
    src.write_text("".join(json.dumps({"id": f"h{i}", "prompt": q, "answer": "x", "split": "heldout"}) + "\n"
                           for i, q in enumerate(HELDOUT)))
    path = tmp / "suite.yaml"
    path.write_text(f"name: planted\nsources:\n  - {{name: 'jsonl:{src}', count: {len(HELDOUT)}}}\n")
    return str(path)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, deid: Deidentifier) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("fw")
    res = ingest(_logs(tmp), tmp / "pool", suites=[_suite(tmp)], deid=deid)
    return tmp, res


def _stored_text(pool_dir: Path) -> str:
    import pyarrow.parquet as pq

    out = []
    for f in sorted(pool_dir.rglob("*")):
        if f.is_file():
            out.append(json.dumps(pq.read_table(f).to_pylist()) if f.suffix == ".parquet" else f.read_text())
    return "\n".join(out)


def test_planted_pii_absent_from_every_pool_file(pool: tuple[Path, Any]) -> None:
    tmp, res = pool
    text = _stored_text(res.pool)
    for kind, values in PII.items():
        for v in values:
            assert v not in text, kind
            digits = "".join(c for c in v if c.isdigit())
            if kind in ("CREDIT_CARD", "US_SSN", "PHONE_NUMBER", "IBAN_CODE"):
                assert digits not in text.replace(" ", "").replace("-", ""), kind
    for kind in PII:
        assert res.redaction["counts"].get(kind, 0) >= 1, (kind, res.redaction)
    report = json.loads((res.pool / "reports" / f"{res.version}.json").read_text())
    assert set(report["redaction"]["counts"]) >= set(PII)  # counts only: the values were checked absent above


def test_heldout_questions_excluded_and_duplicates_merged(pool: tuple[Path, Any]) -> None:
    tmp, res = pool
    rows = list(read_rows(res.pool, res.version))
    questions = " ".join(r["question"].lower() for r in rows)
    assert "sheep" not in questions and "euclidean" not in questions
    assert res.counts["heldout_excluded"] == 3 and res.counts["opted_out"] == 1
    dup = [r for r in rows if "chatcmpl-300" in r["log_ids"]]
    assert len(dup) == 1 and dup[0]["log_ids"] == ["chatcmpl-3", "chatcmpl-300"]  # provenance of both copies
    by_log = {lid: r for r in rows for lid in r["log_ids"]}
    assert by_log["srv-1"]["kind"] == "math" and json.loads(by_log["srv-1"]["task"])["hidden"]["answer"] == "81"
    assert by_log["srv-2"]["kind"] == "code" and "<EMAIL_ADDRESS>" in by_log["srv-2"]["question"]
    kinds = {r["kind"] for r in rows}
    assert kinds == {"math", "extract", "code", "tool", "judge", "preference"}
    pairs = list(preference_pairs(res.pool))
    assert len(pairs) == 1 and pairs[0]["label"] == "undesirable" and "<PHONE_NUMBER>" in pairs[0]["prompt"][0]["content"]


def test_snapshots_are_content_addressed(pool: tuple[Path, Any], deid: Deidentifier) -> None:
    tmp, res = pool
    again = ingest(tmp / "logs", res.pool, suites=[_suite(tmp)], deid=deid)
    assert again.version == res.version and not again.created and len(history(res.pool)) == 1
    more = tmp / "more.jsonl"
    more.write_text(json.dumps(_rec(400, "What is 1000 minus 1?", metadata={"accepted_answer": "999"})) + "\n")
    new = ingest(more, res.pool, suites=[_suite(tmp)], deid=deid)
    assert new.created and new.parent == res.version and new.counts["new_items"] == 1
    assert [h["version"] for h in history(res.pool)] == [res.version, new.version]
    assert len(list(read_rows(res.pool, new.version))) == len(list(read_rows(res.pool, res.version))) + 1


def test_pool_source_tasks_verify(pool: tuple[Path, Any]) -> None:
    from honing.rollout.types import Trajectory
    from honing.tasks import make_source
    from honing.verify import grade
    from honing.verify.types import VerifyContext

    tmp, res = pool
    src = make_source(f"pool:{res.pool}@{res.version}")
    tasks = list(src.tasks("train", 0)) + list(src.tasks("heldout", 0))
    by_kind: dict[str, Any] = {}
    for t in tasks:
        by_kind.setdefault(t.metadata["kind"], t)
        assert t.metadata["log_ids"] and t.metadata["pool_version"] == res.version
    assert set(by_kind) == {"math", "extract", "code", "tool"}  # judge and preference are not yielded by default
    assert len(list(make_source(f"pool:{res.pool}@latest", {"kinds": ["judge"]}).tasks("train", 0))) + \
        len(list(make_source(f"pool:{res.pool}", {"kinds": ["judge"]}).tasks("heldout", 0))) == 1

    def score(task: Any, text: str) -> float:
        return grade(task, Trajectory.from_text(task.id, task.domain, text), VerifyContext()).score

    math = next(t for t in tasks if t.metadata["kind"] == "math" and t.hidden["answer"] == "144")
    assert "<PERSON>" in math.question and score(math, "\\boxed{144}") == 1.0 and score(math, "\\boxed{143}") == 0.0
    ext = by_kind["extract"]
    good = '{"invoice": "INV-881", "vendor": "acme tools", "total": "2,310.00"}'
    assert score(ext, good) == 1.0 and score(ext, '{"invoice": "INV-881"}') < 0.5
    tool = by_kind["tool"]
    assert "open tickets: 3" in tool.question and score(tool, "You have 3") == 1.0
    if shutil.which("bwrap"):
        code = by_kind["code"]
        assert score(code, "```python\ndef add(a, b):\n    return a + b\n```") == 1.0
        assert score(code, "```python\ndef add(a, b):\n    return a - b\n```") < 1.0


def test_trains_a_few_steps_on_the_pool(pool: tuple[Path, Any]) -> None:
    import honing

    tmp, res = pool
    s = honing.train({"model": {"name": "tiny-random"}, "train": {"steps": 2}, "eval": {"heldout_tasks": 2},
                      "generation": {"max_new_tokens": 4},
                      "tasks": {"prompts_per_step": 2, "samples_per_prompt": 2,
                                "sources": [{"name": f"pool:{res.pool}@{res.version}",
                                             "params": {"kinds": ["math", "extract"]}}]}},
                     out=tmp / "run")
    assert s.steps == 2
    metrics = (tmp / "run" / "metrics.jsonl").read_text()
    assert "reward/flywheel:" in metrics and "heldout/flywheel:" in metrics  # it trained on pool tasks


def test_corrupt_line_names_file_and_line_and_writes_nothing(tmp_path: Path, deid: Deidentifier) -> None:
    logs = tmp_path / "bad.jsonl"
    good = json.dumps(_rec(1, "What is 2 + 2?", metadata={"accepted_answer": "4"}))
    logs.write_text(good + "\n" + '{"messages": [{"role": "user", "content": "secret 4539 1488 0343 6467"\n' + good + "\n")
    with pytest.raises(LogError, match=rf"{logs}:2: not valid JSON"):
        ingest(logs, tmp_path / "pool", suites=[], deid=deid)
    assert not (tmp_path / "pool").exists()
    res = ingest(logs, tmp_path / "pool", suites=[], skip_bad=True, deid=deid)
    assert res.counts["bad_lines"] == 1 and res.counts["records"] == 2 and res.counts["new_items"] == 1
    p = subprocess.run([HONING, "flywheel", "ingest", str(logs), "--out", str(tmp_path / "p2"), "--suite", "quick"],
                       capture_output=True, text=True, timeout=300)
    errs = [x for x in p.stderr.splitlines() if x.startswith("honing: error:")]
    assert p.returncode == 2 and len(errs) == 1 and errs[0].startswith(f"honing: error: {logs}:2: not valid JSON"), p.stderr
    assert "4539" not in p.stderr and not (tmp_path / "p2").exists()
    st = subprocess.run([HONING, "flywheel", "status", str(tmp_path / "pool"), "--json"], capture_output=True,
                        text=True, timeout=300)
    got = json.loads(st.stdout)
    assert st.returncode == 0 and got["version"] == res.version and got["kinds"] == {"math": 1}
    assert got["report"]["ingest"]["bad_lines"] == 1 and got["log_records"] == 2
    missing = subprocess.run([HONING, "flywheel", "status", str(tmp_path / "nope")], capture_output=True, text=True,
                             timeout=300)
    assert missing.returncode == 2 and missing.stderr.startswith("honing: error: pool not found")
