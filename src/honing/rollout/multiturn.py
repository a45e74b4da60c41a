"""The multi-turn agent loop: observe -> generate -> parse -> act in the sandbox -> observe.

Token-in/token-out. A trajectory is the initial prompt's ids followed, per turn, by the
engine's own ids for the assistant reply (loss mask 1, the sampling log-probs) and the ids of
the observation as inserted (mask 0, log-prob 0). Observation ids are the tokens of the
chat-template *text delta* the new message adds (rendered with the real history, never
re-tokenising decoded assistant text). The end of an assistant turn: if the engine stopped
on an end-of-turn token (e.g. <|im_end|>), that token is part of the reply (mask 1) and only
what the template writes after it (e.g. "\\n") opens the next observation chunk; if the reply
was cut by length, the whole closing string is part of the observation (mask 0).

Batched: every live episode's prompt goes into one `engine.generate` per turn; the actions
then run in parallel on the sandbox. A group of n samples of a task is n episodes.

Context budget: before a turn, if prompt + max_new_tokens exceeds `context_tokens`, the
`oldest_observations` policy replaces the oldest observations (all but the last
`keep_last_observations`) by a short placeholder until it fits; each replacement is recorded
in `Trajectory.truncations`. The replies generated before a truncation were sampled under a
longer context than the final token sequence shows, so with `mask_stale_turns` (default)
they get loss mask 0 (their log-probs would not match the stored sequence).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from honing.engine.types import Engine, Sample, SamplingParams
from honing.rollout.env import Environment, make_environment
from honing.rollout.tools import cap_text
from honing.rollout.types import Trajectory, Turn
from honing.sandbox import Limits, Sandbox, Session

SENTINEL = "HONINGSENTINEL7F3A"
TRUNCATED = "[output truncated to fit the context]"
STOP_TRUNCATED = ("max_turns", "max_tokens", "wall_time", "context")


@dataclass(frozen=True)
class MultiTurnConfig:
    max_turns: int = 8
    max_total_tokens: int = 8192  # prompt + replies + observations
    wall_time_s: float = 600.0  # per episode, its own time: tools + its share of each batched generation
    max_parse_errors: int = 3  # replies without a usable tool call before the episode stops
    context_tokens: int | None = None  # None: the tokenizer's model_max_length (capped at 32768)
    truncation: str = "oldest_observations"  # or "none" (stop with stop_reason "context")
    keep_last_observations: int = 1
    mask_stale_turns: bool = True
    observation_role: str = "user"
    max_observation_chars: int = 4000
    snapshot_every_turn: bool = True
    profile: str = "python"
    session_limits: Limits | None = None
    parallel_actions: int = 0  # threads for sandbox actions; 0 = the sandbox's max_concurrency
    prefix_cache_tokens: int = 65536  # the engine reuses the previous turns' KV (engine/prefix.py); 0 = off


class ChatFormat:
    """Template arithmetic on text: closing string of an assistant turn, deltas of new messages."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tok = tokenizer
        self.eos_texts = {i: tokenizer.convert_ids_to_tokens(i) for i in self._eos_ids()}

    def _eos_ids(self) -> list[int]:
        ids = [self.tok.eos_token_id] if self.tok.eos_token_id is not None else []
        for t in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            i = self.tok.convert_tokens_to_ids(t)
            if isinstance(i, int) and i != self.tok.unk_token_id and i not in ids:
                ids.append(i)
        return ids

    def render(self, messages: Sequence[Mapping[str, str]], gen: bool) -> str:
        return self.tok.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=gen)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False, verbose=False))

    def prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.encode(self.render(messages, gen=True))

    def observation_text(self, history: Sequence[Mapping[str, str]], action_ids: Sequence[int],
                         new: Sequence[Mapping[str, str]]) -> str:
        """Text inserted after the engine's reply: the rest of the assistant turn's closing
        string, then the new message(s), then the next generation prompt."""
        sent = [*history, {"role": "assistant", "content": SENTINEL}]
        s0 = self.render(sent, gen=False)
        s1 = self.render([*sent, *new], gen=True)
        if not s1.startswith(s0):
            raise ValueError("chat template is not prefix-stable; cannot insert observations token-in/token-out")
        closing = s0[s0.rindex(SENTINEL) + len(SENTINEL):]
        last = action_ids[-1] if action_ids else None
        if last in self.eos_texts and closing.lstrip(" ").startswith(self.eos_texts[last]):
            closing = closing.lstrip(" ")[len(self.eos_texts[last]):]
        return closing + s1[len(s0):]


class Episode:
    """One episode's state: its session, environment and token chunks."""

    def __init__(self, task: Any, session: Session, env: Environment, fmt: ChatFormat, cfg: MultiTurnConfig,
                 group: int = 0) -> None:
        self.task, self.session, self.env, self.fmt, self.cfg, self.group = task, session, env, fmt, cfg, group
        self.t0 = time.perf_counter()
        self.budget_from = 0  # the first turn charged to this episode's time budget (a fork restarts it)
        intro = env.reset(task, session)
        msgs = [dict(m) for m in task.prompt]
        if intro:
            if msgs and msgs[0].get("role") == "system":
                msgs[0]["content"] = msgs[0]["content"] + "\n\n" + intro
            else:
                msgs.insert(0, {"role": "system", "content": intro})
        self.messages: list[dict[str, str]] = msgs
        self.prompt_ids: list[int] = fmt.prompt(msgs)
        self.turns: list[Turn] = []
        self.obs_chunks: list[str] = []  # per turn, the text tokenised into observation_ids
        self.truncations: list[dict[str, int]] = []
        self.stale_before = 0  # replies of turns < this were sampled under a longer context
        self.done, self.stop_reason = False, ""

    def ids(self) -> list[int]:
        out = list(self.prompt_ids)
        for t in self.turns:
            out += t.action_ids
            out += t.observation_ids
        return out

    def spent_s(self) -> float:
        """The episode's own time against `wall_time_s`: its tool and snapshot time plus its share of
        each batched generation it was part of (gen_s / the episodes in that batch). Not the wall
        clock: 64 held-out episodes generated together would otherwise each be charged the whole
        batch's time and all be cut after the same few turns, however fast each one was."""
        return sum(t.timings.get("gen_share_s", t.timings.get("gen_s", 0.0)) + t.timings.get("env_s", 0.0)
                   + t.timings.get("snapshot_s", 0.0) for t in self.turns[self.budget_from:])

    def check_stop(self, max_new_tokens: int, context: int) -> None:
        cfg = self.cfg
        if self.done:
            return
        n = len(self.ids())
        reason = ("max_turns" if len(self.turns) >= cfg.max_turns else
                  "max_tokens" if n >= cfg.max_total_tokens else
                  "wall_time" if self.spent_s() >= cfg.wall_time_s else "")
        if not reason and n + max_new_tokens > context:
            if cfg.truncation == "oldest_observations":
                self._truncate(n + max_new_tokens - context)
            if len(self.ids()) + max_new_tokens > context:
                reason = "context"
        if reason:
            self.done, self.stop_reason = True, reason

    def _truncate(self, excess: int) -> None:
        """Replace the oldest observations by a placeholder until `excess` tokens are freed."""
        last_ok = len(self.turns) - self.cfg.keep_last_observations
        for k in range(max(last_ok, 0)):
            t = self.turns[k]
            if excess <= 0:
                break
            if t.observation_truncated or not t.observation_ids or not t.observation_text:
                continue
            head, sep, tail = self.obs_chunks[k].rpartition(t.observation_text)
            if not sep:  # the template did not insert the content verbatim: leave it
                continue
            text = head + TRUNCATED + tail
            ids = tuple(self.fmt.encode(text))
            freed = len(t.observation_ids) - len(ids)
            if freed <= 0:
                continue
            self.obs_chunks[k] = text
            self.turns[k] = replace(t, observation_ids=ids, observation_text=TRUNCATED, observation_truncated=True)
            self.messages[self._obs_msg_index(k)]["content"] = TRUNCATED
            self.truncations.append({"at_turn": len(self.turns), "observation_of_turn": k, "tokens_removed": freed})
            self.stale_before = len(self.turns)
            excess -= freed

    def _obs_msg_index(self, k: int) -> int:
        n_intro = len(self.messages) - sum(1 + bool(t.observation_ids) for t in self.turns)
        return n_intro + sum(1 + bool(t.observation_ids) for t in self.turns[:k]) + 1

    def act(self, sample: Sample, text: str, gen_s: float, gen_share_s: float | None = None) -> None:
        t0 = time.perf_counter()
        try:
            obs, done = self.env.step(text)
        except Exception as e:  # noqa: BLE001 - a broken environment is infra, not the model's fault
            obs, done = f"error: environment failed: {type(e).__name__}: {e}", True
            self.stop_reason = "infra_error"
        env_s = time.perf_counter() - t0
        obs = cap_text(obs, self.cfg.max_observation_chars)
        info = getattr(self.env, "last", None)
        if info is not None and getattr(info, "infra_error", None):
            done, self.stop_reason = True, "infra_error"
        obs_text, obs_ids = "", ()
        new_msg = {"role": self.cfg.observation_role, "content": obs}
        if not done:
            obs_text = self.fmt.observation_text(self.messages, sample.token_ids, [new_msg])
            obs_ids = tuple(self.fmt.encode(obs_text))
        t1 = time.perf_counter()
        sid = self.session.snapshot() if self.cfg.snapshot_every_turn else None
        snap_s = time.perf_counter() - t1
        self.messages.append({"role": "assistant", "content": text})
        if not done:
            self.messages.append(new_msg)
        self.obs_chunks.append(obs_text)
        self.turns.append(Turn(
            index=len(self.turns), action_ids=tuple(sample.token_ids), action_logprobs=tuple(sample.logprobs),
            action_text=text, observation_ids=obs_ids, observation_text=obs, finish_reason=sample.finish_reason,
            tool=getattr(info, "tool", None), ok=bool(getattr(info, "ok", True)),
            parse_error=bool(getattr(info, "parse_error", False)), snapshot_id=sid,
            timings={"gen_s": gen_s, "gen_share_s": gen_s if gen_share_s is None else gen_share_s, "env_s": env_s,
                     "snapshot_s": snap_s}))
        parse_errors = sum(t.parse_error for t in self.turns)
        if done:
            self.done, self.stop_reason = True, self.stop_reason or "submit"
        elif parse_errors >= self.cfg.max_parse_errors:
            self.done, self.stop_reason = True, "parse_errors"

    def fork(self, turn: int, session: Session, env: Environment) -> "Episode":
        """A new episode that continues from the state after turn `turn` (its tokens, messages
        and workspace snapshot), in `session` (a fresh one; `env` is reset on it)."""
        snap = self.turns[turn].snapshot_id
        if snap is None:
            raise ValueError("turn has no snapshot (snapshot_every_turn was off)")
        if not self.turns[turn].observation_ids:
            raise ValueError("cannot continue after the final turn (the episode ended there)")
        now = self.session.snapshot()
        self.session.restore(snap)
        try:
            files = workspace_files(self.session, text_only=False)
        finally:
            self.session.restore(now)
        env.reset(self.task, session)  # the environment's own state; then the workspace of that turn
        for child_path in list(session.ws.path.iterdir()):
            if child_path.is_dir() and not child_path.is_symlink():
                shutil.rmtree(child_path)
            else:
                child_path.unlink()
        for name, data in files.items():
            session.write(name, data)
        child = object.__new__(Episode)
        child.__dict__.update(self.__dict__)
        child.session, child.env, child.t0 = session, env, time.perf_counter()
        child.turns = list(self.turns[: turn + 1])
        child.budget_from = turn + 1  # a fresh time budget, as before
        child.obs_chunks = list(self.obs_chunks[: turn + 1])
        n_msgs = len(self.messages) - sum(1 + bool(t.observation_ids) for t in self.turns[turn + 1:])
        child.messages = [dict(m) for m in self.messages[:n_msgs]]
        # observations keep their current (possibly truncated) tokens; replies before a truncation are stale
        child.truncations = [dict(x) for x in self.truncations if x["observation_of_turn"] <= turn]
        child.stale_before = min(max((x["at_turn"] for x in child.truncations), default=0), turn + 1)
        child.done, child.stop_reason = False, ""
        return child

    def to_trajectory(self, policy_version: int) -> Trajectory:
        """The sequence ends with the last reply: an observation the model never saw (the loop
        stopped after it) keeps its text in the turn but adds no tokens."""
        comp, mask, lps = [], [], []
        turns = list(self.turns)
        if turns and turns[-1].observation_ids:
            turns[-1] = replace(turns[-1], observation_ids=())
        for t in turns:
            live = 0 if (self.cfg.mask_stale_turns and t.index < self.stale_before) else 1
            comp += t.action_ids
            mask += [live] * len(t.action_ids)
            lps += t.action_logprobs
            comp += t.observation_ids
            mask += [0] * len(t.observation_ids)
            lps += [0.0] * len(t.observation_ids)
        env_stats = dict(getattr(self.env, "stats", {}) or {})
        timings = {k: sum(t.timings.get(k, 0.0) for t in self.turns) for k in ("gen_s", "env_s", "snapshot_s")}
        timings["episode_s"] = time.perf_counter() - self.t0
        last = self.turns[-1] if self.turns else None
        finish = "length" if self.stop_reason in STOP_TRUNCATED else "stop"
        return Trajectory(
            task_id=self.task.id, domain=self.task.domain, prompt_ids=tuple(self.prompt_ids), completion_ids=tuple(comp),
            logprobs=tuple(lps), completion_text=last.action_text if last else "", finish_reason=finish,
            policy_version=policy_version, group=self.group, loss_mask=tuple(mask) if comp else (), timings=timings,
            turns=tuple(turns), messages=tuple(dict(m) for m in self.messages), stop_reason=self.stop_reason,
            truncated_context=bool(self.truncations), truncations=tuple(self.truncations),
            stats={**env_stats, "turns": len(self.turns), "tokens": len(self.prompt_ids) + len(comp)},
            files=workspace_files(self.session) if not self.session.closed else {})


def workspace_files(session: Session, text_only: bool = True, max_file_bytes: int = 1 << 18,
                    max_total_bytes: int = 1 << 22) -> dict[str, Any]:
    """The session's regular files (links and caches skipped), as text (or bytes)."""
    root, out, total = str(session.ws.path), {}, 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
        for f in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if os.path.islink(os.path.join(dirpath, f)) or f.endswith(".pyc"):
                continue
            try:
                data = session.read(rel)
            except Exception:  # noqa: BLE001 - fifos etc.: skipped
                continue
            if len(data) > max_file_bytes or total + len(data) > max_total_bytes:
                continue
            if text_only:
                try:
                    out[rel] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
            else:
                out[rel] = data
            total += len(data)
    return out


def run_episodes(engine: Engine, tokenizer: PreTrainedTokenizerBase, episodes: Sequence[Episode],
                 params: SamplingParams, cfg: MultiTurnConfig, seed: int | None = None,
                 max_workers: int = 4) -> None:
    """Advance `episodes` until all are done: one batched generate per turn."""
    fmt = episodes[0].fmt if episodes else ChatFormat(tokenizer)
    context = cfg.context_tokens or min(int(getattr(tokenizer, "model_max_length", 32768) or 32768), 32768)
    gen_params = replace(params, n=1)
    step = 0
    caching = getattr(engine, "prefix_caching", None)
    scope = caching(cfg.prefix_cache_tokens) if caching and cfg.prefix_cache_tokens else contextlib.nullcontext()
    with scope, ThreadPoolExecutor(max(1, max_workers), thread_name_prefix="episode") as pool:
        while True:
            for e in episodes:
                e.check_stop(params.max_new_tokens, context)
            live = [e for e in episodes if not e.done]
            if not live:
                return
            t0 = time.perf_counter()
            out = engine.generate([e.ids() for e in live], gen_params,
                                  seed=None if seed is None else seed * 1000003 + step)
            gen_s = time.perf_counter() - t0
            samples = [g[0] for g in out]
            texts = [fmt.tok.decode(s.token_ids, skip_special_tokens=True) for s in samples]
            share = gen_s / len(live)
            list(pool.map(lambda a: a[0].act(a[1], a[2], gen_s, share), zip(live, samples, texts)))
            step += 1


def multiturn_rollout(engine: Engine, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Any],
                      params: SamplingParams, sandbox: Sandbox, cfg: MultiTurnConfig | None = None,
                      seed: int | None = None,
                      make_env: Callable[[Any], Environment] = make_environment) -> list[Trajectory]:
    """params.n episodes per task (groups contiguous, in task order), each in its own session."""
    cfg = cfg or MultiTurnConfig()
    fmt = ChatFormat(tokenizer)
    episodes: list[Episode] = []
    try:
        for g, task in enumerate(tasks):
            env_cfg = dict(task.environment or {})
            task_cfg = replace(cfg, max_turns=min(int(env_cfg.get("max_turns", cfg.max_turns)), cfg.max_turns))
            for _ in range(params.n):
                session = sandbox.open(cfg.profile, limits=cfg.session_limits)
                try:
                    episodes.append(Episode(task, session, make_env(task), fmt, task_cfg, group=g))
                except BaseException:
                    session.close()
                    raise
        run_episodes(engine, tokenizer, episodes, params, cfg, seed,
                     max_workers=cfg.parallel_actions or sandbox.max_concurrency)
        return [e.to_trajectory(engine.version) for e in episodes]
    finally:
        for e in episodes:
            e.session.close()


class ScriptedEngine:
    """An Engine that plays scripted replies through the real tokenizer (tests, `--policy scripted`).

    `script(prompt_text, turn) -> reply text`, or a list of replies (turn i gets item i; past
    the end: submit). `turn` is how many assistant turns the prompt already holds. Each reply is
    encoded and closed with the end-of-turn token, with log-prob `logprob` per token."""

    version = 0

    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: Callable[[str, int], str] | Sequence[str],
                 logprob: float = -0.5) -> None:
        self.tok, self.logprob = tokenizer, logprob
        self.script = script if callable(script) else (lambda _p, i, s=list(script): s[i] if i < len(s)
                                                       else '<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
        probe = [{"role": "user", "content": "x"}]
        fmt = ChatFormat(tokenizer)
        self.gen_marker = fmt.render(probe, gen=True)[len(fmt.render(probe, gen=False)):]
        self.eos = tokenizer.eos_token_id
        self.calls = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seed: int | None = None) -> list[list[Sample]]:
        self.calls += 1
        out = []
        for p in prompts:
            text = self.tok.decode(list(p), skip_special_tokens=False)
            reply = self.script(text, max(text.count(self.gen_marker) - 1, 0))
            ids = list(self.tok.encode(reply, add_special_tokens=False)) + [self.eos]
            reason = "stop"
            if len(ids) > params.max_new_tokens:
                ids, reason = ids[: params.max_new_tokens], "length"
            out.append([Sample(tuple(ids), (self.logprob,) * len(ids), reason)] * params.n)  # type: ignore[arg-type]
        return out

    def load_weights(self, state: object, version: int) -> None:
        self.version = version
