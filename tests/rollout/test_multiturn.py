"""The multi-turn loop with scripted policies in a real bwrap sandbox: repairs over several
turns, error feedback, stop conditions, context truncation, snapshots and branching, batching,
and token-in/token-out assembly (tokens == concat(turn tokens), masks, the end-of-turn token)."""

from __future__ import annotations

import pytest

from honing.engine.types import SamplingParams
from honing.rollout.env import ToolEnvironment
from honing.rollout.multiturn import ChatFormat, Episode, MultiTurnConfig, ScriptedEngine, multiturn_rollout, run_episodes
from honing.rollout.tools import get_tools
from honing.tasks.types import Task, VerifierSpec
from honing.verify import VerifyContext, get_verifier

from .conftest import call, needs_bwrap

pytestmark = needs_bwrap

BIG = MultiTurnConfig(context_tokens=200_000, max_total_tokens=200_000, max_turns=12)
PARAMS = SamplingParams(max_new_tokens=6000)


def grade(task, traj, sandbox):
    return get_verifier("repair").verify(task, traj, VerifyContext(extra={"sandbox": sandbox}))


def play(tok, sandbox, task, script, cfg=BIG, n=1, max_new_tokens=6000):
    engine = ScriptedEngine(tok, script)
    params = SamplingParams(max_new_tokens=max_new_tokens, n=n)
    return multiturn_rollout(engine, tok, [task], params, sandbox, cfg, seed=0), engine


def check_tokens(tok, traj):
    """tokens == concat(turn tokens); mask 1 exactly on (non-stale) generated tokens; log-probs aligned;
    each generated turn ends with the end-of-turn token (mask 1) and the template's rest (mask 0) follows."""
    flat = [i for t in traj.turns for i in (*t.action_ids, *t.observation_ids)]
    assert list(traj.completion_ids) == flat
    assert len(traj.loss_mask) == len(traj.completion_ids) == len(traj.logprobs)
    pos = 0
    for t in traj.turns:
        n_a, n_o = len(t.action_ids), len(t.observation_ids)
        assert set(traj.loss_mask[pos:pos + n_a]) <= {1} or traj.truncated_context
        assert traj.loss_mask[pos + n_a:pos + n_a + n_o] == (0,) * n_o
        assert traj.logprobs[pos:pos + n_a] == t.action_logprobs
        assert traj.logprobs[pos + n_a:pos + n_a + n_o] == (0.0,) * n_o
        if t.finish_reason == "stop":
            assert t.action_ids[-1] == tok.eos_token_id and traj.loss_mask[pos + n_a - 1] in (0, 1)
        pos += n_a + n_o
    assert sum(traj.loss_mask) == sum(len(t.action_ids) for t in traj.turns) or traj.truncated_context


def test_successful_repair_in_several_turns(tok, sandbox, repair_tasks):
    task = repair_tasks[1]
    script = [call("list_files"), call("read_file", path="tests/test_visible.py", start_line=1, end_line=12),
              call("run_tests"), call("apply_patch", patch=task.hidden["reference_patch"]), call("run_tests"),
              call("submit")]
    [traj], engine = play(tok, sandbox, task, script)
    assert traj.stop_reason == "submit" and len(traj.turns) == 6 and engine.calls == 6
    assert [t.tool for t in traj.turns] == ["list_files", "read_file", "run_tests", "apply_patch", "run_tests", "submit"]
    assert "tests/test_visible.py" in traj.turns[0].observation_text
    assert "   1| " in traj.turns[1].observation_text and "(lines 1-12 of" in traj.turns[1].observation_text
    assert traj.turns[2].observation_text.startswith("tests failed") and not traj.turns[2].ok
    assert traj.turns[4].observation_text.startswith("tests passed")
    assert traj.stats["test_runs"] == 2 and traj.stats["failed_test_runs"] == 1 and traj.stats["correction_rounds"] == 1
    assert traj.stats["failed_tool_calls"] == 0 and traj.stats["turns"] == 6
    assert all(t.snapshot_id for t in traj.turns) and len(set(traj.snapshot_ids)) == 6
    assert all(t.timings["env_s"] >= 0 and "gen_s" in t.timings for t in traj.turns)
    check_tokens(tok, traj)
    v = grade(task, traj, sandbox)
    assert v.score == 1.0 and v.passed and not v.infra_error, v.details


def test_fails_tests_reads_the_error_fixes_and_passes(tok, sandbox, repair_tasks):
    task = repair_tasks[3]
    [bug] = task.hidden["bugs"]
    wrong = f"<<<<<<< SEARCH\n{bug['new'] or 'def '}\n=======\n{bug['new'] or 'def '}\n>>>>>>> REPLACE"  # a no-op "fix"
    right = task.hidden["reference_patch"]
    script = [call("run_tests"), call("apply_patch", path=bug["file"], patch=wrong), call("run_tests"),
              call("read_file", path=bug["file"]), call("apply_patch", patch=right), call("run_tests"), call("submit")]
    [traj], _ = play(tok, sandbox, task, script)
    obs = [t.observation_text for t in traj.turns]
    assert obs[0].startswith("tests failed") and obs[2].startswith("tests failed") and obs[5].startswith("tests passed")
    assert "FAIL" in obs[2] or "Error" in obs[2]  # the failure output reaches the model
    assert traj.stats["correction_rounds"] == 2 and traj.stats["test_runs"] == 3
    assert grade(task, traj, sandbox).score == 1.0


def test_malformed_call_then_a_correct_one(tok, sandbox, repair_tasks):
    task = repair_tasks[1]
    script = ["The bug is probably in the pricing code.", '<tool_call>{"name": "run_tests", "arguments": </tool_call>',
              call("apply_patch", patch=task.hidden["reference_patch"]), call("submit")]
    [traj], _ = play(tok, sandbox, task, script)
    t0, t1 = traj.turns[0], traj.turns[1]
    assert t0.parse_error and "no tool call found" in t0.observation_text and "<tool_call>" in t0.observation_text
    assert t1.parse_error and "not valid JSON" in t1.observation_text
    assert traj.stop_reason == "submit" and traj.stats["parse_errors"] == 2 and traj.stats["failed_tool_calls"] == 2
    assert grade(task, traj, sandbox).score == 1.0
    check_tokens(tok, traj)


def test_stops_at_max_turns_and_at_the_parse_error_limit(tok, sandbox, repair_tasks):
    task = repair_tasks[1]
    [traj], _ = play(tok, sandbox, task, lambda _p, _i: call("list_files"), cfg=BIG.__class__(
        context_tokens=200_000, max_total_tokens=200_000, max_turns=3))
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 3 and traj.status == "truncated"
    # the last observation was never seen by the model: its text is kept, its tokens are not
    assert traj.turns[-1].observation_text and not traj.turns[-1].observation_ids
    [traj], _ = play(tok, sandbox, task, lambda _p, _i: "no idea", cfg=BIG)
    assert traj.stop_reason == "parse_errors" and len(traj.turns) == BIG.max_parse_errors
    [traj], _ = play(tok, sandbox, task, lambda _p, _i: call("list_files"), cfg=MultiTurnConfig(
        context_tokens=200_000, max_total_tokens=2500))
    assert traj.stop_reason == "max_tokens" and len(traj.turns) == 1  # prompt + turn 0 passed 2500 tokens
    assert len(traj.prompt_ids) + len(traj.turns[0].action_ids) < 2500


def test_context_truncation_drops_old_observations_deterministically(tok, sandbox, repair_tasks):
    task = repair_tasks[2]
    script = [call("read_file", path="tests/test_visible.py")] * 4 + [call("submit")]
    cfg = MultiTurnConfig(context_tokens=7000, max_total_tokens=100_000, max_turns=10, keep_last_observations=1)
    runs = [play(tok, sandbox, task, script, cfg=cfg, max_new_tokens=200)[0][0] for _ in range(2)]
    traj = runs[0]
    assert traj.truncated_context and traj.truncations and traj.stop_reason == "submit"
    assert runs[0].truncations == runs[1].truncations and runs[0].completion_ids == runs[1].completion_ids
    first = traj.truncations[0]
    assert first["observation_of_turn"] == 0 and first["tokens_removed"] > 0
    assert traj.turns[0].observation_truncated and "truncated" in traj.turns[0].observation_text
    assert not traj.turns[-2].observation_truncated  # the latest observation is kept
    # every prompt the engine saw fit the context (checked on the final sequence, prompt + reply)
    assert len(traj.prompt_ids) + len(traj.completion_ids) <= cfg.context_tokens + 200
    check_tokens(tok, traj)
    # replies sampled before the last truncation no longer match the stored context: masked out
    stale = max(x["at_turn"] for x in traj.truncations)
    pos = 0
    for t in traj.turns:
        want = 0 if t.index < stale else 1
        assert set(traj.loss_mask[pos:pos + len(t.action_ids)]) == {want}
        pos += len(t.action_ids) + len(t.observation_ids)
    # with truncation off, the episode stops instead
    [traj], _ = play(tok, sandbox, task, script, max_new_tokens=200, cfg=MultiTurnConfig(
        context_tokens=7000, max_total_tokens=100_000, truncation="none"))
    assert traj.stop_reason == "context" and not traj.truncated_context


def test_snapshot_per_turn_rollback_and_branches_do_not_see_each_other(tok, sandbox):
    task = Task(id="branch", domain="test", prompt=({"role": "user", "content": "write files"},),
                verifier=VerifierSpec("repair"), environment={"files": {"base.txt": "base\n"}})
    fmt, cfg = ChatFormat(tok), MultiTurnConfig(context_tokens=100_000, max_turns=2)
    ep = Episode(task, sandbox.open("shell"), ToolEnvironment(get_tools()), fmt, cfg)
    script = [call("write_file", path="a.txt", content="turn0"), call("write_file", path="b.txt", content="turn1")]
    run_episodes(ScriptedEngine(tok, script), tok, [ep], PARAMS, cfg)
    assert ep.stop_reason == "max_turns" and ep.session.read("b.txt") == b"turn1"
    # replay: roll the workspace back to the state after turn 0
    ep.session.restore(ep.turns[0].snapshot_id)
    assert ep.session.read("a.txt") == b"turn0"
    with pytest.raises(Exception):
        ep.session.read("b.txt")
    # branch two continuations from turn 0, in their own sessions
    branches = []
    for tag in ("A", "B"):
        child = ep.fork(0, sandbox.open("shell"), ToolEnvironment(get_tools()))
        assert len(child.turns) == 1 and child.ids() == ep.ids()[:len(child.ids())]
        branches.append((tag, child))
    engines = {tag: ScriptedEngine(tok, lambda _p, _i, tag=tag: call("write_file", path=f"{tag}.txt", content=tag))
               for tag, _ in branches}
    for tag, child in branches:
        run_episodes(engines[tag], tok, [child], PARAMS, cfg)
    (_, a), (_, b) = branches
    assert a.session.read("A.txt") == b"A" and b.session.read("B.txt") == b"B"
    for s, other in ((a.session, "B.txt"), (b.session, "A.txt"), (a.session, "b.txt"), (b.session, "b.txt")):
        with pytest.raises(Exception):
            s.read(other)
    assert a.session.read("a.txt") == b"turn0" and a.session.read("base.txt") == b"base\n"
    assert a.turns[0].action_ids == ep.turns[0].action_ids and len(a.turns) == 2
    for e in (ep, a, b):
        e.session.close()


def test_batched_one_generate_call_per_turn_for_all_episodes(tok, sandbox, repair_tasks):
    t1, t2 = repair_tasks[1], repair_tasks[2]
    long = [call("run_tests"), call("list_files"), call("apply_patch", patch=t1.hidden["reference_patch"]), call("submit")]

    def script(prompt: str, turn: int) -> str:
        if t1.question in prompt:
            return long[turn]
        return call("submit")  # task 2 submits at once (unfixed)

    engine = ScriptedEngine(tok, script)
    trajs = multiturn_rollout(engine, tok, [t1, t2], SamplingParams(max_new_tokens=6000, n=3), sandbox, BIG, seed=1)
    assert engine.calls == 4  # one batched generate per turn, across the 6 episodes
    assert [t.group for t in trajs] == [0, 0, 0, 1, 1, 1] and [t.task_id for t in trajs[:3]] == [t1.id] * 3
    assert [len(t.turns) for t in trajs] == [4, 4, 4, 1, 1, 1]
    scores = [grade(t1 if tr.group == 0 else t2, tr, sandbox).score for tr in trajs]
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # submitting the unfixed repo scores 0


class _SlowEngine(ScriptedEngine):
    def generate(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        import time

        time.sleep(0.5)
        return super().generate(*args, **kwargs)


def test_time_budget_is_the_episodes_own_time_not_the_batchs(tok, sandbox, repair_tasks):
    """Eight episodes generated together are each charged an eighth of a generate call: 4 turns of
    0.5 s calls fit a 1 s budget (the wall clock passes it after 2 turns, which used to cut every
    held-out repair episode of a 64-task evaluation after 3 turns). One episode alone pays the whole
    call and is stopped after 2 turns."""
    task = repair_tasks[1]
    script = [call("list_files"), call("list_files"), call("list_files"), call("submit")]
    cfg = MultiTurnConfig(context_tokens=200_000, max_total_tokens=200_000, max_turns=12, wall_time_s=1.0)
    many = multiturn_rollout(_SlowEngine(tok, script), tok, [task], SamplingParams(max_new_tokens=6000, n=8),
                             sandbox, cfg, seed=0)
    assert [(len(t.turns), t.stop_reason) for t in many] == [(4, "submit")] * 8
    assert all(t.timings["episode_s"] >= 2.0 for t in many)  # the wall clock did pass the budget
    alone = multiturn_rollout(_SlowEngine(tok, script), tok, [task], SamplingParams(max_new_tokens=6000, n=1),
                              sandbox, cfg, seed=0)
    assert [(len(t.turns), t.stop_reason) for t in alone] == [(2, "wall_time")]


@pytest.mark.parametrize("template", ["chatml", "variant"])
def test_flat_tokens_are_the_template_rendering_of_the_conversation(tok, sandbox, repair_tasks, template):
    """On templates that add special tokens (and a BOS-like header, and two newlines after each
    turn in the variant), the assembled ids decode to exactly the chat template of the episode."""
    from honing.models import _build_tiny_tokenizer

    t = tok
    if template == "variant":
        t = _build_tiny_tokenizer()
        t.chat_template = ("{{ '<|im_start|>' }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + ':\n' + "
                           "m['content'] + '<|im_end|>\n\n' }}{% endfor %}"
                           "{% if add_generation_prompt %}{{ '<|im_start|>assistant:\n' }}{% endif %}")
    task = repair_tasks[1]
    script = [call("run_tests"), "oops, no call", call("apply_patch", patch=task.hidden["reference_patch"]),
              call("submit")]
    [traj], _ = play(t, sandbox, task, script)
    check_tokens(t, traj)
    fmt = ChatFormat(t)
    rendered = fmt.render(traj.messages, gen=False)
    decoded = t.decode(list(traj.prompt_ids) + list(traj.completion_ids), skip_special_tokens=False)
    assert rendered.startswith(decoded) and rendered[len(decoded):] in ("\n", "\n\n")
    assert decoded.endswith("<|im_end|>")  # the final end-of-turn token is the model's own (mask 1)
    assert traj.loss_mask[-1] == 1 and traj.completion_ids[-1] == t.eos_token_id
    # a reply cut by length has no end-of-turn token: the template's closing goes to the observation (mask 0)
    engine = ScriptedEngine(t, [call("list_files") + " " + "x" * 100])
    cut = multiturn_rollout(engine, t, [task], SamplingParams(max_new_tokens=40), sandbox,
                            MultiTurnConfig(context_tokens=200_000, max_turns=2, max_parse_errors=5))[0]
    first = cut.turns[0]
    assert first.finish_reason == "length" and t.eos_token_id not in first.action_ids
    assert t.decode(list(first.observation_ids), skip_special_tokens=False).startswith("<|im_end|>")


def test_list_files_does_not_follow_links_out_of_the_workspace(tok, sandbox):
    from honing.rollout.tools import ToolContext, list_files

    with sandbox.open("shell", files={"a.txt": "a"}) as s:
        s.exec("ln -s /etc etc_link && mkdir d && ln -s / d/root")
        ctx = ToolContext(s, None, None)
        for path in ("etc_link", "d/root", "..", "/etc"):
            res = list_files(ctx, path)
            assert not res.ok and "not a directory in the workspace" in res.text, (path, res.text)
        assert "a.txt" in list_files(ctx).text and "passwd" not in list_files(ctx).text


def test_heldout_evaluation_reports_what_the_episodes_did(tok, sandbox, repair_tasks):
    """The training run's held-out evaluation (base vs trained) carries the multi-turn behaviour shares."""
    from honing.eval import evaluate

    task = repair_tasks[1]
    ctx = VerifyContext(extra={"sandbox": sandbox})

    def run(script):
        roll = lambda e, t, ts, p, sd: multiturn_rollout(e, t, ts, p, sandbox, BIG, seed=sd)  # noqa: E731
        return evaluate(ScriptedEngine(tok, script), tok, [task], SamplingParams(max_new_tokens=6000), ctx,
                        roll_out=roll)

    prose = run(lambda _p, _i: "The bug is probably in the pricing code.")  # the base model's habit
    fixed = run([call("run_tests"), call("apply_patch", patch=task.hidden["reference_patch"]), call("run_tests"),
                 call("submit")])
    b0, b1 = prose["per_domain_behaviour"][task.domain], fixed["per_domain_behaviour"][task.domain]
    assert prose["pass@1"] == 0.0 and fixed["pass@1"] == 1.0
    assert (b0["valid_tool_call"], b0["ran_tests"], b0["saw_failing_tests"]) == (0.0, 0.0, 0.0)
    assert b0["passed_after_failing_tests"] is None
    assert (b1["valid_tool_call"], b1["ran_tests"], b1["saw_failing_tests"]) == (1.0, 1.0, 1.0)
    assert b1["passed_after_failing_tests"] == 1.0 and b1["mean_tool_calls"] == 4
