"""SFT demonstrations: every source goes through the verifier and the rollout token path; the loss
is on the trajectory's own mask; contaminated demonstrations are refused; bad input is one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from honing.config import RunConfig
from honing.engine.types import Sample
from honing.models import load_tokenizer
from honing.schedule.setup import build_tasks
from honing.tasks.types import Task, VerifierSpec, task_to_json
from honing.train.demos import (
    Demonstration,
    from_file,
    from_policy,
    from_reference,
    refuse_contaminated,
    transcript_layout,
)
from honing.train.sft import packed_layout


HONING = str(Path(sys.executable).with_name("honing"))
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
ARITH = {"name": "gym:basic_arithmetic", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                                    "operators": ["+"], "allow_negation": False,
                                                    "allow_parentheses": False}}


def _setup(source: dict, heldout: int = 8):
    cfg = RunConfig.model_validate({"model": {"name": "tiny-random"}, "tasks": {"sources": [source]},
                                    "verify": {"extractor": "last_number"}, "eval": {"heldout_tasks": heldout}})
    return cfg, build_tasks(cfg)


@pytest.fixture(scope="module")
def smol_tok():
    return load_tokenizer("smollm2-135m-instruct")


@needs_bwrap
def test_multiturn_reference_demo_is_the_rl_trajectory_and_sft_trains_on_its_mask(smol_tok) -> None:
    """A repair task's reference episode, replayed through the sandbox as a demonstration, has exactly
    the ids and loss mask of the RL trajectory the same replies produce; SFT's targets are the
    assistant tokens of every turn and nothing the environment wrote; and a transcript of that
    episode read from a file lays out to the same ids and mask."""
    from honing.engine import SamplingParams
    from honing.rollout.multiturn import ScriptedEngine
    from honing.tasks.reference import reference_replies

    cfg, setup = _setup({"name": "repair", "params": {"levels": [1]}}, heldout=2)
    try:
        task = next(setup.sources[0].tasks("train", 0))
        demo = from_reference(setup, smol_tok, [task], "{answer}", 1 << 14, 0)[0]
        assert demo.status == "kept" and demo.passed and demo.turns == 5, demo.reason  # run_tests, read_file, patch, run, submit
        rl = setup.roll_out(ScriptedEngine(smol_tok, reference_replies(task)), smol_tok, [task],
                            SamplingParams(max_new_tokens=4096, temperature=0.0, n=1), 0)[0]
        def trained(d) -> list[int]:  # noqa: ANN001 - the tokens a loss is taken on
            return [c for c, m in zip(d.completion_ids, d.loss_mask) if m]

        # same prompt, same assistant tokens under the mask (observations hold test timings: not compared)
        assert demo.prompt_ids == rl.prompt_ids and trained(demo) == trained(rl)
        assert trained(rl) == [i for t in rl.turns for i in t.action_ids]  # every assistant turn, nothing else
        assert 0 < sum(demo.loss_mask) < len(demo.loss_mask)  # observations are in the sequence, masked out
        same = Demonstration.from_trajectory(rl, "reference")  # what from_reference makes of a trajectory
        assert (same.completion_ids, same.loss_mask) == (rl.completion_ids, rl.loss_mask)
        _, _, _, _, targets = packed_layout([same], [[0]], pad_id=0)
        assert targets.tolist() == trained(rl)  # SFT's targets are exactly RL's loss tokens
        p, c, m = transcript_layout(smol_tok, rl.messages)
        assert (tuple(p), tuple(c), tuple(m)) == (rl.prompt_ids, rl.completion_ids, rl.loss_mask)
    finally:
        setup.sandbox.close()


def test_masked_tokens_carry_no_loss(tiny) -> None:  # noqa: ANN001
    """The loss of a masked demonstration is the mean NLL of exactly its mask-1 tokens, on the padded
    and on the packed path alike."""
    from honing.train.sft import _batch_losses

    model, tok = tiny
    p = tok.encode("What is 2+2?", add_special_tokens=False)
    c = tok.encode("4 ok then 4", add_special_tokens=False) + [tok.eos_token_id]
    mask = [1 if i % 2 == 0 else 0 for i in range(len(c))]

    def loss(demos, pack):
        with torch.no_grad():
            return sum(float(x) for x in _batch_losses(model, demos, tok.pad_token_id, False, 0, 0, pack))

    a = loss([(p, c, mask)], 0)
    b = loss([(p, c, mask)], 256)
    assert a == pytest.approx(b, rel=1e-5)
    full = loss([(p, c)], 0)
    assert a != pytest.approx(full, rel=1e-3)
    # the masked loss is the mean NLL of exactly the kept tokens
    with torch.no_grad():
        logits = model(torch.tensor([p + c])).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    kept = [len(p) + j for j in range(len(c)) if mask[j]]
    ref = -sum(float(lp[k - 1, (p + c)[k]]) for k in kept) / len(kept)
    assert a == pytest.approx(ref, rel=1e-4)


class _AltEngine:
    """Samples alternate wrong, right, wrong, right... per prompt (a scripted policy for best-of-n)."""

    version = 0

    def __init__(self, tok) -> None:  # noqa: ANN001
        self.tok = tok

    def generate(self, prompts, params, seed=None):  # noqa: ANN001
        out = []
        for p in prompts:
            text = self.tok.decode(list(p))
            a, b = map(int, re.findall(r"(\d+) \+ (\d+)", text)[-1])
            replies = [str(a + b + 1) if k % 2 == 0 else f"{a + b}" for k in range(params.n)]
            ids = [tuple(self.tok.encode(r, add_special_tokens=False)) + (self.tok.eos_token_id,) for r in replies]
            out.append([Sample(i, (-0.1,) * len(i), "stop") for i in ids])
        return out


@pytest.mark.parametrize("keep", ["best", "all"])
def test_rejection_round_keeps_only_verified_samples(keep: str) -> None:
    cfg, setup = _setup(ARITH)
    tok = load_tokenizer("tiny-random")
    tasks = [t for _, t in zip(range(6), setup.sources[0].tasks("train", 0))]
    demos = from_policy(setup, tok, _AltEngine(tok), tasks, "rejection", 4, 1.0, 8, 0, keep)
    assert len(demos) == 24
    kept = [d for d in demos if d.kept]
    assert len(kept) == (6 if keep == "best" else 12)
    assert all(d.passed and d.score == 1.0 and d.source == "rejection" for d in kept)
    assert all(not d.passed for d in demos if d.status == "failed") and sum(d.status == "failed" for d in demos) == 12
    for d in kept:  # the kept text is the right sum of its own task
        task = next(t for t in tasks if t.id == d.task_id)
        assert d.text.strip() == str(task.hidden["answer"])


def test_contaminated_demonstration_is_refused() -> None:
    held = [Task(f"h{i}", "x", ({"role": "user", "content": q},), VerifierSpec("exact"), {"answer": "1"})
            for i, q in enumerate([
                "Compute the quarterly revenue growth of the northern retail segment from the attached table "
                "and state it as a percentage rounded to one decimal place please",
                "What is the capital of France?"])]
    same = "What is the capital of France?"
    near = held[0].question.replace("please", "thanks")
    fresh = "Write a haiku about the ocean at night under a full moon while the tide slowly comes in"
    demos = [Demonstration(f"d{i}", "x", "reference", (1,), (2,), (1,), question=q) for i, q in
             enumerate([same, near, fresh])]
    assert refuse_contaminated(demos, held, {}, 0.8) == 2
    assert [d.status for d in demos] == ["refused", "refused", "kept"]
    assert demos[0].match == "h1" and demos[1].match == "h0" and "overlaps held-out task" in demos[1].reason


def test_file_transcripts_are_graded_against_their_tasks(tmp_path: Path) -> None:
    """A file line that carries its task is replayed and graded (a wrong answer is not trained on);
    the guard refuses a line whose task is a held-out question."""
    cfg, setup = _setup(ARITH)
    tok = load_tokenizer("tiny-random")
    t_ok, t_bad = [t for _, t in zip(range(2), setup.sources[0].tasks("train", 0))]
    held = setup.heldout[0]
    lines = [{"messages": [*t_ok.prompt, {"role": "assistant", "content": str(t_ok.hidden["answer"])}],
              "task": task_to_json(t_ok)},
             {"messages": [*t_bad.prompt, {"role": "assistant", "content": "12345"}], "task": task_to_json(t_bad)},
             {"messages": [*held.prompt, {"role": "assistant", "content": str(held.hidden["answer"])}],
              "task": {**task_to_json(held), "id": "copied"}}]
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    demos = from_file(setup, tok, path, False, 64, 0)
    refuse_contaminated(demos, setup.heldout, {}, 0.8)
    assert [d.status for d in demos] == ["kept", "failed", "refused"]
    assert demos[0].where == f"{path}:1" and demos[2].match == held.id


@pytest.mark.parametrize("data, needle", [
    ("file:{tmp}/missing.jsonl", "missing.jsonl: no such file"),
    ("file:{tmp}/bad.jsonl", "bad.jsonl:2: not valid JSON"),
    ("file:{tmp}/norole.jsonl", "norole.jsonl:1: 'messages' must be a list"),
    ("bogus", "unknown demonstration source"),
])
def test_honing_sft_bad_input_is_one_line_exit_2(tmp_path: Path, data: str, needle: str) -> None:
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "bad.jsonl").write_text(json.dumps(ok) + "\n{not json\n")
    (tmp_path / "norole.jsonl").write_text(json.dumps({"messages": [{"content": "x"}]}) + "\n")
    p = subprocess.run([HONING, "sft", "-c", "smoke", "--data", data.format(tmp=tmp_path), "sft.allow_ungraded=true",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("honing: error:") and needle in err[0], p.stderr
    assert not (tmp_path / "run").exists()  # nothing written


@needs_bwrap
@pytest.mark.parametrize("source", [{"name": "finance", "params": {"level": [1, 2]}}, {"name": "code:functions"},
                                    {"name": "humaneval"}])
def test_reference_demonstrations_pass_their_own_verifiers(source: dict, smol_tok) -> None:  # noqa: ANN001
    """Each single-turn domain's reference solver writes replies its verifier passes (finance's table
    look-up, code's reference implementations run against the hidden tests in the sandbox, HumanEval's
    canonical solutions of the training split), and none is a held-out task."""
    cfg, setup = _setup(source, heldout=16)
    try:
        tasks = [t for _, t in zip(range(4), setup.sources[0].tasks("train", 0))]
        demos = from_reference(setup, smol_tok, tasks, "{answer}", 1 << 14, 0)
        assert refuse_contaminated(demos, setup.heldout, {t.id: t for t in tasks}, 0.8) == 0
        assert [d.status for d in demos] == ["kept"] * 4, [d.reason for d in demos]
        assert all(d.score == 1.0 and sum(d.loss_mask) == len(d.completion_ids) for d in demos)
    finally:
        if setup.sandbox is not None:
            setup.sandbox.close()


def test_heldout_code_structures_have_no_reference() -> None:
    from honing.tasks.reference import reference_replies
    from honing.errors import HoningError
    from honing.tasks import make_source

    held = next(make_source("code:functions").tasks("heldout", 0))
    with pytest.raises(HoningError):
        reference_replies(held)


@pytest.mark.parametrize("source,n_rl", [({"name": "finance", "params": {"level": [1, 2]}}, 600),
                                         ({"name": "code:functions"}, 600),
                                         ({"name": "repair", "params": {"levels": [1]}}, 200)])
def test_demonstration_tasks_are_not_the_rl_stream(source: dict, n_rl: int) -> None:  # noqa: ANN001
    """SFT's demonstrations come from tasks the RL stream does not serve: a procedural source makes
    task n from seed n, so demonstrations drawn one seed over would hand RL the very tasks SFT showed
    the answers to (the RL steps spent on memorised, all-pass groups)."""
    from honing.train.demos import demo_tasks

    cfg, setup = _setup(source, heldout=8)
    try:
        demos = demo_tasks(cfg, setup, 64)
        rl = setup.sampler.next(n_rl)
        assert len(demos) == 64 and len(rl) == n_rl
        assert not {t.id for t in demos} & {t.id for t in rl}
        if source["name"] != "repair":  # a repair task's question is its bug report, shared by many workspaces
            assert not {t.question for t in demos} & {t.question for t in rl}
            assert not {t.question for t in demos} & {t.question for t in setup.heldout}
    finally:
        if setup.sandbox is not None:
            setup.sandbox.close()


def test_shown_only_turns_carry_no_loss_and_bad_flags_are_named() -> None:
    """envcheck.script_of reads "train": false on a reference turn; demos.mask_turns zeroes exactly that
    turn's action tokens (observations are 0 already) and refuses a layout it cannot line up."""
    from honing.envcheck import script_of
    from honing.errors import HoningError
    from honing.rollout.types import Trajectory, Turn
    from honing.train.demos import mask_turns

    r = script_of([{"name": "build", "arguments": {"code": "x"}, "train": False}, {"name": "submit", "arguments": {}}],
                  "task t")
    assert len(r) == 2 and r.shown_only == {0} and script_of(["a", "b"], "t").shown_only == frozenset()
    with pytest.raises(HoningError, match="'train' must be true or false"):
        script_of([{"name": "submit", "train": "no"}], "task t")
    with pytest.raises(HoningError, match="every turn"):
        script_of([{"name": "submit", "train": False}], "task t")

    turns = (Turn(0, (1, 2, 3), (0.0,) * 3, "a", (9, 9), "obs"), Turn(1, (4, 5), (0.0,) * 2, "b", (9,), "obs"),
             Turn(2, (6,), (0.0,), "c", (), ""))
    comp = (1, 2, 3, 9, 9, 4, 5, 9, 6)
    mask = (1, 1, 1, 0, 0, 1, 1, 0, 1)
    t = Trajectory("t", "d", (7,), comp, (0.0,) * 9, "", "stop", 0, loss_mask=mask, turns=turns)
    assert mask_turns(t, set()).loss_mask == mask
    assert mask_turns(t, {0}).loss_mask == (0, 0, 0, 0, 0, 1, 1, 0, 1)
    assert mask_turns(t, {1, 2}).loss_mask == (0,) * 9
    bad = Trajectory("t", "d", (7,), comp + (1,), (0.0,) * 10, "", "stop", 0, turns=turns)
    with pytest.raises(HoningError, match="cover 9 of 10"):
        mask_turns(bad, {0})
