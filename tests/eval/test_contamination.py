"""Contamination guard: planted duplicates are found; honing's own splits do not overlap."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from honing.eval.contamination import check_contamination, heldout_guard, words
from honing.schedule.sampler import heldout_tasks
from honing.tasks import make_source

HONING = Path(sys.executable).parent / "honing"
VOCAB = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud ember frost "
         "harbor island jungle lantern meadow north orbit pepper quartz saddle timber valley willow").split()


def sentence(rng: random.Random, n: int = 40) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n)).capitalize() + "?"


def edit(rng: random.Random, text: str, kind: str) -> str:
    ws = text.split()
    i = rng.randrange(5, len(ws) - 5)
    if kind == "substitute":
        ws[i] = "zebra"
    elif kind == "delete":
        del ws[i]
    elif kind == "insert":
        ws.insert(i, "please")
    elif kind == "format":  # case, punctuation and spacing only
        return "  " + text.upper().replace(" ", ",  ") + "!!"
    return " ".join(ws)


def planted(tmp_path: Path) -> tuple[Path, list[dict], dict[str, str]]:
    rng = random.Random(3)
    train = [sentence(rng) for _ in range(300)]
    path = tmp_path / "train.jsonl"
    with path.open("w") as f:
        for i, q in enumerate(train):
            f.write(json.dumps({"id": f"tr{i}", "prompt": q, "answer": "x", "split": "train"}) + "\n")
    evals, expect = [], {}
    for i in range(3):  # exact copies
        evals.append({"id": f"exact{i}", "text": train[10 + i]})
        expect[f"exact{i}"] = f"tr{10 + i}"
    for i, kind in enumerate(("substitute", "delete", "insert", "format")):
        evals.append({"id": f"edit-{kind}", "text": edit(rng, train[50 + i], kind)})
        expect[f"edit-{kind}"] = f"tr{50 + i}"
    for i in range(20):  # fresh
        evals.append({"id": f"fresh{i}", "text": sentence(random.Random(1000 + i))})
    return path, evals, expect


def test_planted_duplicates_are_found(tmp_path: Path) -> None:
    from honing.tasks import Task, VerifierSpec

    path, evals, expect = planted(tmp_path)
    tasks = [Task(e["id"], "user", ({"role": "user", "content": e["text"]},), VerifierSpec("exact_match"))
             for e in evals]
    rep = check_contamination([make_source(f"jsonl:{path}")], tasks, threshold=0.8)
    rows = {r["id"]: r for r in rep["tasks"]}
    for tid, train_id in expect.items():
        assert rows[tid]["contaminated"], rows[tid]
        assert rows[tid]["match_id"] == train_id, rows[tid]
    for tid in ("exact0", "exact1", "exact2", "edit-format"):
        assert rows[tid]["exact"] and rows[tid]["ngram_overlap"] == 1.0
    for kind in ("substitute", "delete", "insert"):
        r = rows[f"edit-{kind}"]
        assert not r["exact"] and 0.8 <= r["near_dup"] < 1.0 and 0.5 <= r["ngram_overlap"] < 1.0, r
    fresh = [r for r in rep["tasks"] if r["id"].startswith("fresh")]
    assert not any(r["contaminated"] for r in fresh)
    assert rep["counts"]["contaminated"] == 7 and rep["counts"]["exact"] == 4
    assert {r["id"] for r in rep["worst"][:7]} == set(expect)
    assert heldout_guard(rep) is not None


def test_zero_overlap_between_train_and_heldout_of_procedural_sources() -> None:
    for name in ("gym:leg_counting", "gym:chain_sum"):
        src = make_source(name, {})
        held = heldout_tasks([src], 64, 1_000_003)
        rep = check_contamination([src], held, n_train=2000)
        assert rep["counts"]["contaminated"] == 0 and rep["counts"]["exact"] == 0, (name, rep["worst"][:2])
        assert rep["train_docs"] == 2000 and rep["eval_tasks"] == 64
        assert rep["boilerplate"]["shingles"] > 0  # template text was recognised, not counted
        assert heldout_guard(rep) is None
    # ...while evaluating on the training split itself is flagged as contaminated, every task
    src = make_source("gym:leg_counting", {})
    same = [t for _, t in zip(range(32), src.tasks("train", 0))]
    assert check_contamination([src], same, n_train=2000)["counts"]["exact"] == 32


def test_words_normalise() -> None:
    assert words("Hello,  WORLD! 3.5x") == ["hello", "world", "3", "5x"]


def test_cli_contamination(tmp_path: Path) -> None:
    path, evals, _ = planted(tmp_path)
    suite_file = tmp_path / "s.yaml"
    ev = tmp_path / "eval.jsonl"
    with ev.open("w") as f:
        for e in evals:
            f.write(json.dumps({"id": e["id"], "prompt": e["text"], "answer": "x", "split": "heldout"}) + "\n")
    suite_file.write_text(f"name: s\nseed: 2000003\nsources:\n  - name: jsonl:{ev}\n    count: 100\n")
    out = tmp_path / "rep.json"
    p = subprocess.run([str(HONING), "eval", "contamination", "--train", f"jsonl:{path}", "--suite", str(suite_file),
                        "--out", str(out)], capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert p.returncode == 0, p.stderr
    assert "worst offenders" in p.stdout and "contamination:" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["eval_tasks"] == 27 and rep["counts"]["contaminated"] == 7
