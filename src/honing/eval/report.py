"""`honing report`: one self-contained report.html for a run directory or an evaluation JSON.

Sections (each only when its data exists): reward and held-out pass@1 over steps, per-domain
reward over steps, the run-health monitor's events (state.sqlite's `health_events`, else
summary.json's), the run's own held-out pass@1 per domain at each stage with paired CIs
(a mixed run), layer-by-layer reward (`reward/<domain>/<layer>` in metrics.jsonl),
throughput and time split with the scheduler's weight and curriculum changes, per-domain evaluation
tables with CIs, a comparison of the first and last evaluation, pass@k curves (every evaluation, so before/after overlay), and a
trajectory browser over every graded training trajectory in the run's shards
(`trajectories/*.parquet`) and the evaluations' per-sample records (honing.eval.report_data).
The tables are built in honing.eval.report_tables.

Plots are inline SVG (matplotlib, Agg); the browser's data is inline gzip+base64 JSON that the
page decompresses itself; nothing is fetched when the file is opened. Evaluations of a run are
read from `<run>/eval/*.json` (where `honing eval --model runs/<name>` writes them) plus any
given with `--eval`.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence

from honing.errors import HoningError
from honing.eval.report_data import TRAINING, BrowserData, browser_data, encode
from honing.eval.report_tables import (compare_html, difficulty_table, eval_table, health_table, heldout_domain_table,
                                       read_health, read_schedule_events, schedule_events_table)
from honing.eval.report_page import PAGE


# --- inputs ---------------------------------------------------------------------------------------
def read_metrics(path: Path) -> list[dict]:
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: the rest is still worth showing
    return rows


def _series(rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
            xs.append(r.get("step", len(xs)))
            ys.append(float(v))
    return xs, ys


# --- plots ----------------------------------------------------------------------------------------
def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _fig(n: int = 1, width: float = 7.5, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text (smaller, searchable)
    fig, axes = plt.subplots(1, n, figsize=(width * (1 if n == 1 else 0.55 * n), height), squeeze=False)
    return fig, axes[0]


def plot_training(rows: Sequence[dict]) -> Optional[str]:
    """Mean training reward and held-out pass@1 (overall and per domain when logged) over steps."""
    xs, ys = _series(rows, "train/reward")
    hx, hy = _series(rows, "heldout/pass@1")
    if not xs and not hx:
        return None
    fig, (ax,) = _fig()
    if xs:
        ax.plot(xs, ys, color="#999", lw=1, label="train reward")
        w = max(1, len(ys) // 20)
        if w > 1:
            sm = [sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1]) for i in range(len(ys))]
            ax.plot(xs, sm, color="#1f77b4", lw=2, label=f"train reward ({w}-step mean)")
    if hx:
        ax.plot(hx, hy, "o-", color="#d62728", lw=2, label="held-out pass@1")
    doms = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("heldout/") and k.endswith("/pass@1")
                   and k.count("/") == 2})
    for d in doms:
        dx, dy = _series(rows, f"heldout/{d}/pass@1")
        ax.plot(dx, dy, "o--", lw=1, label=f"held-out {d}")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("reward and held-out pass@1")
    return _svg(fig)


def _layers(rows: Sequence[dict]) -> dict[str, list[str]]:
    by: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        for k in r:
            parts = k.split("/")
            if len(parts) >= 3 and parts[0] == "reward":
                by["/".join(parts[1:-1])].add(parts[-1])
    return {d: sorted(ls, key=lambda x: (x != "total", x)) for d, ls in sorted(by.items())}


def plot_layers(rows: Sequence[dict]) -> Optional[str]:
    """One panel per domain: each reward layer's mean over steps (and the total)."""
    layers = _layers(rows)
    if not layers:
        return None
    n = len(layers)
    cols = min(n, 3)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4.2 * cols, 2.8 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (dom, names) in zip(axes.flat, layers.items()):
        for name in names:
            x, y = _series(rows, f"reward/{dom}/{name}")
            ax.plot(x, y, lw=2.2 if name == "total" else 1.2, label=name)
        ax.set_title(dom, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("reward by layer")
    return _svg(fig)


def plot_time(rows: Sequence[dict]) -> Optional[str]:
    """Seconds per step split into generation, policy update and the rest; samples/s."""
    sx, step = _series(rows, "time/step_s")
    if not sx:
        return None
    by_step = {r.get("step"): r for r in rows if "time/step_s" in r}
    gen = [float(by_step[s].get("time/gen_s", 0.0)) for s in sx]
    upd = [float(by_step[s].get("train/update_s", 0.0)) for s in sx]
    rest = [max(0.0, t - g - u) for t, g, u in zip(step, gen, upd)]
    fig, (a1, a2) = _fig(2)
    a1.stackplot(sx, gen, upd, rest, labels=["generate", "update", "verify + other"], alpha=0.8)
    a1.set_xlabel("step")
    a1.set_ylabel("seconds")
    a1.legend(fontsize=8, loc="upper left")
    a1.set_title("time per step")
    tx, tp = _series(rows, "time/samples_per_s")
    a2.plot(tx, tp, color="#2ca02c")
    a2.set_xlabel("step")
    a2.set_title("samples / s")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return _svg(fig)


def plot_schedule(rows: Sequence[dict]) -> Optional[str]:
    """Domain mixing weights (and curriculum levels) over steps; each side's idle time and staleness."""
    weights = sorted({k for r in rows for k in r if k.startswith("sched/weight/")})
    if not weights:
        return None
    fig, (a1, a2) = _fig(2)
    for k in weights:
        x, y = _series(rows, k)
        line = a1.plot(x, y, label=k.removeprefix("sched/weight/"))[0]
        lx, ly = _series(rows, "sched/level/" + k.removeprefix("sched/weight/"))
        if ly and max(ly) > 0:
            a1.step(lx, [v / max(ly) for v in ly], where="post", ls=":", color=line.get_color(), alpha=0.7)
    a1.set_title("domain weight (dotted: curriculum level)")
    a1.set_xlabel("step")
    a1.legend(fontsize=7, loc="best")
    for key, label in (("time/wait_s", "trainer waits (s)"), ("worker/idle_s", "worker idle (s)")):
        x, y = _series(rows, key)
        if x:
            a2.plot(x, y, label=label)
    x, y = _series(rows, "staleness/mean")
    if x and max(y) > 0:
        a2.plot(x, y, label="mean staleness (versions)", ls="--")
    a2.set_title("idle time and staleness")
    a2.set_xlabel("step")
    a2.legend(fontsize=7, loc="best")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return _svg(fig)


def plot_passk(evals: Sequence[tuple[str, dict]]) -> Optional[str]:
    """pass@k against k (log2 axis) per domain; each evaluation its own line style."""
    doms = sorted({d for _, e in evals for d, m in e["domains"].items() if m.get("pass@k_curve")})
    if not doms:
        return None
    fig, (ax,) = _fig(1, 7.5, 3.6)
    styles = ["-", "--", ":", "-."]
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, (name, e) in enumerate(evals):
        for i, d in enumerate(doms):
            curve = e["domains"].get(d, {}).get("pass@k_curve")
            if not curve:
                continue
            ks = sorted(int(k) for k in curve)
            ax.plot(ks, [curve[str(k)] for k in ks], styles[j % len(styles)], marker="o", ms=3,
                    color=colors[i % len(colors)], label=f"{d} ({name})" if len(evals) > 1 else d)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("pass@k curves")
    return _svg(fig)


# --- trajectories ---------------------------------------------------------------------------------
BROWSER = """<section id='browser'><h2>Trajectories</h2>{notes}<div class=filters>
<label id=l-source>source <select id=f-source><option value=''>all</option></select></label>
<label id=l-step>step <input id=f-step-min type=number step=1 placeholder=from> – <input id=f-step-max type=number
 step=1 placeholder=to></label>
<label>domain <select id=f-domain><option value=''>all</option></select></label>
<label>verdict <select id=f-verdict><option value=''>all</option><option value='pass'>pass</option>
<option value='fail'>fail</option><option value='infra'>infra error</option><option value='none'>no verdict</option>
</select></label>
<label id=l-use>training use <select id=f-use><option value=''>all</option></select></label>
<label>reward <input id=f-reward-min type=number step=0.1 placeholder=min> – <input id=f-reward-max type=number
 step=0.1 placeholder=max></label>
<label class=search>search <input id=f-search type=search placeholder='task, prompt, completion, details'></label>
</div>
<div class=pager><span id=f-count>loading {n:,} trajectories…</span><span class=pg>
<button id=pg-first type=button>«</button><button id=pg-prev type=button>‹ prev</button><span id=pg-info></span>
<button id=pg-next type=button>next ›</button><button id=pg-last type=button>»</button>
<select id=f-pagesize><option>25</option><option selected>50</option><option>100</option><option>200</option>
</select> per page</span></div>
<table id=traj-table><thead><tr><th data-key=v>verdict</th><th data-key=s class=c-source>source</th>
<th data-key=st>step</th><th data-key=d>domain</th><th data-key=task>task</th><th data-key=r class=num>reward</th>
<th data-key=a class=num>advantage</th><th data-key=tu class=num>turns</th><th data-key=nt class=num>tokens</th>
<th>completion</th></tr></thead><tbody id=traj-list></tbody></table>
<p class=hint>Click a trajectory to expand its prompt, completion or turns, and verdict; click a column to sort.</p>
</section>"""


def browser_section(data: BrowserData) -> str:
    notes = "".join(f"<p class='note traj-note'>{html.escape(n)}</p>" for n in data.notes)
    return BROWSER.format(notes=notes, n=len(data.rows))


# --- the page -------------------------------------------------------------------------------------
def _section(title: str, body: Optional[str], sid: str) -> str:
    if not body:
        return ""
    return f"<section id='{sid}'><h2>{html.escape(title)}</h2>{body}</section>"


def _figure(svg: Optional[str], cls: str) -> Optional[str]:
    return f"<div class='plot {cls}'>{svg}</div>" if svg else None


def build_html(title: str, rows: Sequence[dict], evals: Sequence[tuple[str, dict]], summary: Optional[dict],
               config_text: str = "", run: Optional[Path] = None) -> str:
    parts = [f"<h1>{html.escape(title)}</h1>"]
    facts = []
    if summary:
        b, a = summary.get("heldout_before") or {}, summary.get("heldout_after") or {}
        if "pass@1" in b and "pass@1" in a:
            facts.append(f"held-out pass@1 {b['pass@1']:.3f} → {a['pass@1']:.3f}")
        for k, label in (("steps", "steps"), ("wall_s", "wall s"), ("samples_per_s", "samples/s")):
            if isinstance(summary.get(k), (int, float)):
                facts.append(f"{label} {summary[k]:.4g}")
    for name, e in evals:
        m = e.get("meta", {})
        facts.append(f"eval {html.escape(name)}: {html.escape(str(m.get('model')))} on "
                     f"{html.escape(str(m.get('suite')))}@v{m.get('suite_version')}, {m.get('n_tasks')} tasks × "
                     f"{m.get('samples_per_task')} samples" + (" (INCOMPLETE)" if m.get("incomplete") else ""))
    parts.append(_section("Training", _figure(plot_training(rows), "training"), "training"))
    health = read_health(run, summary)
    if health:
        names = ", ".join(sorted({str(e.get("name")) for e in health}))
        facts.append(f"{len(health)} health event(s): {html.escape(names)}")
    parts.append(_section("Run health", health_table(health), "health"))
    parts.append(_section("Held-out by domain (this run's evaluations, 95% bootstrap CIs)",
                          heldout_domain_table(summary), "heldout-domains"))
    parts.append(_section("Reward by layer", _figure(plot_layers(rows), "layers"), "layers"))
    parts.append(_section("Throughput and time split", _figure(plot_time(rows), "time"), "time"))
    sched = plot_schedule(rows)
    sched_events = schedule_events_table(read_schedule_events(run))
    if sched or sched_events:
        parts.append(_section("Scheduling", (_figure(sched, "schedule") or "") + sched_events, "schedule"))
    tables = "".join(f"<h3>{html.escape(n)}</h3>{eval_table(e)}{difficulty_table(e)}" for n, e in evals)
    parts.append(_section("Per-domain evaluation (95% bootstrap CIs)", tables, "domains"))
    if len(evals) >= 2:
        parts.append(_section("Regression check (first vs last evaluation)", compare_html(evals[0], evals[-1]),
                              "compare"))
    parts.append(_section("pass@k", _figure(plot_passk(evals), "passk"), "passk"))
    data = browser_data(run, evals, summary)
    if data.rows:
        n_train = sum(1 for r in data.rows if data.sources[r["s"]] == TRAINING)
        if n_train:
            facts.append(f"{n_train:,} graded training trajectories")
        parts.append(browser_section(data))
    if config_text:
        parts.append(f"<section id='config'><h2>Config</h2><details><summary>config.yaml</summary><pre>"
                     f"{html.escape(config_text)}</pre></details></section>")
    if facts:
        parts.insert(1, "<ul class=facts>" + "".join(f"<li>{f}</li>" for f in facts) + "</ul>")
    fill = {"TITLE": html.escape(title), "BODY": "".join(p for p in parts if p), "DATA": encode(data.payload())}
    return re.sub(r"\{\{(TITLE|BODY|DATA)\}\}", lambda m: fill[m.group(1)], PAGE)  # one pass: no text is re-read


def _eval_name(path: Path, e: dict) -> str:
    m = e.get("meta", {})
    return f"{path.stem}" if not m.get("model") else f"{path.stem} ({Path(str(m['model'])).name})"


def write_report(target: Path, out: Optional[Path] = None, extra_evals: Sequence[Path] = ()) -> Path:
    """Write the report for a run directory or an evaluation JSON; returns the HTML path."""
    from honing.eval.runner import load_result

    target = Path(target)
    rows: list[dict] = []
    summary, config_text = None, ""
    run: Optional[Path] = None
    eval_paths: list[Path] = []
    if target.is_dir():
        if not any((target / f).exists() for f in ("metrics.jsonl", "config.yaml", "summary.json", "eval",
                                                   "trajectories")):
            raise HoningError(f"{target} is not a run directory "
                              "(no metrics.jsonl, config.yaml, trajectories/ or eval/)")
        run = target
        rows = read_metrics(target / "metrics.jsonl")
        if (target / "summary.json").is_file():
            try:
                summary = json.loads((target / "summary.json").read_text())
            except json.JSONDecodeError:
                summary = None
        if (target / "config.yaml").is_file():
            config_text = (target / "config.yaml").read_text()
        eval_paths = sorted((target / "eval").glob("*.json"), key=lambda p: p.stat().st_mtime) \
            if (target / "eval").is_dir() else []
        out = out or target / "report.html"
        title = f"honing report: {target.name}"
    elif target.is_file():
        eval_paths = [target]
        out = out or target.with_suffix(".html")
        title = f"honing report: {target.name}"
    else:
        raise HoningError(f"report target not found: {target} (give a run directory or an evaluation JSON)")
    eval_paths += [Path(p) for p in extra_evals]
    evals = [(_eval_name(p, e), e) for p in eval_paths for e in [load_result(p)]]
    has_shards = run is not None and any((run / "trajectories").glob("*.parquet"))
    if not rows and not evals and not summary and not has_shards:
        raise HoningError(f"{target}: nothing to report yet (no metrics, summary or evaluations)")
    from honing.schedule.runlog import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, build_html(title, rows, evals, summary, config_text, run))
    return out
