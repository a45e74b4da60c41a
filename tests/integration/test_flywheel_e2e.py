"""Issue 20, "what it must show" 1: the whole circle with real parts.

release v1 (a short tiny-model run) -> `honing serve release:current` (real uvicorn) -> a client sends
requests with planted PII and planted held-out questions plus verifiable ones -> flywheel ingest
(real Presidio) -> a pool snapshot with none of the planted PII or held-out text and with verifiable
tasks -> train a few steps on `pool:<dir>@<version>` -> release v2 -> promote through the eval-compare
gate -> rollback -> the server answers from v1 again, with v1's greedy text.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("presidio_analyzer")
pytest.importorskip("presidio_anonymizer")
pytest.importorskip("datasketch")

pytestmark = pytest.mark.slow

ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
         "allow_negation": False, "allow_parentheses": False}
SUITE = {"name": "tiny-flywheel", "version": 1, "seed": 1000003, "samples_per_task": 2,
         "sampling": {"temperature": 0.7, "max_new_tokens": 4}, "extractor": "last_number", "batch_tasks": 8,
         "sources": [{"name": "gym:basic_arithmetic", "count": 8, "params": ARITH}]}

PII = {
    "email": "jane.doe@example.com",
    "phone": "(415) 555-0132",
    "card": "4111 1111 1111 1111",  # Luhn-valid
    "iban": "DE89370400440532013000",
    "ssn": "078-05-1120",
    "secret": "sk-live-4fQ9zX2mL7pR8tV3wY6bN1cK5hJ0dS",
    "name": "Margaret Thornbury",
}
PROMPT = {"messages": [{"role": "user", "content": "Please add the numbers twelve and thirty."}],
          "max_tokens": 6, "temperature": 0}


def _train(cfg_overrides: list[str], run_dir: Path) -> None:
    from honing.config import load_config
    from honing.schedule.loop import train

    cfg, _ = load_config("smoke", cfg_overrides)
    train(cfg, run_dir, show_progress=False)


def _chat(client: "httpx.Client", text: str, metadata: dict | None = None) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0}
    if metadata is not None:
        body["metadata"] = metadata
    r = client.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_flywheel_circle(tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    import pyarrow.parquet as pq

    from honing.eval.suite import load_suite, suite_tasks
    from honing.flywheel import ingest
    from honing.release import PromoteRefused, create_release, promote, rollback

    from honing.serve import start_server

    reg, logs, pool = tmp_path / "registry", tmp_path / "logs", tmp_path / "pool"
    suite_path = tmp_path / "tiny-flywheel.yaml"
    suite_path.write_text(yaml.safe_dump(SUITE))
    heldout = suite_tasks(load_suite(str(suite_path))).tasks
    heldout_q = sorted({t.prompt[-1]["content"] for t in heldout})
    assert heldout_q

    common = ["train.steps=2", "sft.steps=0", "tasks.prompts_per_step=4", "tasks.samples_per_prompt=2",
              "eval.heldout_tasks=4", "checkpoint.every_steps=0"]
    run1 = tmp_path / "run1"
    _train(common, run1)
    create_release(str(run1), "v1", registry=reg, suite=str(suite_path), limit=8)
    promote("v1", reg)

    with start_server("release:current", registry=reg, log_dir=logs, port=0, follow_s=0.2) as s:
        with httpx.Client(base_url=s.url + "/v1", timeout=60) as c:
            first = c.post("/chat/completions", json=PROMPT).json()
            assert first["model"] == "v1"
            v1_text = first["choices"][0]["message"]["content"]
            # planted PII (each also a verifiable task, so it would be stored if not scrubbed)
            pii_texts = [
                f"My name is {PII['name']}. Email me at {PII['email']} with the sum of 7 and 8, please.",
                f"Call {PII['phone']} and tell me what 21 plus 4 is.",
                f"Charge card {PII['card']} for 3 items at 5 dollars each: what is the total?",
                f"Wire to IBAN {PII['iban']} the sum of 40 and 2 euros. How much is that?",
                f"My SSN is {PII['ssn']}; how many digits does 1000 have?",
                f"Use api key {PII['secret']} to compute 9 times 9.",
            ]
            for i, t in enumerate(pii_texts):
                _chat(c, t, {"accepted_answer": str(10 + i)})
            for q in heldout_q:  # planted held-out questions, with an answer so they would be tasks
                _chat(c, q, {"accepted_answer": "5"})
            ordinary = ["How many legs do three spiders have together?", "What is 123 minus 23 in total?",
                        "A dozen eggs plus six more eggs makes how many eggs?"]
            for t, a in zip(ordinary, ("24", "100", "18")):
                _chat(c, t, {"accepted_answer": a})

            res = ingest(logs, pool, suites=[str(suite_path)], heldout_sources=())
            assert res.counts["records"] == 1 + len(pii_texts) + len(heldout_q) + len(ordinary)
            assert res.counts["heldout_excluded"] >= len(heldout_q)
            stored = list((pool / "snapshots").glob("*.parquet"))
            assert stored
            rows = [r for p in stored for r in pq.read_table(p).to_pylist()]
            text = repr(rows) + "".join(p.read_bytes().decode("latin-1") for p in pool.rglob("*") if p.is_file())
            for kind, value in PII.items():
                for form in {value, value.replace(" ", ""), value.replace("-", "")}:
                    assert form not in text, f"planted {kind} survived ingest"
            for q in heldout_q:
                assert q not in text, f"held-out question {q!r} reached the pool"
            math_rows = [r for r in rows if r["kind"] == "math"]
            assert len(math_rows) >= len(ordinary)
            assert any("spiders" in r["question"] for r in math_rows)

            run2 = tmp_path / "run2"
            _train(common + [f'tasks.sources=[{{"name": "pool:{pool}@{res.version}"}}]'], run2)
            create_release(str(run2), "v2", registry=reg, suite=str(suite_path), limit=8)
            try:
                out = promote("v2", reg)
                assert out["comparison"] is not None  # the gate ran against v1
                gated = "passed"
            except PromoteRefused as e:
                assert "v1" in str(e) or "regress" in str(e).lower()
                out = promote("v2", reg, require_gate=False)
                gated = "refused"
            assert out["current"] == "v2" and out["previous"] == "v1", gated

            deadline = time.time() + 20
            while c.post("/chat/completions", json=PROMPT).json()["model"] != "v2":
                assert time.time() < deadline, "server did not follow the promotion"
                time.sleep(0.1)
            rollback(reg)
            deadline = time.time() + 20
            while True:
                again = c.post("/chat/completions", json=PROMPT).json()
                if again["model"] == "v1":
                    break
                assert time.time() < deadline, "server did not follow the rollback"
                time.sleep(0.1)
            assert again["choices"][0]["message"]["content"] == v1_text
