"""How the `math` verifier reads what models write (honing.verify.math_extract), and the traps
that used to score wrongly: each false positive must score 0 and each false negative 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from honing.tasks import Task, VerifierSpec
from honing.verify import Verdict, VerifyContext, grade
from honing.verify.math_extract import extract_math, reference_answer

HONING = str(Path(sys.executable).parent / "honing")


def _grade(gold: str, completion: str, ctx: VerifyContext = VerifyContext()) -> Verdict:
    task = Task(id="t", domain="d", prompt=({"role": "user", "content": "q"},), verifier=VerifierSpec("math"),
                hidden={"answer": gold})
    v = grade(task, completion, ctx)
    assert not v.infra_error, v.details
    return v


# (reference, completion): a correct answer as models write it, without \boxed{}
FALSE_NEGATIVES = [
    ("1/3", "The answer is $\\frac{1}{3}$."),
    ("1/3", "$\\frac13 $"),
    ("\\sqrt{3}", "$\\sqrt3 $"),
    ("1/3", "$\\dfrac{1}{3} $"),
    ("1/3", "$\\cfrac{1}{3} $"),
    ("1/3", "$\\left( \\frac{1}{3} \\right)$"),
    ("1/3", "$k = \\frac{1}{3}$"),
    ("1/3", "$\\frac{1}{3} \\text{meters}$"),
    ("$[0,1)$", "$[0,1)$"),
    ("1000", "1 000"),
    ("1000.99", "1000,99"),
    ("0.4", ".4"),
    ("10/9", "\\frac{10}{9}"),
    ("$x >= 5$", "Therefore $x \\geq 5$ is the solution."),
    ("1000.99", "the number is not 10 which is 1,000.99€"),
    ("$28\\%$", "28 percent"),
    ("$9$", "Answer \\[ 9 \\]"),
    ("$10$", "Answer \\( (9+1) \\)"),
    ("$34$", "Final Answer: The largest $n$ is 34."),
    ("$10455$", "it earns 200 dollars and then \\boxed{255} more. Final Answer: The final answer is $10,455$. "
                "I hope it is correct."),
    ("$-2,1$", "Checking, the only integer roots are \\boxed{-2} and \\boxed{1}."),
    ("$(2,1),(1,2)$", "solutions are: \\[ \\boxed{(1, 2)}, \\boxed{(2, 1)} \\]"),
    ("12", "<think>maybe 11, or \\boxed{13}?</think> The answer is \\boxed{12}."),
]

# (reference, completion): wrong answers that used to score 1
FALSE_POSITIVES = [
    ("2", "AZYUK2A"),
    ("$1$", "$-[0,1)$"),
    ("12", "We first get 12 apples, but two are eaten, so the answer is $13$."),
    ("12", "Counting again: 12 was wrong. Final Answer: The final answer is $13$. I hope it is correct."),
    ("So the answer is: \\[ \\boxed{32349} \\]", "is $\\boxed{32, 349}$"),
    ("3", "\\boxed{3} and \\boxed{4}"),
    ("\\boxed{1} no no no no no \\boxed{2}", "$\\boxed{1,2}$"),
]

# (reference, hedge, the same reply committing to the right answer)
HEDGES = [
    ("1/3", "$\\frac{1}{4}$ or $\\frac{1}{3}$", "$\\frac{1}{3}$"),
    ("1/3", "The answer is $\\frac{1}{4}$ or $\\frac{1}{3}$.", "The answer is $\\frac{1}{3}$."),
    ("1/3", "\\boxed{\\frac{1}{4}} or \\boxed{\\frac{1}{3}}", "\\boxed{\\frac{1}{3}}"),
    ("1/3", "\\boxed{\\frac{1}{4} \\text{ or } \\frac{1}{3}}", "\\boxed{\\frac{1}{3}}"),
    ("3", "\\boxed{3} first. Then after more thought the result is \\boxed{4}.",
     "\\boxed{3} first. Then after more thought the result is \\boxed{3}."),
    ("3", "<answer>3</answer> <answer>4</answer>", "<answer>3</answer>"),
]


@pytest.mark.parametrize(("gold", "completion"), FALSE_NEGATIVES)
def test_correct_answers_score_1(gold: str, completion: str) -> None:
    v = _grade(gold, completion)
    assert v.passed and v.score == 1.0, v.details


@pytest.mark.parametrize(("gold", "completion"), FALSE_POSITIVES)
def test_wrong_answers_score_0(gold: str, completion: str) -> None:
    v = _grade(gold, completion)
    assert not v.passed and v.score == 0.0, v.details


@pytest.mark.parametrize(("gold", "hedge", "committed"), HEDGES)
def test_hedges_get_no_credit(gold: str, hedge: str, committed: str) -> None:
    v = _grade(gold, hedge)
    assert not v.passed and v.score == 0.0, v.details
    assert _grade(gold, committed).passed


def test_priority_order() -> None:
    text = "Let $x$ be it. So x = 5. The answer is $6$. \\boxed{7}"
    assert extract_math(text).answer == "7" and extract_math(text).tier == "boxed"
    assert extract_math("<answer>9</answer> so $8$").answer == "9"
    assert extract_math("Let $x$ be it. The answer is $6$. Then 8 more.").answer == "6"
    assert extract_math("Let $x$ be it. So x = 12.").answer == "12"  # a plain number after the last span
    assert extract_math("So $x = 12$.").answer == "x = 12"
    assert extract_math("first $a$ then 5 then $b$").answer == "b"
    assert extract_math("nothing here").answer is None
    assert extract_math("The answer is 1,234 and 5").answer == "1234"


def test_reference_forms() -> None:
    assert reference_answer("$\\frac{1}{2}$").answer == "\\frac{1}{2}"
    assert reference_answer("x^2+1").answer == "x^2+1"  # a bare reference is the answer as written
    assert reference_answer("1,22").answer == "1.22" and reference_answer("1,000").answer == "1000"
    assert reference_answer("Thus \\boxed{1} papers and \\boxed{2} bins").answer == "1, 2"


def test_explicit_extractor_is_used_alone() -> None:
    """A recipe that names an extractor gets exactly that one, not the maths reading."""
    assert _grade("7", "I think 3, then \\boxed{7} and 9", VerifyContext()).passed
    assert not _grade("7", "I think 3, then \\boxed{7} and 9", VerifyContext(extractor="last_number")).passed
    task = Task(id="t", domain="d", prompt=(), verifier=VerifierSpec("math", {"extractor": "last_number"}),
                hidden={"answer": "9"})
    assert grade(task, "I think 3, then \\boxed{7} and 9", VerifyContext()).passed


def test_cli_reads_latex_prose_and_batches(tmp_path: Path) -> None:
    """The issue's report, through the real command: a correct $\\frac{1}{3}$ in prose scores 1."""
    p = subprocess.run([HONING, "verify", "--verifier", "math", "--reference", "1/3", "--completion", "-"],
                       input=b"The answer is $\\frac{1}{3}$.", capture_output=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["passed"] is True, p.stdout
    batch = tmp_path / "b.jsonl"
    batch.write_text("".join(json.dumps({"reference": g, "completion": c}) + "\n"
                             for g, c in FALSE_NEGATIVES[:3] + FALSE_POSITIVES[:2]))
    p = subprocess.run([HONING, "verify", "--verifier", "math", "--batch", str(batch)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [json.loads(x)["passed"] for x in p.stdout.decode().splitlines()] == [True] * 3 + [False] * 2
    batch.write_text('{"reference": "1", "completion": "1"}\n{"completion": "2"}\n')
    p = subprocess.run([HONING, "verify", "--verifier", "math", "--batch", str(batch)], capture_output=True, timeout=120)
    assert p.returncode == 2 and f"{batch}:2: missing key 'reference'" in p.stderr.decode() and not p.stdout
