"""The run-health monitor: warning signs of a run going wrong, raised while it trains.

`HealthMonitor.observe(step, metrics)` is fed each step's metrics (and `observe_heldout` each
held-out evaluation) and returns the events that step raised. Each check is a small pure function
below; the monitor only keeps the windows they read. A window check compares the mean over the
latest `window` steps with the mean over the run's first `window` steps (the baseline), once the two
are disjoint (2 x `window` steps in).

Events (thresholds in `run.health`; `run.halt_on` names the ones that stop the run):
- `heldout_drop`: train reward rose while held-out pass@1 fell below the best evaluation so far,
  beyond the paired bootstrap CI of the change (held-out runs every eval.every_steps and at the end);
- `length_collapse`: mean completion length fell below a fraction of its baseline;
- `entropy_collapse`: token entropy fell below a fraction of its baseline. The entropy is
  `train/neg_logprob`, the mean -log p of the sampled completion tokens: an unbiased Monte-Carlo
  estimate of the sampling distribution's entropy from log-probs the engine returns anyway;
- `non_correctness_gain`: one reward layer that is not a `component: correct` one (format, a judge,
  a penalty going away) contributed most of the reward gain (`reward/<domain>/<layer>` metrics);
- `infra_errors`: the share of rollout samples that were infrastructure errors climbed;
- `is_ratio`: importance-sampling ratios climbed: the mean |log ratio| between the trainer's and
  the engine's log-probs (train/logprob_mismatch), or the share of clipped tokens (train/clip_frac,
  train/tis_clip_frac);
- `memory_pressure`: a step's peak resident memory (rollout/peak_rss_mb, train/peak_rss_mb) passed
  `memory_fraction` of what the process may hold (honing.train.memory.memory_limit_mb): the kernel
  kills a process past it without a word, so the run says so while a checkpoint can still be taken.
  A per-step check, not a window one.

An event fires when its condition becomes true and not again until the condition has cleared, so
a resumed run that stopped on an event continues. The monitor's state travels in the scheduler
state of each checkpoint (`state_dict` / `load_state_dict`): a resume sees exactly the windows an
uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from honing.config import HEALTH_EVENTS, HealthConfig
from honing.eval.metrics import diff_ci
from honing.verify.reward import PASSED, RewardConfig, applies

__all__ = ["HEALTH_EVENTS", "HealthMonitor", "collapse", "climb", "heldout_drop", "layer_coefficients",
           "memory_pressure", "non_correctness_gain", "infra_share", "tag"]

# metrics the window checks read (reward layers: every 'reward/<domain>/<layer>')
TRACKED = ("train/reward", "train/completion_len", "train/neg_logprob", "train/logprob_mismatch", "train/clip_frac",
           "train/tis_clip_frac", "health/infra_share")
IS_METRICS = {"train/logprob_mismatch": ("mean |log IS ratio| (trainer vs engine log-probs)", "is_logratio_rise"),
              "train/clip_frac": ("share of clipped tokens (policy loss)", "is_clip_rise"),
              "train/tis_clip_frac": ("share of tokens above train.tis_cap", "is_clip_rise")}


# --- the checks: pure functions of window means ----------------------------------------------------

def collapse(baseline: float, recent: float, frac: float) -> bool:
    """A positive quantity fell below `frac` of its baseline."""
    return baseline > 0 and recent < frac * baseline


def climb(baseline: float, recent: float, rise: float) -> bool:
    """A quantity rose by at least `rise` over its baseline."""
    return recent - baseline >= rise


def heldout_drop(best: Mapping[str, float], now: Mapping[str, float], reward_best: float, reward_now: float,
                 reward_rise: float, level: float = 0.95,
                 clusters: Mapping[str, str] | None = None) -> tuple[bool, dict[str, float]]:
    """Held-out pass@1 per task at the best evaluation and now (same task ids): fires when the paired
    bootstrap CI of (now - best) lies below 0 while train reward rose by at least `reward_rise`. `clusters`
    (task id -> structure): tasks of one structure are resampled together."""
    ids = sorted(set(best) & set(now))
    if not ids:
        return False, {}
    delta, lo, hi = diff_ci([best[i] for i in ids], [now[i] for i in ids], level=level,
                            clusters=[(clusters or {}).get(i, i) for i in ids])
    vals = {"delta": delta, "ci_lo": lo, "ci_hi": hi, "tasks": float(len(ids)), "reward_best": reward_best,
            "reward_now": reward_now}
    return hi < 0 and reward_now - reward_best >= reward_rise, vals


def non_correctness_gain(first: Mapping[str, float], recent: Mapping[str, float],
                         coefficients: Mapping[str, tuple[float, bool]], min_gain: float,
                         share: float) -> list[tuple[str, dict[str, float]]]:
    """One domain's layer means in the first and the latest window (`total` plus each layer), and each
    layer's coefficient in the reward (and whether it scores correctness). Returns the non-correctness
    layers that contributed at least `share` of a total gain of at least `min_gain`."""
    if "total" not in first or "total" not in recent:
        return []
    gain = recent["total"] - first["total"]
    if gain < min_gain or gain <= 0:
        return []
    out = []
    for name, (coef, correctness) in coefficients.items():
        if correctness or name not in first or name not in recent:
            continue
        part = coef * (recent[name] - first[name])
        if part >= share * gain:
            out.append((name, {"gain": gain, "layer_gain": part, "share": part / gain, "layer_first": first[name],
                               "layer_recent": recent[name]}))
    return out


def layer_coefficients(reward: RewardConfig, domain: str) -> dict[str, tuple[float, bool]]:
    """How much a unit of each layer (and penalty) moves the reward of a `domain` task, and whether the
    layer scores correctness (`component: correct` or `passed`). Penalties: -1 (their metric is already weighted)."""
    layers = [x for x in reward.layers if applies(x.domains, domain)]
    wsum = sum(x.weight for x in layers) or 1.0
    out = {x.name: (x.weight / wsum if reward.normalize else x.weight, x.component in ("correct", PASSED)) for x in layers}
    out.update({f"penalty/{p.name}": (-1.0, False) for p in reward.penalties if applies(p.domains, domain)})
    return out


def infra_share(metrics: Mapping[str, float], group_size: int) -> float | None:
    """Infrastructure-error share of this step's rollout samples, retried attempts included (None
    when the step's rollout counters are missing)."""
    attempts = metrics.get("rollout/attempts")
    if not attempts:
        return None
    return float(metrics.get("rollout/infra_errors", 0.0)) / (attempts * max(group_size, 1))


PEAK_METRICS = ("rollout/peak_rss_mb", "train/peak_rss_mb")
MEMORY_KNOBS = ("train.gradient_checkpointing: true, a lower train.logprob_chunk_tokens, train.micro_batch_size or "
                "micro_batch_tokens, generation.max_batch_size")


def memory_pressure(peak_mb: float, limit_mb: float | None, fraction: float) -> bool:
    """The step's peak resident memory is above `fraction` of the limit (no limit known: never)."""
    return bool(limit_mb) and peak_mb > fraction * limit_mb  # type: ignore[operator]


def tag(events: Sequence[dict]) -> str:
    """The progress line's mention of a step's events."""
    return ("  health: " + ", ".join(sorted({e["name"] for e in events}))) if events else ""


# --- the monitor -----------------------------------------------------------------------------------

@dataclass
class _Track:
    """One metric's first `window` values (the baseline) and latest `window` values, as (step, value)."""

    first: list = field(default_factory=list)
    recent: list = field(default_factory=list)

    def add(self, step: int, value: float, window: int) -> None:
        if len(self.first) < window:
            self.first.append((step, value))
        self.recent = (self.recent + [(step, value)])[-window:]

    def ready(self, window: int) -> bool:  # both windows full and disjoint
        return len(self.recent) == window and len(self.first) == window and self.recent[0][0] > self.first[-1][0]

    @staticmethod
    def mean(xs: list) -> float:
        return sum(v for _, v in xs) / len(xs)

    def span(self, which: str) -> str:
        xs = getattr(self, which)
        return f"steps {xs[0][0]}-{xs[-1][0]}"


class HealthMonitor:
    """Feed it `observe(step, metrics)` after each step (and `observe_heldout(step, result)` after each
    held-out evaluation); it returns the events raised, each a dict: name, severity (`halt` when the
    name is in `halt_on`, else `warn`), message, values (the numbers behind it), step."""

    def __init__(self, cfg: HealthConfig, halt_on: Sequence[str] = (), reward: RewardConfig | None = None,
                 group_size: int = 1, memory_limit_mb: float | None = None) -> None:
        unknown = [n for n in halt_on if n not in HEALTH_EVENTS]
        if unknown:
            from honing.errors import ConfigError

            raise ConfigError(f"run.halt_on: unknown health event(s) {unknown} (valid: {', '.join(HEALTH_EVENTS)})")
        self.cfg, self.halt_on = cfg, set(halt_on)
        self.reward = reward or RewardConfig()
        self.group_size = group_size
        if memory_limit_mb is None:
            from honing.train.memory import memory_limit_mb as _limit

            memory_limit_mb = _limit()
        self.memory_limit_mb = memory_limit_mb
        self.tracks: dict[str, _Track] = {}
        self.active: set[str] = set()  # conditions true at the last check (an event fires on the way in)
        self.best: dict | None = None  # the best held-out evaluation so far: step, pass@1, per_task, reward
        self.pending: dict | None = None  # an evaluation not checked yet

    # --- input -----------------------------------------------------------------------------------

    def observe(self, step: int, metrics: dict[str, float]) -> list[dict]:
        """This step's events. Adds `health/infra_share` to `metrics` (the derived metric it watches)."""
        if not self.cfg.enabled:
            return []
        share = infra_share(metrics, self.group_size)
        if share is not None:
            metrics["health/infra_share"] = share
        w = self.cfg.window
        for key, v in metrics.items():
            if (key in TRACKED or key.startswith("reward/")) and isinstance(v, (int, float)):
                self.tracks.setdefault(key, _Track()).add(step, float(v), w)
        found: dict[str, tuple[str, str, dict]] = {}  # condition key -> (name, message, values)
        self._windows(found)
        self._memory(step, metrics, found)
        return self._fire(step, found, heldout=False) + self.check_heldout(step)

    def observe_heldout(self, step: int, result: Mapping[str, Any]) -> None:
        """A held-out evaluation (honing.eval.evaluate's result); checked at the next `observe` or
        `check_heldout`. A second one at the same step (after the SFT warm start) replaces the first."""
        per_task = result.get("per_task_pass@1")
        if self.cfg.enabled and per_task:
            self.pending = {"step": step, "pass@1": float(result["pass@1"]), "per_task": dict(per_task),
                            "clusters": dict(result.get("per_task_cluster") or {})}

    def check_heldout(self, step: int) -> list[dict]:
        """The held-out check of a pending evaluation (the loop calls it after the final evaluation)."""
        ev, self.pending = self.pending, None
        if ev is None or not self.cfg.enabled:
            return []
        tr = self.tracks.get("train/reward")
        ev["reward"] = _Track.mean(tr.recent) if tr and len(tr.recent) == self.cfg.window else None
        found: dict[str, tuple[str, str, dict]] = {}
        best = self.best
        if best is not None and tr is not None and len(tr.first) == self.cfg.window and ev["reward"] is not None:
            r_best = best["reward"] if best["reward"] is not None else _Track.mean(tr.first)
            hit, vals = heldout_drop(best["per_task"], ev["per_task"], r_best, ev["reward"],
                                     self.cfg.heldout_reward_rise, self.cfg.heldout_ci,
                                     {**(best.get("clusters") or {}), **(ev.get("clusters") or {})})
            if hit:
                pct = round(100 * self.cfg.heldout_ci)
                found["heldout_drop"] = ("heldout_drop", (
                    f"held-out pass@1 {ev['pass@1']:.3f} at step {ev['step']} is below {best['pass@1']:.3f} at step "
                    f"{best['step']} (paired {pct}% CI of the change [{vals['ci_lo']:+.3f}, {vals['ci_hi']:+.3f}] "
                    f"over {int(vals['tasks'])} tasks) while train reward rose {r_best:.3f} -> {ev['reward']:.3f} "
                    f"(run.health.heldout_reward_rise={self.cfg.heldout_reward_rise})"),
                    {**vals, "pass@1": ev["pass@1"], "best_pass@1": best["pass@1"], "best_step": float(best["step"])})
        if best is None or ev["pass@1"] > best["pass@1"]:
            self.best = ev
        return self._fire(step, found, heldout=True)

    # --- the window checks -----------------------------------------------------------------------

    def _windows(self, found: dict) -> None:
        c, w = self.cfg, self.cfg.window
        ready = {k: t for k, t in self.tracks.items() if t.ready(w)}
        first = {k: _Track.mean(t.first) for k, t in ready.items()}
        recent = {k: _Track.mean(t.recent) for k, t in ready.items()}

        def spans(key: str) -> str:
            t = ready[key]
            return f"over {t.span('recent')}, against {first[key]:.3f} over {t.span('first')}"

        for key, name, frac, what in (("train/completion_len", "length_collapse", c.length_collapse,
                                       "mean completion length (tokens)"),
                                      ("train/neg_logprob", "entropy_collapse", c.entropy_collapse,
                                       "token entropy (mean -log p of the sampled tokens)")):
            if key in ready and collapse(first[key], recent[key], frac):
                found[name] = (name, f"{what} {recent[key]:.3f} {spans(key)}: {recent[key] / first[key]:.2f}x, below "
                                     f"run.health.{name}={frac}",
                               {"recent": recent[key], "first": first[key], "ratio": recent[key] / first[key]})
        key = "health/infra_share"
        if key in ready and climb(first[key], recent[key], c.infra_rise):
            found["infra_errors"] = ("infra_errors", f"infrastructure-error share of rollout samples {recent[key]:.3f} "
                                                     f"{spans(key)}: up {recent[key] - first[key]:.3f} "
                                                     f"(run.health.infra_rise={c.infra_rise})",
                                     {"recent": recent[key], "first": first[key]})
        for key, (what, knob) in IS_METRICS.items():
            rise = getattr(c, knob)
            if key in ready and climb(first[key], recent[key], rise):
                found[f"is_ratio:{key}"] = ("is_ratio", f"{what} {recent[key]:.3f} {spans(key)}: up "
                                                        f"{recent[key] - first[key]:.3f} (run.health.{knob}={rise})",
                                            {"metric": key, "recent": recent[key], "first": first[key]})
        for dom in sorted(k[len("reward/"):-len("/total")] for k in ready if k.startswith("reward/")
                          and k.endswith("/total")):
            pre = f"reward/{dom}/"
            coefs = layer_coefficients(self.reward, dom)
            f = {k[len(pre):]: v for k, v in first.items() if k.startswith(pre)}
            r = {k[len(pre):]: v for k, v in recent.items() if k.startswith(pre)}
            for layer, vals in non_correctness_gain(f, r, coefs, c.layer_min_gain, c.layer_gain_share):
                t = ready[pre + "total"]
                found[f"non_correctness_gain:{dom}/{layer}"] = ("non_correctness_gain", (
                    f"{dom}: reward layer '{layer}' gave {vals['layer_gain']:+.3f} of the {vals['gain']:+.3f} "
                    f"reward gain ({100 * vals['share']:.0f}%) from {t.span('first')} to {t.span('recent')}; it is "
                    f"not a correctness layer (run.health.layer_gain_share={c.layer_gain_share})"),
                    {"domain": dom, "layer": layer, **vals})

    def _memory(self, step: int, metrics: Mapping[str, float], found: dict) -> None:
        peaks = {k: float(metrics[k]) for k in PEAK_METRICS if isinstance(metrics.get(k), (int, float))}
        if not peaks:
            return
        key = max(peaks, key=peaks.__getitem__)
        peak, limit, frac = peaks[key], self.memory_limit_mb, self.cfg.memory_fraction
        if memory_pressure(peak, limit, frac):
            assert limit is not None
            phase = "rollout" if key.startswith("rollout/") else "update"
            found["memory_pressure"] = ("memory_pressure", (
                f"peak resident memory {peak / 1024:.1f} GB in step {step}'s {phase} is {100 * peak / limit:.0f}% of the "
                f"{limit / 1024:.1f} GB this process may hold (run.health.memory_fraction={frac}); a longer batch may be "
                f"killed by the kernel. Lower it with {MEMORY_KNOBS}"),
                {"peak_mb": peak, "limit_mb": limit, "share": peak / limit, "metric": key})

    def _fire(self, step: int, found: dict[str, tuple[str, str, dict]], heldout: bool) -> list[dict]:
        """Events for the conditions that just became true. The conditions of this check (the held-out
        one, or the window ones) that are no longer true re-arm."""
        new = [k for k in found if k not in self.active]
        self.active = {k for k in self.active if k.startswith("heldout_drop") != heldout} | set(found)
        return [{"step": step, "name": found[k][0], "severity": "halt" if found[k][0] in self.halt_on else "warn",
                 "message": found[k][1], "values": found[k][2]} for k in sorted(new)]

    # --- persistence -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"tracks": {k: {"first": t.first, "recent": t.recent} for k, t in self.tracks.items()},
                "active": sorted(self.active), "best": self.best, "pending": self.pending}

    def load_state_dict(self, sd: dict | None) -> None:
        """Restore (None: a checkpoint of an older honing without one: the windows start again)."""
        if not sd:
            return
        self.tracks = {k: _Track([tuple(x) for x in t["first"]], [tuple(x) for x in t["recent"]])
                       for k, t in sd.get("tracks", {}).items()}
        self.active = set(sd.get("active", []))
        self.best, self.pending = sd.get("best"), sd.get("pending")
