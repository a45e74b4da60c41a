"""Warm-start demonstrations for SFT, from four sources, all through the same verifiers.

- `reference`: the task's own solver (tasks/reference.py) replayed through the real rollout path
  (single-turn: the completion; multi-turn: the tool calls run in the sandbox, observations and
  all), graded by the task's verifier;
- `rejection`: best-of-n samples of the current policy, kept only where the verifier passes
  (RFT / STaR / expert iteration);
- `teacher:SPEC`: another model (a model spec, or an OpenAI-compatible endpoint `http(s)://HOST/v1#MODEL`)
  writes the replies, the verifier filters them;
- `file:PATH`: a user's JSONL or Parquet of chat transcripts (`{"messages": [...]}` per line, single-
  or multi-turn), graded when the line carries its task (`"task": {...}` in `honing tasks show --json`
  form: the assistant turns are replayed against it), else refused unless `sft.allow_ungraded`.

Every demonstration comes out as the token layout of an RL trajectory (prompt ids, completion ids,
loss mask): the ids SFT trains on are the ids the engine sees in a rollout, and the loss mask is
the trajectory's own (assistant tokens of every turn, never observations). Each one carries its
source and verdict, and is written to `demos.jsonl` in the run directory with its status:
`kept`, `failed` (the verifier said no), `infra_error`, `refused` (it overlaps a held-out task:
the contamination guard), `no_reference`, `ungraded` (file lines without a task, kept only with
`sft.allow_ungraded`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from honing.errors import HoningError
from honing.rollout.types import Trajectory

SOURCES = ("reference", "rejection", "teacher:SPEC", "file:PATH")


@dataclass
class Demonstration:
    """One demonstration: the token layout SFT trains on, where it came from and its verdict."""

    task_id: str
    domain: str
    source: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    text: str = ""  # the completion as text (multi-turn: the assistant turns and observations)
    passed: bool | None = None  # None: not graded
    score: float | None = None
    reason: str = ""
    status: str = "kept"
    match: str | None = None  # the held-out task it overlaps (status refused)
    turns: int = 1
    where: str = ""  # file:line for file demonstrations
    question: str = ""  # what the contamination guard compares

    @property
    def kept(self) -> bool:
        return self.status in ("kept", "ungraded")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("prompt_ids", "completion_ids", "loss_mask"):
            d[k] = list(d[k])
        d["loss_tokens"] = int(sum(self.loss_mask))
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Demonstration":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("prompt_ids", "completion_ids", "loss_mask"):
            d[k] = tuple(d[k])
        return cls(**d)

    @classmethod
    def from_trajectory(cls, t: Trajectory, source: str, question: str = "") -> "Demonstration":
        v = t.verdict
        status = ("infra_error" if t.status == "infra_error" else
                  "kept" if v is not None and v.passed else "failed")
        return cls(task_id=t.task_id, domain=t.domain, source=source, prompt_ids=tuple(t.prompt_ids),
                   completion_ids=tuple(t.completion_ids), loss_mask=tuple(t.loss_mask), text=t.completion_text,
                   passed=None if v is None else bool(v.passed), score=None if v is None else float(v.score),
                   reason="" if v is None else str(v.details)[:300], status=status, turns=max(len(t.turns), 1),
                   question=question)


def parse_source(spec: str) -> tuple[str, str]:
    """'reference' | 'rejection' | 'teacher:SPEC' | 'file:PATH' -> (kind, argument)."""
    kind, _, arg = str(spec).partition(":")
    if kind in ("reference", "rejection") and not arg:
        return kind, ""
    if kind in ("teacher", "file") and arg:
        return kind, arg
    raise HoningError(f"sft.source {spec!r}: unknown demonstration source (valid: {', '.join(SOURCES)})")


# --- replaying scripted replies through the rollout path ------------------------------------------
def _replay(setup: Any, tok: Any, tasks: Sequence[Any], scripts: Sequence[list[str]], max_new_tokens: int,
            seed: int) -> list[Trajectory]:
    """Each task's scripted replies played through the real rollout path (`Setup.roll_out`: the
    sandbox and tools for multi-turn tasks), one trajectory per task, in task order. Single-turn
    tasks are batched (routed by their prompt ids); each multi-turn task runs on its own engine,
    since an episode's prompt is only known inside the rollout."""
    from honing.engine import SamplingParams
    from honing.rollout.multiturn import ScriptedEngine
    from honing.rollout.show import RoutedEngine
    from honing.rollout.single import prompt_ids

    longest = max((len(tok.encode(r, add_special_tokens=False)) for sc in scripts for r in sc), default=1)
    # a reply is never cut: the budget is the longest scripted reply (+ end of turn; the default
    # `submit` past a script's end is short), and no more, so the context check is the real one
    params = SamplingParams(max_new_tokens=min(max(longest + 1, 64), max_new_tokens), temperature=0.0, n=1)
    out: dict[int, Trajectory] = {}
    single = [i for i, t in enumerate(tasks) if not t.environment]
    while single:  # batches whose prompts differ (two tasks with one prompt go to different batches)
        seen: dict[tuple[int, ...], int] = {}
        rest = []
        for i in single:
            key = tuple(prompt_ids(tok, tasks[i]))
            (rest.append(i) if key in seen else seen.setdefault(key, i))
        batch = list(seen.values())
        eng = RoutedEngine([(key, ScriptedEngine(tok, scripts[i])) for key, i in seen.items()])
        for tr in setup.roll_out(eng, tok, [tasks[i] for i in batch], params, seed):
            out[batch[tr.group]] = tr
        single = rest
    for i, t in enumerate(tasks):
        if t.environment:
            tr = setup.roll_out(ScriptedEngine(tok, scripts[i]), tok, [t], params, seed)[0]
            out[i] = tr
    trajs = [out[i] for i in range(len(tasks))]
    for i, tr in enumerate(trajs):
        tr.group = i
    return trajs


def grade(setup: Any, tasks: Sequence[Any], trajs: list[Trajectory]) -> list[Trajectory]:
    """Grade trajectories with their tasks' verifiers (the reward layers included), like RL does."""
    from honing.verify.batch import grade_trajectories

    grade_trajectories([tasks[t.group] for t in trajs], trajs, setup.ctx, setup.reward, setup.grading)
    return trajs


# --- the sources -----------------------------------------------------------------------------------
def from_reference(setup: Any, tok: Any, tasks: Sequence[Any], template: str, max_new_tokens: int,
                   seed: int) -> list[Demonstration]:
    from honing.tasks.reference import reference_replies

    scripts: list[list[str] | None] = []
    missing: list[Demonstration] = []
    for t in tasks:
        try:
            scripts.append(reference_replies(t, template))
        except HoningError as e:
            scripts.append(None)
            missing.append(Demonstration(t.id, t.domain, "reference", (), (), (), status="no_reference",
                                         reason=str(e), question=t.question))
    have = [i for i, s in enumerate(scripts) if s is not None]
    if not have:
        raise HoningError(f"sft.source=reference: none of the {len(tasks)} training tasks has a reference "
                          f"solution; first: {missing[0].reason if missing else '-'}")
    sub = [tasks[i] for i in have]
    trajs = grade(setup, sub, _replay(setup, tok, sub, [scripts[i] for i in have], max_new_tokens, seed))
    for tr in trajs:
        mask_turns(tr, getattr(scripts[have[tr.group]], "shown_only", ()))
    return [Demonstration.from_trajectory(tr, "reference", sub[tr.group].question) for tr in trajs] + missing


def mask_turns(t: Trajectory, turns: Any) -> Trajectory:
    """Zero `t`'s loss mask on the action tokens of the assistant turns numbered in `turns` (0-based):
    a reference episode's shown-only turns (envcheck.Replies). The observations are 0 already."""
    turns = set(turns or ())
    if not turns:
        return t
    mask, pos = list(t.loss_mask), 0
    if t.truncations or len(mask) != len(t.completion_ids):
        raise HoningError(f"task {t.task_id}: cannot mask shown-only turns of a trajectory whose context was cut")
    for k, turn in enumerate(t.turns):
        if k in turns:
            mask[pos:pos + len(turn.action_ids)] = [0] * len(turn.action_ids)
        pos += len(turn.action_ids) + len(turn.observation_ids)
    if pos != len(mask):
        raise HoningError(f"task {t.task_id}: its turns cover {pos} of {len(mask)} completion tokens")
    t.loss_mask = tuple(mask)
    return t


def from_policy(setup: Any, tok: Any, engine: Any, tasks: Sequence[Any], source: str, samples: int,
                temperature: float, max_new_tokens: int, seed: int, keep: str) -> list[Demonstration]:
    """Best-of-n from an engine: `samples` per task, graded; with keep='best' the best passing sample
    of a task is kept (the others are recorded as failed/surplus), with keep='all' every passing one."""
    from honing.engine import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=samples)
    trajs = grade(setup, tasks, setup.roll_out(engine, tok, tasks, params, seed))
    out = []
    by_task: dict[int, list[Trajectory]] = {}
    for tr in trajs:
        by_task.setdefault(tr.group, []).append(tr)
    for g, group in sorted(by_task.items()):
        demos = [Demonstration.from_trajectory(tr, source, tasks[g].question) for tr in group]
        if keep == "best":
            ok = sorted((d for d in demos if d.status == "kept"), key=lambda d: -(d.score or 0.0))
            for d in ok[1:]:
                d.status = "surplus"
        out += demos
    return out


def from_text_teacher(setup: Any, tok: Any, tasks: Sequence[Any], chat: Callable[[list[dict]], str],
                      source: str, samples: int, max_new_tokens: int, seed: int) -> list[Demonstration]:
    """A teacher that speaks text (an HTTP endpoint, or a model with another tokenizer): its replies
    are re-encoded with the policy's tokenizer through the rollout path, then graded. Single-turn
    tasks only (a multi-turn episode needs the teacher to act on observations token by token)."""
    multi = [t.id for t in tasks if t.environment]
    if multi:
        raise HoningError(f"sft.source={source}: a text teacher (an endpoint, or a model whose tokenizer differs "
                          f"from the policy's) cannot act in multi-turn episodes ({multi[0]}); use a teacher "
                          "with the policy's tokenizer, sft.source=reference or file:PATH")
    rep = [t for t in tasks for _ in range(samples)]
    replies = [[chat([dict(m) for m in t.prompt])] for t in rep]
    trajs = grade(setup, rep, _replay(setup, tok, rep, replies, max_new_tokens, seed))
    return [Demonstration.from_trajectory(tr, source, rep[tr.group].question) for tr in trajs]


def teacher_chat(spec: str, max_new_tokens: int, temperature: float, seed: int,
                 policy_tok: Any) -> tuple[Callable[[list[dict]], str] | None, Any]:
    """(a text chat function, None) for an endpoint or a model with a different tokenizer, or
    (None, engine) for a model that shares the policy's tokenizer (it can act token-in/token-out)."""
    if spec.startswith(("http://", "https://")):
        from honing.engine.openai import OpenAIChat

        url, _, model = spec.partition("#")
        if not model:
            raise HoningError(f"sft.source=teacher:{spec}: name the endpoint's model after '#', e.g. "
                              "teacher:http://localhost:8000/v1#Qwen/Qwen2.5-7B-Instruct")
        client = OpenAIChat(url, model)
        return (lambda msgs: client.chat(msgs, max_new_tokens, temperature, seed)), None
    from honing.engine import SamplingParams, TransformersEngine
    from honing.models import load_policy
    from honing.schedule.rollout_side import eos_ids_of

    model, ttok = load_policy(spec, seed=seed)
    eng = TransformersEngine(model, eos_ids_of(ttok), ttok.pad_token_id)
    if ttok.get_vocab() == policy_tok.get_vocab() and ttok.chat_template == policy_tok.chat_template:
        return None, eng
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=1)

    def chat(msgs: list[dict]) -> str:
        ids = ttok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        p = ttok.encode(ids, add_special_tokens=False)
        s = eng.generate([p], params, seed=seed)[0][0]
        return ttok.decode(s.token_ids, skip_special_tokens=True)

    return chat, None


# --- transcripts from a file -------------------------------------------------------------------------
def read_transcripts(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) per transcript of a JSONL or Parquet file; malformed lines raise naming file:line."""
    if not path.is_file():
        raise HoningError(f"sft.source file:{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        items = ((f"{path}:row {i + 1}", r) for i, r in enumerate(rows))
    else:
        def lines() -> Iterator[tuple[str, Any]]:
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield f"{path}:{n}", json.loads(line)
                    except json.JSONDecodeError as e:
                        raise HoningError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        items = lines()
    for where, rec in items:
        msgs = rec.get("messages") if isinstance(rec, dict) else None
        if isinstance(msgs, str):  # Parquet columns may hold the messages as a JSON string
            try:
                msgs = json.loads(msgs)
            except json.JSONDecodeError:
                msgs = None
        if (not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                  and isinstance(m.get("content"), str) for m in msgs)):
            raise HoningError(f"{where}: 'messages' must be a list of {{\"role\": ..., \"content\": ...}} objects")
        if not any(m["role"] == "assistant" for m in msgs):
            raise HoningError(f"{where}: the transcript has no assistant turn to learn from")
        if msgs[0]["role"] == "assistant":
            raise HoningError(f"{where}: the transcript starts with an assistant turn (no prompt before it)")
        yield where, {**rec, "messages": msgs}


def transcript_layout(tok: Any, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, loss mask) of a transcript, built the way the multi-turn loop builds
    a trajectory: the prompt is the chat template up to the first assistant turn (generation prompt
    opened); each assistant turn is its text's tokens plus the end-of-turn token (mask 1); what follows
    it is the template's text delta for the next messages (mask 0)."""
    from honing.rollout.multiturn import ChatFormat

    fmt = ChatFormat(tok)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    history = [dict(m) for m in messages[:first]]
    prompt = fmt.prompt(history)
    comp: list[int] = []
    mask: list[int] = []
    i = first
    eos = tok.eos_token_id
    while i < len(messages):
        m = messages[i]
        if m["role"] != "assistant":
            raise ValueError(f"message {i}: expected an assistant turn")
        act = fmt.encode(m["content"]) + [eos]
        comp += act
        mask += [1] * len(act)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        new = [dict(x) for x in messages[i + 1:j]]
        history.append({"role": "assistant", "content": m["content"]})
        if new and j < len(messages):  # observations before the next assistant turn
            obs = fmt.encode(fmt.observation_text(history[:-1], act, new))
            comp += obs
            mask += [0] * len(obs)
            history += new
        i = j
    return prompt, comp, mask


def from_file(setup: Any, tok: Any, path: Path, allow_ungraded: bool, max_new_tokens: int,
              seed: int) -> list[Demonstration]:
    from honing.tasks.types import task_from_json
    from honing.verify import get_verifier

    graded_tasks, scripts, wheres, ungraded = [], [], [], []
    for where, rec in read_transcripts(path):
        msgs = rec["messages"]
        if rec.get("task") is not None:
            try:
                task = task_from_json(rec["task"], where=f"{where}: task")
                get_verifier(task.verifier.name)
            except HoningError as e:
                raise HoningError(f"{where}: {e}") from None
            graded_tasks.append(task)
            scripts.append([m["content"] for m in msgs if m["role"] == "assistant"])
            wheres.append(where)
            continue
        if not allow_ungraded:
            raise HoningError(f"{where}: no 'task' to grade this transcript with; every demonstration is "
                              "verified before it is used (add the task, or set sft.allow_ungraded=true)")
        p, c, m = transcript_layout(tok, msgs)
        users = [x["content"] for x in msgs if x["role"] == "user"]
        ungraded.append(Demonstration(f"file/{where.rsplit(':', 1)[-1]}", "file", f"file:{path}", tuple(p), tuple(c),
                                      tuple(m), text="\n".join(x["content"] for x in msgs if x["role"] == "assistant"),
                                      status="ungraded", turns=sum(x["role"] == "assistant" for x in msgs),
                                      where=where, question=users[0] if users else ""))
    out = []
    if graded_tasks:
        trajs = grade(setup, graded_tasks, _replay(setup, tok, graded_tasks, scripts, max_new_tokens, seed))
        for tr in trajs:
            d = Demonstration.from_trajectory(tr, f"file:{path}", graded_tasks[tr.group].question)
            d.where = wheres[tr.group]
            out.append(d)
    return out + ungraded


# --- the contamination guard --------------------------------------------------------------------------
def refuse_contaminated(demos: list[Demonstration], heldout: Sequence[Any], tasks_by_id: dict[str, Any],
                        threshold: float) -> int:
    """Mark as `refused` every kept demonstration whose task overlaps a held-out task (the same question,
    a shared 13-gram run over half its text, or a MinHash near-duplicate: eval/contamination.py).
    Returns how many were refused."""
    live = [d for d in demos if d.kept]
    if not live or not heldout:
        return 0
    from honing.eval.contamination import check_contamination

    held_q = {h.question: h.id for h in heldout}
    items = [tasks_by_id.get(d.task_id) or d.question for d in live]
    rep = check_contamination([list(heldout)], items, threshold=threshold, n_train=len(heldout), exclude_exact=False)
    n = 0
    for d, row in zip(live, rep["tasks"]):
        hit = held_q.get(d.question)
        if hit or row["contaminated"]:
            d.status, d.match = "refused", hit or row["match_id"]
            d.reason = (f"overlaps held-out task {d.match} (exact {row['exact'] or bool(hit)}, "
                        f"13-gram {row['ngram_overlap']:.2f}, near-dup {row['near_dup']:.2f})")
            n += 1
    return n


def check_source(cfg: Any) -> None:
    """Fail fast on a bad `sft.source` (before any model loads): the name, and a file's every line."""
    if not cfg.sft.steps:
        return
    kind, arg = parse_source(cfg.sft.source)
    if kind == "file":
        for where, rec in read_transcripts(Path(arg)):
            if rec.get("task") is None and not cfg.sft.allow_ungraded:
                raise HoningError(f"{where}: no 'task' to grade this transcript with; every demonstration is "
                                  "verified before it is used (add the task, or set sft.allow_ungraded=true)")


# Where in the training seed range the demonstrations' tasks come from. The procedural sources (finance,
# code:functions, repair, CAD) make task n from seed n, so a stream at train_seed + 1 is the RL stream
# shifted by one: RL would spend its steps on tasks SFT already showed the answers to (all-pass groups,
# memorised rather than learned). Half the training span away, RL never reaches them.
DEMO_SEED_OFFSET = 500_000


def demo_tasks(cfg: Any, setup: Any, n: int) -> list[Any]:
    """The `n` training tasks SFT draws its demonstrations for: the task mixture of the run, from a part of
    the training seed range the RL stream does not reach, never a held-out question."""
    from honing.schedule.sampler import TaskSampler
    from honing.tasks.gym import TRAIN_SEED_SPAN

    assert DEMO_SEED_OFFSET < TRAIN_SEED_SPAN // 2 + 1  # still training seeds, far from held-out ones
    return TaskSampler(setup.sources, [x.weight for x in cfg.tasks.sources], cfg.tasks.train_seed + DEMO_SEED_OFFSET,
                       setup.exclude).next(n)


def collect(cfg: Any, setup: Any, tok: Any, policy_engine: Any) -> list[Demonstration]:
    """The demonstrations `cfg.sft` asks for, graded and screened against the held-out tasks."""
    s = cfg.sft
    kind, arg = parse_source(s.source)
    max_new, scripted_max = cfg.generation.max_new_tokens, 1 << 14  # a script is never cut short
    tasks: list[Any] = []
    if kind == "file":
        demos = from_file(setup, tok, Path(arg), s.allow_ungraded, scripted_max, cfg.seed)
    else:
        tasks = demo_tasks(cfg, setup, s.tasks or s.batch_size * 8)
        if kind == "reference":
            demos = from_reference(setup, tok, tasks, s.response_template, scripted_max, cfg.seed)
        elif kind == "rejection":
            demos = from_policy(setup, tok, policy_engine, tasks, "rejection", s.samples, s.temperature, max_new,
                                cfg.seed, s.keep)
        else:
            chat, engine = teacher_chat(arg, max_new, s.temperature, cfg.seed, tok)
            demos = (from_policy(setup, tok, engine, tasks, f"teacher:{arg}", s.samples, s.temperature, max_new,
                                 cfg.seed, s.keep) if engine is not None else
                     from_text_teacher(setup, tok, tasks, chat, f"teacher:{arg}", s.samples, scripted_max, cfg.seed))
    # a recipe that lets RL train on held-out questions (tasks.exclude_heldout_questions=false, a tiny question
    # space shared on purpose; the start-up contamination warning says so) gets the same for its demonstrations
    if s.refuse_contaminated and cfg.tasks.exclude_heldout_questions:
        refuse_contaminated(demos, setup.heldout, {t.id: t for t in tasks}, cfg.eval.contamination.threshold)
    return demos


def write_demos(path: Path, demos: Sequence[Demonstration]) -> None:
    from honing.schedule.runlog import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(d.to_json()) + "\n" for d in demos))


def read_demos(path: Path) -> list[Demonstration]:
    return [Demonstration.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class DemoStats:
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, demos: Sequence[Demonstration]) -> "DemoStats":
        c: dict[str, int] = {}
        for d in demos:
            c[d.status] = c.get(d.status, 0) + 1
        return cls(c)

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
