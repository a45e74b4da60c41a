"""The trajectory browser's data in report.html: every graded trajectory of a run, compact.

Sources, in this order:
- the run's trajectory shards (`trajectories/*.parquet`, honing.schedule.trajstore): every graded
  trajectory with its step, domain, task, reward, advantage, verdict and turns. `state.sqlite`
  adds each task's prompt (the batch payloads hold the tasks as the model saw them), whether
  the step trained on the trajectory (used / dropped / deferred) and which batches a resume
  discarded (their shards stay on disk but are not part of the run any more);
- the per-sample records of the evaluations (`eval/*.json`, `--eval`);
- for a run without shards (older honing), the held-out examples of summary.json, with a note.

A sample is labelled by its verdict only: `pass`, `fail`, `infra` (verdict infra_error) or
`none` (no verdict recorded). The payload is one JSON object, gzip-compressed and base64 encoded
into the page (`encode`); the page decompresses it with the browser's DecompressionStream.
Long texts are embedded up to a cap chosen so that all text together stays within TEXT_BUDGET
characters; a capped text keeps its full length (key `<key>_n`) so the page can say so.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

TEXT_BUDGET = 24_000_000  # characters of text embedded across all trajectories
MAX_FIELD = 40_000  # one text's cap when the budget allows
MIN_FIELD = 600  # the cap never goes below this (a huge run's page grows instead)
REF_MAX = 300  # a task's reference answer is shown when it is a short scalar

# shard columns the browser reads (token ids only as lengths)
_COLUMNS = ["step", "task_id", "domain", "completion_text", "finish_reason", "policy_version", "group",
            "verdict_score", "verdict_passed", "verdict_components", "verdict_details", "verdict_infra_error",
            "reward", "reward_layers", "advantage", "turns", "messages", "stop_reason", "truncated_context"]
TRAINING = "training"
SUMMARY = "held-out examples (summary.json)"


def verdict_label(passed: Optional[bool], infra_error: Optional[bool]) -> str:
    """`infra` for an infrastructure error, else `pass`/`fail` by the verdict; `none` without one."""
    if infra_error:
        return "infra"
    if passed is None:
        return "none"
    return "pass" if passed else "fail"


def _num(x: Any) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def _clean(d: dict) -> dict:
    """Drop empty values (the page treats a missing key as empty): a smaller payload."""
    return {k: v for k, v in d.items() if v is not None and v != "" and v != {} and v != []}


def _scalars(d: Any) -> dict:
    return {str(k): _num(v) for k, v in (d or {}).items()} if isinstance(d, dict) else {}


@dataclass
class BrowserData:
    sources: list[str] = field(default_factory=list)
    tasks: list[dict] = field(default_factory=list)  # {"id", "p": [{"role", "content"}], "ref"}
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cap: Optional[int] = None  # the text cap applied (None: nothing capped)
    _task_index: dict = field(default_factory=dict)

    def source(self, name: str) -> int:
        if name not in self.sources:
            self.sources.append(name)
        return self.sources.index(name)

    def task(self, task_id: str, prompt: Sequence[dict], ref: Any = None) -> int:
        msgs = [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in prompt or []
                if isinstance(m, dict)]
        key = (task_id, json.dumps(msgs, sort_keys=True))
        if key not in self._task_index:
            self._task_index[key] = len(self.tasks)
            self.tasks.append(_clean({"id": task_id, "p": msgs, "ref": ref}))
        return self._task_index[key]

    def payload(self) -> dict:
        return {"sources": self.sources, "tasks": self.tasks, "rows": self.rows, "notes": self.notes,
                "cap": self.cap}


# --- run state (optional) -------------------------------------------------------------------------
@dataclass
class _State:
    prompts: dict[str, tuple[list[dict], Any]] = field(default_factory=dict)  # task_id -> (prompt, reference)
    # (shard, row) -> (status, step): used / dropped / deferred / ready, and the step that used it
    use: dict[tuple[str, int], tuple[str, Optional[int]]] = field(default_factory=dict)
    shards: dict[str, str] = field(default_factory=dict)  # shard -> batch status
    ok: bool = False


def _reference(hidden: Any) -> Any:
    ans = hidden.get("answer") if isinstance(hidden, dict) else None
    if isinstance(ans, bool) or not isinstance(ans, (str, int, float)):
        return None
    s = str(ans)
    return s if len(s) <= REF_MAX else None


def read_state(path: Path) -> _State:
    """Prompts, training use and batch status from state.sqlite (read-only); empty if unreadable."""
    st = _State()
    if not path.is_file():
        return st
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return st
    try:
        for shard, status, payload in db.execute("SELECT shard, status, payload FROM batches"):
            if shard:
                st.shards[shard] = status
            try:
                tasks = json.loads(payload).get("tasks") or []
            except (ValueError, AttributeError):
                continue
            for t in tasks:
                if isinstance(t, dict) and "id" in t and t["id"] not in st.prompts:
                    prompt = t.get("prompt")
                    if isinstance(prompt, str):
                        prompt = [{"role": "user", "content": prompt}]
                    st.prompts[t["id"]] = (prompt if isinstance(prompt, list) else [], _reference(t.get("hidden")))
        for shard, row, status, step in db.execute("SELECT shard, row, status, step FROM trajectories"):
            st.use[(shard, int(row))] = (status, step)
        st.ok = True
    except sqlite3.Error:
        st.ok = False
    finally:
        db.close()
    return st


# --- training trajectories from the shards --------------------------------------------------------
def _lengths(path: Path) -> tuple[list[int], list[int]]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["prompt_ids", "completion_ids"])
    return ([int(x or 0) for x in pc.list_value_length(t.column("prompt_ids")).to_pylist()],
            [int(x or 0) for x in pc.list_value_length(t.column("completion_ids")).to_pylist()])


def _turns(turns: Sequence[dict], messages: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """The turns for the page and the conversation's opening messages (system/user before turn 1).
    The readable observation is the message inserted after the turn's action when the messages
    line up with the turns; otherwise the observation's template text."""
    msgs = [m for m in messages or [] if isinstance(m, dict)]
    n_intro = len(msgs) - sum(1 + bool(t.get("observation_ids")) for t in turns)
    aligned = n_intro >= 0 and all(msgs[i].get("role") == "assistant" for i in _action_positions(turns, n_intro))
    out, pos = [], n_intro
    for t in turns:
        obs = t.get("observation_text", "")
        pos += 1
        if t.get("observation_ids"):
            if aligned:
                obs = str(msgs[pos].get("content", obs))
            pos += 1
        out.append(_clean({"k": t.get("index"), "a": t.get("action_text", ""), "o": obs, "tool": t.get("tool"),
                           "ok": None if t.get("ok", True) else False, "pe": True if t.get("parse_error") else None,
                           "fr": t.get("finish_reason") if t.get("finish_reason") not in (None, "stop") else None,
                           "ot": True if t.get("observation_truncated") else None}))
    if not aligned:  # the conversation's opening: the messages before the first assistant message
        n_intro = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    return out, msgs[:n_intro]


def _action_positions(turns: Sequence[dict], n_intro: int) -> Iterable[int]:
    pos = n_intro
    for t in turns:
        yield pos
        pos += 1 + bool(t.get("observation_ids"))


def add_shards(data: BrowserData, run: Path) -> int:
    """Every trajectory of `run`'s shards (ordered by shard name, then row); returns how many."""
    from honing.schedule.trajstore import ShardError, read_columns

    files = sorted((run / "trajectories").glob("*.parquet")) if (run / "trajectories").is_dir() else []
    if not files:
        return 0
    state = read_state(run / "state.sqlite")
    src = data.source(TRAINING)
    bad: list[str] = []
    skipped = 0
    n = 0
    train_rows: list[tuple] = []  # (step, shard, group, row, reward, advantage, index into data.rows)
    for path in files:
        if state.ok and state.shards.get(path.name) == "discarded":
            skipped += 1
            continue
        try:
            rows = read_columns(path, _COLUMNS)
            n_prompt, n_completion = _lengths(path)
        except (ShardError, OSError, ValueError) as exc:
            bad.append(f"{path.name} ({str(exc).split(': ', 1)[-1][:120]})")
            continue
        within: dict[int, int] = {}
        for i, r in enumerate(rows):
            train_rows.append((r["step"], path.name, r["group"], i, r["reward"], r["advantage"], len(data.rows)))
            prompt, ref = state.prompts.get(r["task_id"], (None, None))
            turns, intro = _turns(r.get("turns") or [], r.get("messages") or [])
            use, used_step = state.use.get((path.name, i), (None, None))
            j = within.get(r["group"], 0)
            within[r["group"]] = j + 1
            row = {"s": src, "st": r["step"], "d": r["domain"],
                   "t": data.task(r["task_id"], prompt if prompt is not None else intro, ref),
                   "g": r["group"], "j": j, "r": _num(r["reward"]), "a": _num(r["advantage"]),
                   "v": verdict_label(r["verdict_passed"], r["verdict_infra_error"]),
                   "sc": _num(r["verdict_score"]), "det": r["verdict_details"],
                   "cmp": _scalars(r["verdict_components"]), "ly": _scalars(r["reward_layers"]),
                   "fr": r["finish_reason"], "sr": r["stop_reason"] or None,
                   "tc": True if r["truncated_context"] else None,
                   "nt": n_completion[i] if i < len(n_completion) else None,
                   "np": n_prompt[i] if i < len(n_prompt) else None, "pv": r["policy_version"],
                   "u": use, "us": used_step if used_step is not None and used_step != r["step"] else None,
                   "x": r["completion_text"] if not turns else None, "tu": turns, "loc": f"{path.name}:{i}"}
            data.rows.append(_clean(row))
            n += 1
    if train_rows and all(not a for *_, a, _ in train_rows):
        note = recompute_advantages(data, run, train_rows, state) if state.ok else None
        if note is None:  # as written (0) means "not recorded": say so rather than show zeros
            for *_, idx in train_rows:
                data.rows[idx].pop("a", None)
            note = "The shards record no advantages (they are written before the step computes them) and this " \
                   "run's state.sqlite or config.yaml cannot say which step trained on which trajectory."
        data.notes.append(note)
    if bad:
        data.notes.append(f"{len(bad)} trajectory shard(s) could not be read and are not shown: "
                          + "; ".join(bad[:5]) + (" …" if len(bad) > 5 else ""))
    if skipped:
        data.notes.append(f"{skipped} shard(s) of batches discarded by a resume (rolled back) are not shown.")
    if n and not state.ok:
        data.notes.append("state.sqlite is missing or unreadable: prompts of single-turn trajectories and whether "
                          "a step trained on them are not shown.")
    return n


def recompute_advantages(data: BrowserData, run: Path, train_rows: Sequence[tuple], state: _State) -> Optional[str]:
    """The advantages each step trained with. A shard is written when its batch is graded, before
    the step that uses it computes advantages, so its `advantage` column is 0; the step's batch is
    known (state.sqlite: each trajectory's use and step), and so is the estimator (config.yaml):
    recompute as the loop does (its groups' rewards, concatenated, through compute_advantages).
    Trajectories no step trained on get none. Returns the page's note, or None if not possible."""
    import yaml

    try:
        import torch

        from honing.config import RunConfig
        from honing.train import compute_advantages

        cfg = RunConfig.model_validate(yaml.safe_load((run / "config.yaml").read_text()) or {})
    except Exception:  # noqa: BLE001 - no config, or one this honing cannot read: leave the column as written
        return None
    k = cfg.tasks.samples_per_prompt
    by_step: dict[int, list[tuple]] = {}
    for for_step, shard, group, row, reward, _, idx in train_rows:
        use, step = state.use.get((shard, row), (None, None))
        if use == "used" and step is not None:
            by_step.setdefault(int(step), []).append((for_step, shard, group, row, reward, idx))
    if not by_step:
        return None
    for row_dict in (data.rows[t[-1]] for t in train_rows):
        row_dict.pop("a", None)
    failed = 0
    for step, items in by_step.items():
        items.sort(key=lambda t: t[:4])  # the step's groups contiguous, each in shard row order
        try:
            adv = compute_advantages(torch.tensor([float(t[4]) for t in items]), k, cfg.train).tolist()
        except (ValueError, RuntimeError):
            failed += 1
            continue
        for t, a in zip(items, adv):
            data.rows[t[-1]]["a"] = _num(a)
    return (f"Advantages are recomputed as the loop computed them ({cfg.train.advantage_estimator} over the groups "
            f"each step trained on): the shards are written before the step, with advantage 0. Trajectories no "
            f"step trained on have none." + (f" {failed} step(s) could not be recomputed." if failed else ""))


# --- evaluations and the summary fallback ---------------------------------------------------------
def add_evals(data: BrowserData, evals: Sequence[tuple[str, dict]]) -> int:
    n = 0
    for name, e in evals:
        src = data.source(f"eval: {name}")
        tasks = {}
        for t in e.get("tasks", []):
            tasks[t["id"]] = t.get("prompt") or [{"role": "user", "content": t.get("question", "")}]
        for s in e.get("samples", []):
            turns = [_clean({"k": t.get("index"), "a": t.get("action", ""), "o": t.get("observation", ""),
                             "tool": t.get("tool"), "ok": None if t.get("ok", True) else False})
                     for t in s.get("turns") or []]
            label = "infra" if s.get("status") == "infra_error" else ("pass" if s.get("passed") else "fail")
            data.rows.append(_clean({
                "s": src, "d": s.get("domain"), "t": data.task(s["task_id"], tasks.get(s["task_id"], [])),
                "j": s.get("sample"), "r": _num(s.get("score")), "v": label, "sc": _num(s.get("score")),
                "det": s.get("details"), "cmp": _scalars(s.get("components")), "ly": _scalars(s.get("reward_layers")),
                "fr": s.get("finish_reason"), "sr": s.get("stop_reason"), "nt": s.get("n_tokens"),
                "ans": None if s.get("answer") is None else str(s.get("answer")),
                "x": s.get("text") if not turns else None, "tu": turns}))
            n += 1
    return n


def add_summary_examples(data: BrowserData, summary: dict) -> int:
    """The held-out examples of summary.json. Labelled by their verdict when the example records
    one (`passed`, `infra_error`); the loop's examples today hold only task and completion, so
    they are labelled "no verdict" rather than guessed."""
    examples = [ex for ex in summary.get("examples_after") or [] if isinstance(ex, dict)]
    if not examples:
        return 0
    src = data.source(SUMMARY)
    for i, ex in enumerate(examples):
        v = ex.get("verdict") if isinstance(ex.get("verdict"), dict) else ex
        passed = v.get("passed")
        data.rows.append(_clean({
            "s": src, "d": ex.get("domain"),
            "t": data.task(str(ex.get("task_id") or f"held-out example {i + 1}"),
                           [{"role": "user", "content": str(ex.get("task", ""))}]),
            "v": verdict_label(passed if isinstance(passed, bool) else None, v.get("infra_error")),
            "sc": _num(v.get("score")), "r": _num(v.get("score")), "det": v.get("details"),
            "x": str(ex.get("completion", ""))}))
    return len(examples)


# --- size -----------------------------------------------------------------------------------------
def _text_slots(data: BrowserData) -> list[tuple[dict, str]]:
    slots = []
    for r in data.rows:
        for k in ("x", "det"):
            if isinstance(r.get(k), str):
                slots.append((r, k))
        for t in r.get("tu", ()):
            for k in ("a", "o"):
                if isinstance(t.get(k), str):
                    slots.append((t, k))
    for t in data.tasks:
        for m in t.get("p", ()):
            slots.append((m, "content"))
    return slots


def choose_cap(lengths: Sequence[int], budget: int = TEXT_BUDGET, most: int = MAX_FIELD,
               least: int = MIN_FIELD) -> int:
    """The largest cap in [least, most] with sum(min(len, cap)) <= budget (least if none fits)."""
    if sum(min(n, most) for n in lengths) <= budget:
        return most
    lo, hi = least, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cap_texts(data: BrowserData, budget: int = TEXT_BUDGET) -> None:
    slots = _text_slots(data)
    cap = choose_cap([len(d[k]) for d, k in slots], budget)
    capped = 0
    for d, k in slots:
        s = d[k]
        if len(s) > cap:
            d[k] = s[:cap]
            d[k + "_n"] = len(s)
            capped += 1
    if capped:
        data.cap = cap
        data.notes.append(f"{capped:,} long text(s) are embedded up to {cap:,} characters (the page keeps all "
                          f"trajectories under a size budget); the shards hold the full text.")


def encode(payload: dict) -> str:
    """gzip + base64 of the payload's JSON (deterministic: no timestamp in the gzip header)."""
    raw = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def decode(text: str) -> dict:
    """The inverse of `encode` (tests, tools)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))


def browser_data(run: Optional[Path], evals: Sequence[tuple[str, dict]], summary: Optional[dict],
                 budget: int = TEXT_BUDGET) -> BrowserData:
    data = BrowserData()
    n_train = add_shards(data, run) if run is not None else 0
    add_evals(data, evals)
    if run is not None and not n_train and summary and summary.get("examples_after"):
        n = add_summary_examples(data, summary)
        ex = [r for r in data.rows if data.sources[r["s"]] == SUMMARY]
        how = ("they record no verdict (summary.json keeps only task and completion), so they are labelled "
               "'no verdict'" if all(r["v"] == "none" for r in ex) else "each labelled by the verdict it records")
        data.notes.insert(0, f"This run has no trajectory shards (trajectories/*.parquet: a run from an older honing, "
                             f"or a wiped directory), so the browser shows only the {n} held-out example(s) from "
                             f"summary.json; {how}.")
    cap_texts(data, budget)
    return data
