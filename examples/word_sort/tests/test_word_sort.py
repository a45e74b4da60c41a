"""word_sort's own tests: the reward function, the generator, and honing's self-test."""

from __future__ import annotations

import itertools

from honing_env_word_sort import ENV, make_tasks, score, split_of


def test_reward_exact_partial_and_junk() -> None:
    assert score("apple banana cherry", "apple banana cherry") == 1.0
    assert score("Sure:\napple, banana, cherry", "apple banana cherry") == 1.0
    assert 0 < score("apple cherry banana", "apple banana cherry") < 0.5
    assert score("banana apple", "apple banana cherry") == 0.0
    assert score("", "apple banana cherry") == score("I don't know", "apple banana cherry") == 0.0


def test_splits_are_decided_by_the_question() -> None:
    for split in ("train", "heldout"):
        for t in itertools.islice(make_tasks(split, 0), 50):
            assert split_of(t["prompt"]) == split
            assert t["answer"] not in t["prompt"]


def test_levels() -> None:
    t = next(make_tasks("train", 0, level=3, min_words=4, max_words=4))
    words = t["answer"].split()
    assert len(words) == 4 and len({w[:2] for w in words}) == 1


def test_honing_self_test_passes() -> None:
    from honing.envcheck import check_environment

    report = check_environment(ENV, n=4)
    assert report.ok, report.table()
