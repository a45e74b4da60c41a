"""The report's tables: the run's health and scheduling events (read from state.sqlite), per-domain
evaluation tables with CIs, the run's own held-out table per domain, and the regression check between
two evaluations. HTML fragments; honing.eval.report puts them on the page."""

from __future__ import annotations

import html
import json
import sqlite3
from pathlib import Path
from typing import Any, Optional, Sequence


def read_health(run: Optional[Path], summary: Optional[dict]) -> list[dict]:
    """The run-health events: state.sqlite's `health_events` (read-only; a run of an older honing has
    none), else summary.json's `health_events`."""
    path = run / "state.sqlite" if run is not None else None
    if path is not None and path.is_file():
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                return [{"step": s, "name": n, "severity": sev, "message": m, "values": json.loads(v), "at": at}
                        for s, n, sev, m, v, at in db.execute(
                            "SELECT step, name, severity, message, values_json, at FROM health_events ORDER BY id")]
            finally:
                db.close()
        except (sqlite3.Error, ValueError):
            pass
    return [e for e in (summary or {}).get("health_events") or [] if isinstance(e, dict)]


def read_schedule_events(run: Optional[Path]) -> list[dict]:
    """The scheduler's decisions (state.sqlite `events` of kind `weight` or `level`: a regression guard's
    weight change, a curriculum step), oldest first; [] without a state file."""
    path = run / "state.sqlite" if run is not None else None
    if path is None or not path.is_file():
        return []
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT step, detail FROM events WHERE kind IN ('weight', 'level') ORDER BY id").fetchall()
        finally:
            db.close()
        return [{"step": st, **json.loads(d)} for st, d in rows]
    except (sqlite3.Error, ValueError):
        return []


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else html.escape(str(v))


def schedule_events_table(events: Sequence[dict]) -> str:
    if not events:
        return ""
    rows = "".join(f"<tr><td>{e.get('step')}</td><td>{html.escape(str(e.get('domain')))}</td>"
                   f"<td>{html.escape(str(e.get('kind')))}</td><td>{_value(e.get('old'))} → {_value(e.get('new'))}</td>"
                   f"<td>{html.escape(str(e.get('reason', '')))}</td></tr>"
                   for e in events)
    return ("<table class=metrics><thead><tr><th>step</th><th>domain</th><th>what</th><th>change</th><th>why</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def health_table(events: Sequence[dict]) -> Optional[str]:
    if not events:
        return None
    rows = "".join(
        f"<tr><td>{e.get('step')}{' (final eval)' if e.get('at') == 'final_eval' else ''}</td>"
        f"<td>{html.escape(str(e.get('name')))}</td>"
        f"<td class='{'bad' if e.get('severity') == 'halt' else ''}'>{html.escape(str(e.get('severity')))}</td>"
        f"<td>{html.escape(str(e.get('message')))}</td></tr>" for e in events)
    return ("<p>Warning signs raised while the run trained (honing.schedule.health; thresholds in "
            "<code>run.health</code>, severity <code>halt</code> for events in <code>run.halt_on</code>).</p>"
            "<table class=metrics><thead><tr><th>step</th><th>event</th><th>severity</th><th>what</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


# --- evaluations ------------------------------------------------------------------------------------
def _cell(v: Any, ci: Any = None) -> str:
    if v is None:
        return "–"
    s = f"{v:.3f}"
    if ci:
        s += f" <span class=ci>[{ci[0]:.2f}, {ci[1]:.2f}]</span>"
    return s


def eval_table(e: dict) -> str:
    k = int(e.get("meta", {}).get("samples_per_task", 1))
    head = ["domain", "tasks", "pass@1", f"pass@{k}", f"maj@{k}", "mean reward", "infra errors"]
    rows = sorted(e["domains"].items())
    if len(rows) > 1 and e.get("overall"):
        rows.append(("all", e["overall"]))
    body = []
    for d, m in rows:
        ci = m.get("ci", {})
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
            html.escape(d), m.get("n_tasks", ""), _cell(m.get("pass@1"), ci.get("pass@1")),
            _cell(m.get(f"pass@{k}"), ci.get(f"pass@{k}")), _cell(m.get(f"maj@{k}"), ci.get(f"maj@{k}")),
            _cell(m.get("mean_reward"), ci.get("mean_reward")), m.get("infra_errors", 0))) + "</tr>")
    return ("<table class=metrics><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def difficulty_table(e: dict) -> str:
    """pass@1 per difficulty level of each domain that has more than one level."""
    rows = []
    for d, levels in sorted((e.get("difficulty") or {}).items()):
        for lv, m in levels.items():
            rows.append(f"<tr><td>{html.escape(d)}</td><td>{html.escape(lv)}</td><td>{m.get('n_tasks', '')}</td>"
                        f"<td>{_cell(m.get('pass@1'), (m.get('ci') or {}).get('pass@1'))}</td></tr>")
    if not rows:
        return ""
    return ("<table class=metrics><thead><tr><th>domain</th><th>difficulty</th><th>tasks</th><th>pass@1</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def heldout_domain_table(summary: Optional[dict]) -> str:
    """The run's own held-out evaluations per domain (summary.json heldout_ci's per_domain): pass@1 with its
    95% CI at each stage and the paired change of the last stage; a change whose CI is wholly below 0
    (over enough independent tasks) is marked REGRESSION."""
    from honing.eval.metrics import domain_rows

    rows = domain_rows((summary or {}).get("heldout_ci") or {})
    if not rows:
        return ""
    stages = list(dict.fromkeys(k for r in rows for k in r["pass@1"]))
    changes = list(dict.fromkeys(k for r in rows for k in r["changes"]))
    body = []
    for r in rows:
        cells = [f"<td>{_cell(r['pass@1'][k][0], r['pass@1'][k][1:])}</td>" if k in r["pass@1"] else "<td>–</td>"
                 for k in stages]
        for k in changes:
            x = r["changes"].get(k)
            cls = "bad" if x and x[2] < 0 else ("good" if x and x[1] > 0 else "")
            cells.append(f"<td class='{cls}'>{x[0]:+.3f} <span class=ci>[{x[1]:+.2f}, {x[2]:+.2f}]</span></td>" if x
                         else "<td>–</td>")
        body.append(f"<tr><td>{html.escape(r['domain'])}</td><td>{r['tasks']}</td>{''.join(cells)}"
                    f"<td class=bad>{'REGRESSION' if r['regressed'] else ''}</td></tr>")
    return ("<table class=metrics><thead><tr><th>domain</th><th>tasks</th>"
            + "".join(f"<th>{html.escape(k)}</th>" for k in stages + changes) + "<th></th></tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def compare_html(a: tuple[str, dict], b: tuple[str, dict]) -> str:
    from honing.eval.compare import compare

    c = compare(a[1], b[1])
    k = c["k"]
    metrics = ["pass@1"] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
    rows = []
    for d, row in c["domains"].items():
        cells = []
        flag = ""
        for m in metrics:
            x = row.get(m)
            if not x:
                cells.append("<td>–</td>")
                continue
            cls = "bad" if x["significant"] and x["hi"] < 0 else ("good" if x["significant"] else "")
            if cls == "bad" and d != "all":
                flag = "REGRESSION"
            cells.append(f"<td class='{cls}'>{x['a']:.3f} → {x['b']:.3f} ({x['delta']:+.3f} "
                         f"<span class=ci>[{x['lo']:+.2f}, {x['hi']:+.2f}]</span>)</td>")
        rows.append(f"<tr><td>{html.escape(d)}</td><td>{row['n_tasks']}</td>{''.join(cells)}"
                    f"<td class=bad>{flag}</td></tr>")
    notes = "".join(f"<p class=note>{html.escape(w)}</p>" for w in c["warnings"])
    return (f"<p>{html.escape(b[0])} vs {html.escape(a[0])}: delta with 95% paired bootstrap CI over "
            f"{c['shared_tasks']} shared tasks.</p>{notes}<table class=metrics><thead><tr><th>domain</th><th>tasks</th>"
            + "".join(f"<th>{m}</th>" for m in metrics) + "<th></th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")
