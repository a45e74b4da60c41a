"""Every reasoning-gym dataset (but `composite`) streams train and held-out tasks with its default
parameters, and its own reference answer scores 1 through honing's `reasoning_gym` verifier."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import honing.tasks.gym as gym
from honing.errors import TaskError
from honing.tasks import GymSource, Task, make_source
from honing.tasks.gym import TRAIN_SEED_SPAN, gym_dataset
from honing.verify import VerifyContext, grade

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.factory import DATASETS  # noqa: E402

TRAIN_SEED, HELDOUT_SEED = 0, 1_000_003  # the config defaults (tasks.train_seed, tasks.heldout_seed)

# `composite` mixes other datasets and needs a list of them; it has no default to stream.
NAMES = sorted(n for n in DATASETS if n != "composite")

# Datasets without a single reference answer: entry["answer"] is None and any valid solution is
# accepted by their scorer. The test checks that their own scorer really does not give their
# reference 1, so this list cannot go stale silently.
NO_REFERENCE = {
    "boxnet": "answer None; any JSON action plan that moves the boxes to their targets is scored",
    "graph_color": "answer None; any valid colouring of the graph (JSON) scores 1",
    "propositional_logic": "answer None; any valid, non-trivial conclusion from the premises scores 1",
    "rubiks_cube": "answer None; any move sequence that solves the scrambled cube scores 1",
    "rush_hour": "answer None; any move sequence that frees the red car scores 1",
}


def _take(src: Any, split: str, seed: int, n: int) -> list[Task]:
    return list(itertools.islice(src.tasks(split, seed), n))


def test_excluded_names_are_real_datasets() -> None:
    assert set(NO_REFERENCE) <= set(NAMES), sorted(set(NO_REFERENCE) - set(NAMES))


@pytest.mark.parametrize("name", NAMES)
def test_dataset_streams_and_reference_answer_scores_one(name: str) -> None:
    src = make_source(f"gym:{name}")
    train = _take(src, "train", TRAIN_SEED, 2)
    held = _take(src, "heldout", HELDOUT_SEED, 2)
    assert len(train) == 2 and len(held) == 2
    assert all(TRAIN_SEED <= t.metadata["seed"] < TRAIN_SEED + TRAIN_SEED_SPAN for t in train)
    assert all(t.metadata["seed"] >= HELDOUT_SEED for t in held)
    assert len({t.id for t in train + held}) == 4
    ds = gym_dataset(name, {})
    ctx = VerifyContext()  # the default extractor (last_number), as a run's config has it
    for task in train + held:
        entry = task.hidden["entry"]
        answer = entry["answer"]
        assert task.domain == f"gym:{name}" and task.verifier.name == "reasoning_gym"
        assert isinstance(task.question, str) and task.question
        own = 0.0 if answer is None else float(ds.score_answer(answer, entry))
        if name in NO_REFERENCE:
            assert own < 1.0, f"{name} now has a reference answer its scorer accepts: drop it from NO_REFERENCE"
            continue
        assert isinstance(answer, str) and own == 1.0, (name, task.id, answer, own)
        for completion, c in [(answer, ctx), (f"<answer>{answer}</answer>", ctx),
                              (f"Working it out.\n<answer>\n{answer}\n</answer>", VerifyContext("answer_tag")),
                              (answer, VerifyContext("full"))]:
            v = grade(task, completion, c)
            assert v.score == 1.0 and v.passed and not v.infra_error, (name, task.id, completion, c, v.details)
        wrong = grade(task, "<answer>zzz not it</answer>", ctx)
        assert not wrong.passed and not wrong.infra_error, (name, task.id, wrong.details)


# --- the chunked stream --------------------------------------------------------------------------


def test_chunked_stream_keeps_item_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stream item i is item i of one dataset made with the stream's seed, across chunk boundaries.
    monkeypatch.setattr(gym, "CHUNK", 3)
    for name in ("word_ladder", "basic_arithmetic"):
        got = _take(GymSource(name), "heldout", 7, 8)
        ref = reasoning_gym.create_dataset(name, seed=7, size=8)
        assert [t.question for t in got] == [ref[i]["question"] for i in range(8)]
        assert [t.metadata["seed"] for t in got] == list(range(7, 15))


def test_no_huge_size_is_requested(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = reasoning_gym.create_dataset

    def spy(name: str, **kw: Any) -> Any:
        sizes.append(kw.get("size", 0))
        return real(name, **kw)

    monkeypatch.setattr(reasoning_gym, "create_dataset", spy)
    _take(GymSource("word_ladder"), "train", 0, 3)  # word_ladder refuses size > 20,000
    assert sizes and max(sizes) <= gym.CHUNK


class _Flaky:
    """A dataset whose items at `bad` offsets (from its seed) fail, as word_ladder's can."""

    def __init__(self, seed: int, bad: set[int]) -> None:
        self.seed, self.bad = seed, bad

    def __getitem__(self, j: int) -> dict[str, Any]:
        if self.seed + j in self.bad:
            raise IndexError(f"exhausted at {self.seed + j}")
        return {"question": f"q{self.seed + j}", "answer": "1", "metadata": {}}


def test_failed_items_are_skipped_then_error(monkeypatch: pytest.MonkeyPatch) -> None:
    src = GymSource("basic_arithmetic")
    monkeypatch.setattr(GymSource, "_chunk", lambda self, seed: _Flaky(seed, {2, 3, 9}))
    got = _take(src, "train", 0, 8)
    assert [t.metadata["seed"] for t in got] == [0, 1, 4, 5, 6, 7, 8, 10]
    assert [t.question for t in got] == [f"q{s}" for s in (0, 1, 4, 5, 6, 7, 8, 10)]
    monkeypatch.setattr(GymSource, "_chunk", lambda self, seed: _Flaky(seed, set(range(1000))))
    with pytest.raises(TaskError, match="gym:basic_arithmetic: .* in a row"):
        _take(src, "train", 0, 1)


def test_chunk_creation_error_names_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    src = GymSource("word_ladder")
    monkeypatch.setattr(gym, "CHUNK", 50_000)  # more than word_ladder allows
    with pytest.raises(TaskError, match="gym:word_ladder: cannot create"):
        _take(src, "train", 0, 1)


# --- the verifier's answer reading ---------------------------------------------------------------


def test_reasoning_gym_verifier_reads_tags_and_whole_answers() -> None:
    task = _take(make_source("gym:word_ladder"), "train", 0, 1)[0]
    answer = task.hidden["answer"]
    ctx = VerifyContext()  # last_number would find nothing in 'WORD,...,WORD'
    assert grade(task, answer, ctx).passed
    assert grade(task, f"think\n<answer>{answer}</answer>", ctx).passed
    # Two different tagged answers get no credit, whatever the extractor.
    assert not grade(task, f"<answer>{answer}</answer><answer>A,B</answer>", ctx).passed
    # The whole completion counts only when it is itself a full-marks answer.
    assert not grade(task, f"I think it is {answer}", ctx).passed


def test_scorer_raising_on_malformed_answer_is_a_zero_not_infra() -> None:
    task = _take(make_source("gym:prime_factorization"), "train", 0, 1)[0]
    v = grade(task, "<answer>not a number</answer>", VerifyContext())
    assert v.score == 0.0 and not v.passed and not v.infra_error and "scorer raised ValueError" in v.details


def test_game_of_life_halting_scorer_is_fixed() -> None:
    # reasoning-gym's own scorer gives 1 to any non-empty answer (bool of a string); honing's does not.
    tasks = _take(make_source("gym:game_of_life_halting"), "train", 0, 6)
    ds = gym_dataset("game_of_life_halting", {})
    for task in tasks:
        answer = task.hidden["answer"]
        other = {"True": "False", "False": "True"}[answer]
        assert ds.score_answer(other, task.hidden["entry"]) == 1.0, "fixed upstream: drop SCORER_FIXES entry"
        assert not grade(task, f"<answer>{other}</answer>", VerifyContext()).passed
        assert grade(task, f"<answer>{answer.lower()}</answer>", VerifyContext()).passed


def test_one_reading_per_reply_no_second_chance() -> None:
    """gsm_symbolic's scorer reads the *first* number; the default reading for a numeric
    reference is the *last* one. Scoring both would let '<right> ... <wrong>' pass."""
    task = next(iter(make_source("gym:gsm_symbolic", {}).tasks("train", 0)))
    ref = int(float(task.hidden["answer"]))
    assert grade(task, f"{ref}", VerifyContext()).passed
    hedge = grade(task, f"First I thought {ref}, but it is {ref + 1}", VerifyContext())
    assert not hedge.passed and hedge.score < 0.5, hedge.details  # gsm_symbolic gives 0.01 for a wrong number
