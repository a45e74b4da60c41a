"""Task sources (reasoning-gym, JSONL), the task sampler, extractors and verifiers."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from honing.errors import ConfigError, TaskError
from honing.rollout.types import Trajectory
from honing.schedule.sampler import TaskSampler, check_seed_ranges, heldout_tasks
from honing.tasks import JsonlSource, Task, TaskSource, VerifierSpec, make_source
from honing.tasks.gym import TRAIN_SEED_SPAN
from honing.verify import Verdict, VerifyContext, get_verifier, grade, register_verifier, verifier_names
from honing.verify.extract import EXTRACTORS, answer_tag, boxed, full, last_number

PARAMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+"],
          "allow_negation": False, "allow_parentheses": False}


@pytest.fixture(scope="module")
def source() -> TaskSource:
    return make_source("gym:basic_arithmetic", PARAMS)


def _take(src: TaskSource, split: str, seed: int, n: int) -> list[Task]:
    return list(itertools.islice(src.tasks(split, seed), n))


# --- reasoning-gym source ------------------------------------------------------------------------


def test_gym_source_yields_tasks_with_hidden_answer(source: TaskSource) -> None:
    assert isinstance(source, TaskSource) and source.domain == "gym:basic_arithmetic"
    tasks = _take(source, "train", 0, 5)
    assert len(tasks) == 5 and all(isinstance(t, Task) for t in tasks)
    for t in tasks:
        assert t.domain == "gym:basic_arithmetic"
        assert t.verifier == VerifierSpec("reasoning_gym", {"dataset": "basic_arithmetic", "params": PARAMS})
        answer = t.hidden["answer"]
        # 'Calculate a + b.' -> a + b: the hidden answer is the real one.
        a, b = t.question.removeprefix("Calculate ").rstrip(".").split(" + ")
        assert answer == str(int(a) + int(b))
        # The prompt is only role/content messages; nothing from `hidden` is rendered into it.
        assert [m["role"] for m in t.prompt] == ["user"]
        assert all(set(m) == {"role", "content"} for m in t.prompt)
        assert t.prompt[-1]["content"] == t.hidden["entry"]["question"] == t.question
        assert "answer" not in t.prompt[-1]["content"].lower()


def test_task_hidden_and_metadata_are_read_only(source: TaskSource) -> None:
    task = _take(source, "train", 0, 1)[0]
    with pytest.raises(TypeError):
        task.hidden["answer"] = "0"  # type: ignore[index]
    with pytest.raises(TypeError):
        task.metadata["seed"] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        task.hidden = {}  # type: ignore[misc]
    # The Task copies the dict it was given: later edits to the caller's dict do not leak in.
    hidden = {"answer": "1"}
    t = Task("x", "d", ({"role": "user", "content": "q"},), VerifierSpec("exact"), hidden=hidden)
    hidden["answer"] = "2"
    assert t.hidden["answer"] == "1"


def test_prompt_template_and_system_prompt() -> None:
    src = make_source("gym:basic_arithmetic", PARAMS, prompt_template="Q: {question}\nA:", system_prompt="Be brief.")
    t = _take(src, "train", 0, 1)[0]
    q = t.hidden["entry"]["question"]
    assert [dict(m) for m in t.prompt] == [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": f"Q: {q}\nA:"}]
    assert t.question == f"Q: {q}\nA:"


def test_train_and_heldout_seeds_are_disjoint(source: TaskSource) -> None:
    train = _take(source, "train", 0, 200)
    held = _take(source, "heldout", 1_000_003, 200)
    train_seeds = {t.metadata["seed"] for t in train}
    held_seeds = {t.metadata["seed"] for t in held}
    assert train_seeds == set(range(200)) and held_seeds == set(range(1_000_003, 1_000_203))
    assert not train_seeds & held_seeds
    assert not {t.id for t in train} & {t.id for t in held}
    # Deterministic: the same split and seed give the same tasks.
    assert [t.question for t in _take(source, "train", 0, 20)] == [t.question for t in train[:20]]


def test_gym_domain_typo_names_closest() -> None:
    with pytest.raises(TaskError) as info:
        make_source("gym:basic_arithmetc", PARAMS)
    msg = str(info.value)
    assert "gym:basic_arithmetc" in msg and "basic_arithmetic" in msg.split("gym:basic_arithmetc", 1)[1]


def test_gym_bad_param_name_did_you_mean() -> None:
    with pytest.raises(TaskError) as info:
        make_source("gym:basic_arithmetic", {"min_digit": 1})
    msg = str(info.value)
    assert "'min_digit'" in msg and "did you mean 'min_digits'" in msg


def test_gym_bad_param_value_is_task_error() -> None:
    with pytest.raises(TaskError, match="gym:basic_arithmetic"):
        make_source("gym:basic_arithmetic", {"min_digits": 3, "max_digits": 1})


def test_gym_nested_list_params_are_accepted() -> None:
    # reasoning_gym.create_dataset('rearc', rng_difficulty_ranges=[[0.0, 0.025]], ...) itself works.
    src = make_source("gym:rearc", {"rng_difficulty_ranges": [[0.0, 0.025]], "rng_difficulty_weights": [1.0]})
    assert src.domain == "gym:rearc"


def test_unknown_source_kind() -> None:
    with pytest.raises(TaskError, match="unknown task source 'huggingface:foo'.*gym:<dataset>.*not found"):
        make_source("huggingface:foo")
    with pytest.raises(TaskError, match="no params"):
        make_source("jsonl:whatever.jsonl", {"a": 1})


# --- JSONL source --------------------------------------------------------------------------------


def _jsonl(tmp_path: Path, rows: list, name: str = "tasks.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_source_streams_splits(tmp_path: Path) -> None:
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1), "split": "train" if i % 3 else "heldout"}
            for i in range(9)]
    rows.insert(4, "")  # blank lines are skipped
    rows.append({"prompt": [{"role": "user", "content": "hi"}], "answer": 7, "id": "custom", "split": "train",
                 "verifier": "numeric"})
    src = make_source(f"jsonl:{_jsonl(tmp_path, rows)}", system_prompt="sys")
    assert isinstance(src, JsonlSource) and src.domain == "jsonl:tasks"
    train = list(src.tasks("train", 0))
    held = list(src.tasks("heldout", 123))
    assert [t.hidden["answer"] for t in held] == ["1", "4", "7"]
    assert [t.hidden["answer"] for t in train] == ["2", "3", "5", "6", "8", "9", "7"]
    first = train[0]
    assert [dict(m) for m in first.prompt] == [{"role": "system", "content": "sys"},
                                               {"role": "user", "content": "What is 1+1?"}]
    assert first.verifier.name == "exact" and first.id == "jsonl:tasks/2"
    last = train[-1]
    assert last.id == "custom" and last.verifier.name == "numeric" and last.hidden["answer"] == "7"
    assert [dict(m) for m in last.prompt] == [{"role": "user", "content": "hi"}]


def test_jsonl_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "a", "answer": "1", "split": "train"}, "{not json", {"prompt": "b", "answer": "2"}])
    it = make_source(f"jsonl:{path}").tasks("train", 0)
    assert next(it).hidden["answer"] == "1"  # streamed: lines before the bad one are served
    with pytest.raises(TaskError) as info:
        next(it)
    assert f"{path}:2" in str(info.value) and "JSON" in str(info.value)


def test_jsonl_missing_answer_names_key(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "a", "answer": "1"}, {"prompt": "b", "split": "train"}])
    with pytest.raises(TaskError) as info:
        list(make_source(f"jsonl:{path}").tasks("train", 0))
    assert f"{path}:2" in str(info.value) and "'answer'" in str(info.value)
    path2 = _jsonl(tmp_path, ["[1, 2]"], "list.jsonl")
    with pytest.raises(TaskError, match="expected an object"):
        list(make_source(f"jsonl:{path2}").tasks("train", 0))


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not found") as info:
        make_source(f"jsonl:{tmp_path / 'none.jsonl'}")
    assert str(tmp_path / "none.jsonl") in str(info.value)


# --- sampler -------------------------------------------------------------------------------------


def test_check_seed_ranges() -> None:
    check_seed_ranges(0, 1_000_003)
    check_seed_ranges(0, TRAIN_SEED_SPAN)
    check_seed_ranges(5_000_000, 0)
    for train_seed, held_seed in [(0, 0), (0, 999_999), (10, 5), (500_000, 1_200_000)]:
        with pytest.raises(ConfigError, match="overlaps") as info:
            check_seed_ranges(train_seed, held_seed)
        assert f"heldout_seed={held_seed}" in str(info.value)


def test_task_sampler_skips_excluded_questions(source: TaskSource) -> None:
    stream = _take(source, "train", 3, 60)
    exclude = {stream[0].question, stream[2].question, stream[5].question}
    expected = [t for t in stream if t.question not in exclude][:10]
    n_skipped = sum(t.question in exclude for t in stream[:stream.index(expected[-1])])
    sampler = TaskSampler([source], [1.0], seed=3, exclude_questions=exclude)
    got = sampler.next(4) + sampler.next(6)
    assert [t.id for t in got] == [t.id for t in expected]
    assert not any(t.question in exclude for t in got)
    assert sampler.skipped == n_skipped >= 3


def test_task_sampler_mixes_by_weight(tmp_path: Path) -> None:
    a = _jsonl(tmp_path, [{"prompt": f"a{i}", "answer": "1", "split": "train"} for i in range(200)], "a.jsonl")
    b = _jsonl(tmp_path, [{"prompt": f"b{i}", "answer": "1", "split": "train"} for i in range(200)], "b.jsonl")
    sampler = TaskSampler([make_source(f"jsonl:{a}"), make_source(f"jsonl:{b}")], [3.0, 1.0], seed=0)
    got = sampler.next(200)
    n_a = sum(t.domain == "jsonl:a" for t in got)
    assert 120 < n_a < 180  # ~150 expected
    with pytest.raises(ConfigError, match="ran out"):
        TaskSampler([make_source(f"jsonl:{a}")], [1.0], seed=0).next(201)


def test_heldout_tasks_round_robin(tmp_path: Path, source: TaskSource) -> None:
    a = _jsonl(tmp_path, [{"prompt": f"a{i}", "answer": "1", "split": "heldout"} for i in range(2)], "a.jsonl")
    held = heldout_tasks([make_source(f"jsonl:{a}"), source], 6, 1_000_003)
    assert [t.domain for t in held] == ["jsonl:a", "gym:basic_arithmetic"] * 2 + ["gym:basic_arithmetic"] * 2


# --- extractors ----------------------------------------------------------------------------------


def test_answer_tag() -> None:
    assert answer_tag("think... <answer> 42 </answer>") == ("42", True)
    assert answer_tag("<answer>\nmulti\nline\n</answer>") == ("multi\nline", True)
    assert answer_tag("<answer>5</answer> again <answer> 5</answer>") == ("5", False)  # same answer twice
    assert answer_tag("<answer>5</answer><answer>6</answer>") == (None, False)
    assert answer_tag("no tag 5") == (None, False)


def test_boxed() -> None:
    assert boxed(r"so \boxed{\frac{1}{2}} done") == (r"\frac{1}{2}", True)
    assert boxed(r"\boxed{{a}{b{c}}}") == ("{a}{b{c}}", True)
    assert boxed(r"\boxed{3} and \boxed{4}") == (None, False)
    assert boxed(r"\boxed{3} and \boxed{ 3 }") == ("3", False)
    assert boxed(r"\boxed{unclosed") == (None, False)
    assert boxed("nothing") == (None, False)


def test_last_number() -> None:
    assert last_number("The total is 1,234,567.") == ("1234567", False)
    assert last_number("1,234") == ("1234", True)
    assert last_number("x = -17") == ("-17", False)
    assert last_number(" -17 ") == ("-17", True)
    assert last_number("3.25.") == ("3.25", True)
    assert last_number("2 then 3 then 10") == ("10", False)
    assert last_number("no digits") == (None, False)


def test_full_and_registry() -> None:
    assert full("  hi there \n") == ("hi there", True)
    assert full("   ") == (None, False)
    assert set(EXTRACTORS) == {"auto", "answer_tag", "boxed", "last_number", "full"}


# --- verifiers -----------------------------------------------------------------------------------


def test_reasoning_gym_grade_correct_and_wrong(source: TaskSource) -> None:
    task = _take(source, "train", 0, 1)[0]
    ctx = VerifyContext("last_number", 0.0)
    answer = task.hidden["answer"]
    good = grade(task, answer, ctx)
    assert good.score == 1.0 and good.passed and not good.infra_error
    assert grade(task, f"The sum is {answer}.", ctx).passed
    bad = grade(task, str(int(answer) + 1), ctx)
    assert bad.score == 0.0 and not bad.passed and not bad.infra_error
    none = grade(task, "I don't know", ctx)
    assert none.score == 0.0 and not none.passed
    tag = grade(task, f"<answer>{answer}</answer>", VerifyContext("answer_tag"))
    assert tag.passed


def test_format_weight_layering(source: TaskSource) -> None:
    task = _take(source, "train", 0, 1)[0]
    ans = task.hidden["answer"]
    w = 0.3
    ctx = VerifyContext("last_number", w)
    cases = {ans: (1.0, 1.0), f"It is {ans}": (1.0, 0.0), str(int(ans) + 1): (0.0, 1.0),
             f"It is {int(ans) + 1}": (0.0, 0.0)}
    for completion, (correct, fmt) in cases.items():
        v = grade(task, completion, ctx)
        assert v.score == pytest.approx((1 - w) * correct + w * fmt), completion
        assert v.passed == (correct == 1.0)
        assert v.components == {"correct": correct, "format": fmt}


def test_exact_and_numeric_verifiers() -> None:
    t = Task("t", "d", ({"role": "user", "content": "q"},), VerifierSpec("exact"), hidden={"answer": "Paris  France"})
    assert grade(t, " paris france ", VerifyContext("full")).passed
    assert not grade(t, "Lyon", VerifyContext("full")).passed
    n = Task("n", "d", ({"role": "user", "content": "q"},), VerifierSpec("numeric", {"rel_tol": 1e-3}),
             hidden={"answer": "1,000"})
    assert grade(n, "about 1000.5", VerifyContext("last_number")).passed
    assert not grade(n, "1002", VerifyContext("last_number")).passed
    assert not grade(n, "none", VerifyContext("last_number")).passed


class _Crashes:
    def verify(self, task, completion, ctx):  # noqa: ANN001
        raise RuntimeError("sandbox down")


def test_crashing_verifier_is_infra_error_not_zero() -> None:
    register_verifier("test_crashes", _Crashes())
    task = Task("c", "d", ({"role": "user", "content": "q"},), VerifierSpec("test_crashes"), hidden={"answer": "1"})
    v = grade(task, "1", VerifyContext())
    assert v.infra_error and not v.passed
    assert "test_crashes" in v.details and "sandbox down" in v.details
    traj = Trajectory("c", "d", (1,), (2,), (-0.1,), "1", "stop", 0, verdict=v)
    assert traj.status == "infra_error"
    ok = Trajectory("c", "d", (1,), (2,), (-0.1,), "1", "stop", 0, verdict=Verdict(0.0, False))
    assert ok.status == "ok"  # a genuine 0 is a graded failure, not an infra error


def test_register_plain_function_verifier() -> None:
    seen = {}

    def reward(prompt, completion, **kw):  # noqa: ANN001, ANN003
        seen.update(kw, prompt=prompt)
        return 1.0 if completion.strip() == kw["answer"] else 0.25

    register_verifier("test_fn", reward)
    assert "test_fn" in verifier_names()
    task = Task("f1", "dom", ({"role": "user", "content": "2+2?"},), VerifierSpec("test_fn"), hidden={"answer": "4"})
    v = grade(task, " 4 ", VerifyContext())
    assert v.score == 1.0 and v.passed and not v.infra_error
    assert {k: seen[k] for k in ("prompt", "answer", "task_id", "domain")} == \
        {"prompt": "2+2?", "answer": "4", "task_id": "f1", "domain": "dom"}
    assert seen["task"] is task and seen["trajectory"].completion_text == " 4 "  # trusted grader code sees the task
    w = grade(task, "5", VerifyContext())
    assert w.score == 0.25 and not w.passed

    @register_verifier("test_fn_noargs")
    def plain(prompt, completion):  # noqa: ANN001
        return 3.0  # out of [0, 1]: an infrastructure error naming the verifier, never a clipped 1.0

    assert plain("a", "b") == 3.0  # the decorator returns the function unchanged
    v2 = grade(Task("f2", "d", ({"role": "user", "content": "q"},), VerifierSpec("test_fn_noargs")), "x",
               VerifyContext())
    assert v2.infra_error and not v2.passed and "test_fn_noargs" in v2.details and "3.0" in v2.details


def test_unknown_verifier_names_closest() -> None:
    with pytest.raises(TaskError) as info:
        get_verifier("reasoning_gm")
    assert "'reasoning_gm'" in str(info.value) and "reasoning_gym" in str(info.value)
    task = Task("u", "d", ({"role": "user", "content": "q"},), VerifierSpec("exactt"))
    with pytest.raises(TaskError, match="exact"):  # grade does not swallow it as an infra error
        grade(task, "x", VerifyContext())
    with pytest.raises(TaskError, match="known: "):
        get_verifier("zzzzzzzzzz")


def test_verdict_rejects_out_of_range_score() -> None:
    with pytest.raises(ValueError):
        Verdict(1.5, True)
    assert Verdict.infra("x").infra_error
