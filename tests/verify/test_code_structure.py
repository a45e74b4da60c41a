"""code:functions held-out is disjoint from training by structure (issue 18): no structure hash is
shared between the splits, the contamination guard finds no held-out task in the training
stream, every tier (and every template, alone) has held-out structures, and every structure's
reference source computes what its hidden expected values say. All in-process (no sandbox; the
sandbox run of the references is in test_code.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from honing.errors import TaskError
from honing.eval.contamination import check_contamination
from honing.tasks.code import (
    STRUCTURE_SPLIT,
    TEMPLATE_NAMES,
    TEMPLATES,
    CodeFunctionsSource,
    reference_solution,
    split_variants,
    structure_hash,
    variant_of,
)
from honing.verify.code import same_value


def first(src: CodeFunctionsSource, split: str, n: int, seed: int = 0) -> list:
    return [src.make(split, i) for i in range(seed, seed + n)]


def test_no_structure_shared_between_train_and_heldout() -> None:
    src = CodeFunctionsSource()
    train, held = first(src, "train", 2000), first(src, "heldout", 256)
    train_s, held_s = {t.metadata["structure"] for t in train}, {t.metadata["structure"] for t in held}
    assert not train_s & held_s
    assert not {t.hidden["function"] for t in train} & {t.hidden["function"] for t in held}
    for t in train[:50] + held[:50]:
        assert t.metadata["structure"] == structure_hash(t.metadata["structure_key"]) == variant_of(t).structure
    assert {STRUCTURE_SPLIT[t.metadata["structure_key"]] for t in train} == {"train"}
    assert {STRUCTURE_SPLIT[t.metadata["structure_key"]] for t in held} == {"heldout"}
    # most structures of each split show up: the streams are not a handful of problems
    assert len(held_s) == sum(len(split_variants(t, "heldout")) for t in TEMPLATES)
    assert len(train_s) == sum(len(split_variants(t, "train")) for t in TEMPLATES)


def test_heldout_covers_every_tier_like_train() -> None:
    src = CodeFunctionsSource()
    tiers = {s: Counter(t.tags[1] for t in first(src, s, 600)) for s in ("train", "heldout")}
    assert set(tiers["heldout"]) == set(tiers["train"]) == {"tier1", "tier2", "tier3"}
    for tier, n in tiers["train"].items():
        assert abs(tiers["heldout"][tier] / 600 - n / 600) < 0.1, tiers
    for tier in (1, 2, 3):
        held = first(CodeFunctionsSource({"tiers": [tier]}), "heldout", 20)
        assert {t.difficulty for t in held} == {tier / 3}


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_one_template_alone_still_has_heldout(name: str) -> None:
    src = CodeFunctionsSource({"templates": [name], "num_cases": 2})
    train, held = first(src, "train", 60), first(src, "heldout", 20)
    assert {t.metadata["template"] for t in train + held} == {name}
    assert held and not {t.metadata["structure"] for t in train} & {t.metadata["structure"] for t in held}
    assert len({t.metadata["structure"] for t in train}) >= 1


def test_contamination_guard_finds_no_heldout_task_in_training() -> None:
    src = CodeFunctionsSource()
    rep = check_contamination([src], first(src, "heldout", 64, seed=1000003), n_train=2000)
    assert rep["train_docs"] == 2000 and rep["eval_tasks"] == 64
    c = rep["counts"]
    assert c["exact"] == 0 and c["ngram"] == 0 and c["near_dup"] == 0 and c["contaminated"] == 0, rep["worst"][:3]


def test_reference_sources_agree_with_the_expected_values() -> None:
    """Each structure's source (what `reference_solution` returns) and its independently written
    `ref` (which computes the hidden expected values) agree, type included, on generated inputs."""
    for tpl in TEMPLATES:
        assert len(tpl.variants) >= 2
        for v in tpl.variants:
            ns: dict = {}
            exec(v.source, ns)
            fn, rng = ns[v.name], random.Random(v.key)
            for i in range(80):
                args = v.gen(rng, (1, 3, 8)[i % 3])
                want, got = v.ref(*args), fn(*args)
                assert type(got) is type(want) and same_value(got, want), (v.name, args, got, want)


def test_reference_solution_refuses_heldout_structures() -> None:
    from honing.tasks.reference import reference_replies

    src = CodeFunctionsSource({"num_cases": 3})
    task = src.make("train", 0)
    (reply,) = reference_replies(task)
    assert reply.startswith("```python\ndef " + task.hidden["function"] + "(") and reply.endswith("\n```")
    held = src.make("heldout", 0)
    with pytest.raises(TaskError, match="held-out"):
        reference_solution(held)
    assert reference_solution(held, allow_heldout=True).startswith(f"def {held.hidden['function']}(")
    with pytest.raises(TaskError):
        variant_of(task.__class__(id="x", domain="code:functions", prompt=(), verifier=task.verifier))


def test_prompts_show_no_hidden_case() -> None:
    src = CodeFunctionsSource({"num_examples": 3})
    for t in first(src, "heldout", 40) + first(src, "train", 40):
        assert t.hidden["function"] in t.question and variant_of(t).description in t.question
        for args, _ in t.hidden["cases"]:
            assert args not in t.metadata["examples"]


def test_train_parts_split_the_training_structures_and_leave_heldout_alone() -> None:
    """SFT on part 1/2 and RL on part 2/2: no structure in both, together all training structures,
    every template in each part, and the held-out stream unchanged."""
    whole, a, b = (CodeFunctionsSource(p) for p in ({}, {"train_part": "1/2"}, {"train_part": "2/2"}))
    sa, sb = ({t.metadata["structure"] for t in first(s, "train", 1500)} for s in (a, b))
    assert sa and sb and not sa & sb
    assert sa | sb == {t.metadata["structure"] for t in first(whole, "train", 3000)}
    for part in (a, b):
        assert {t.metadata["template"] for t in first(part, "train", 600)} == set(TEMPLATE_NAMES)
    assert [t.prompt for t in first(a, "heldout", 40)] == [t.prompt for t in first(whole, "heldout", 40)]
    assert CodeFunctionsSource({"train_part": "all"}).make("train", 5).prompt == whole.make("train", 5).prompt


@pytest.mark.parametrize("bad", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_bad_train_part_is_refused(bad: str) -> None:
    with pytest.raises(TaskError, match="train_part"):
        CodeFunctionsSource({"train_part": bad})


def test_too_many_parts_leave_a_template_empty() -> None:
    with pytest.raises(TaskError, match="without training structures"):
        CodeFunctionsSource({"train_part": "5/5", "templates": ["is_palindrome"]})
