"""The HTML shell of report.html: style and the trajectory browser's script (no external files).

Placeholders: {{TITLE}}, {{BODY}} (sections built by honing.eval.report) and {{DATA}} (inline
JSON: {"trajectories": [...]}, each a per-sample record of an evaluation plus its prompt).
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<link rel="icon" href="data:,">
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1rem 1.5rem 4rem; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
h3 { font-size: 1rem; margin-bottom: .3rem; }
.facts li { margin: .1rem 0; }
.plot svg { max-width: 100%; height: auto; }
table.metrics { border-collapse: collapse; margin: .4rem 0 1rem; }
table.metrics th, table.metrics td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: right; }
table.metrics th:first-child, table.metrics td:first-child { text-align: left; }
table.metrics th { background: #f4f4f6; }
.ci { color: #777; font-size: .85em; }
.good { background: #e8f6ea; } .bad { background: #fdeaea; color: #a00; font-weight: 600; }
.note { color: #8a6d00; }
.filters { display: flex; gap: 1rem; flex-wrap: wrap; align-items: center; margin-bottom: .5rem; }
.filters input { width: 4.5rem; }
.browser { display: grid; grid-template-columns: minmax(260px, 1fr) 2fr; gap: 1rem; }
#traj-list { max-height: 70vh; overflow: auto; border: 1px solid #ddd; border-radius: 4px; }
.traj { padding: .35rem .6rem; border-bottom: 1px solid #eee; cursor: pointer; font-size: .9em; }
.traj:hover { background: #f3f6fb; } .traj.sel { background: #dfe9f8; }
.traj .id { font-family: ui-monospace, monospace; }
.badge { display: inline-block; padding: 0 .4rem; border-radius: 3px; font-size: .8em; margin-right: .3rem; }
.badge.pass { background: #d8f0dc; color: #135c22; } .badge.fail { background: #f6dcdc; color: #8a1a1a; }
.badge.infra { background: #f3e6c4; color: #6b5000; } .badge.trunc { background: #e6e6e6; color: #444; }
#traj-view { border: 1px solid #ddd; border-radius: 4px; padding: .6rem .9rem; max-height: 70vh; overflow: auto; }
.msg { border-left: 3px solid #ccc; padding: .2rem .6rem; margin: .5rem 0; }
.msg.user { border-color: #1f77b4; } .msg.system { border-color: #999; } .msg.assistant { border-color: #2ca02c; }
.msg.observation { border-color: #ff7f0e; } .msg.verdict { border-color: #9467bd; }
.msg .role { font-size: .8em; color: #666; text-transform: uppercase; letter-spacing: .04em; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2rem 0; font: 12.5px/1.4 ui-monospace, monospace; }
.hint { color: #777; }
</style></head>
<body>
{{BODY}}
<script type="application/json" id="report-data">{{DATA}}</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var trajs = data.trajectories || [];
  var list = document.getElementById("traj-list");
  if (!list) { return; }
  var view = document.getElementById("traj-view");
  var fDomain = document.getElementById("f-domain"), fResult = document.getElementById("f-result");
  var fStatus = document.getElementById("f-status"), fReward = document.getElementById("f-reward");
  var count = document.getElementById("f-count");

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function options(select, values) {
    values.forEach(function (v) { var o = el("option", "", v); o.value = v; select.appendChild(o); });
  }
  function uniq(key) {
    var seen = {}; trajs.forEach(function (t) { seen[t[key]] = 1; }); return Object.keys(seen).sort();
  }
  options(fDomain, uniq("domain"));
  options(fStatus, uniq("status"));

  function badges(t) {
    var span = el("span");
    var s = t.status === "infra_error" ? ["infra", "infra error"] : (t.passed ? ["pass", "pass"] : ["fail", "fail"]);
    span.appendChild(el("span", "badge " + s[0], s[1]));
    if (t.finish_reason === "length") { span.appendChild(el("span", "badge trunc", "truncated")); }
    return span;
  }
  function message(role, text, title) {
    var d = el("div", "msg " + role);
    d.appendChild(el("div", "role", title || role));
    d.appendChild(el("pre", "", text));
    return d;
  }
  function show(i, row) {
    var t = trajs[i];
    Array.prototype.forEach.call(list.querySelectorAll(".traj.sel"), function (r) { r.classList.remove("sel"); });
    if (row) { row.classList.add("sel"); }
    view.textContent = "";
    var h = el("h3", "", t.task_id + "  #" + t.sample);
    view.appendChild(h);
    var meta = el("div");
    meta.appendChild(badges(t));
    meta.appendChild(el("span", "", " " + t.domain + " · score " + Number(t.score).toFixed(3) +
                        " · " + (t.n_tokens || 0) + " tokens · " + t.eval));
    view.appendChild(meta);
    (t.prompt || []).forEach(function (m) { view.appendChild(message(m.role, m.content)); });
    if (t.turns && t.turns.length) {
      t.turns.forEach(function (turn) {
        var title = "assistant · turn " + (turn.index + 1) + (turn.tool ? " · tool " + turn.tool : "") +
                    (turn.ok === false ? " · error" : "");
        var d = message("assistant", turn.action, title);
        d.classList.add("turn");
        view.appendChild(d);
        if (turn.observation) { view.appendChild(message("observation", turn.observation, "observation")); }
      });
    } else {
      var d = message("assistant", t.text, "assistant · turn 1");
      d.classList.add("turn");
      view.appendChild(d);
    }
    var v = "passed: " + t.passed + "\nscore: " + t.score + "\nstatus: " + t.status +
            (t.stop_reason ? "\nstop: " + t.stop_reason : "") + "\nextracted answer: " + t.answer +
            "\ncomponents: " + JSON.stringify(t.components || {}) +
            (t.reward_layers && Object.keys(t.reward_layers).length ? "\nreward layers: " + JSON.stringify(t.reward_layers) : "") +
            "\ndetails: " + (t.details || "");
    view.appendChild(message("verdict", v, "verdict"));
  }
  function render() {
    var d = fDomain.value, r = fResult.value, s = fStatus.value, m = parseFloat(fReward.value) || 0;
    list.textContent = "";
    var n = 0;
    trajs.forEach(function (t, i) {
      if (d && t.domain !== d) { return; }
      if (s && t.status !== s) { return; }
      if (r === "pass" && !t.passed) { return; }
      if (r === "fail" && t.passed) { return; }
      if ((Number(t.score) || 0) < m) { return; }
      n += 1;
      var row = el("div", "traj");
      row.dataset.index = i;
      row.appendChild(badges(t));
      row.appendChild(el("span", "id", t.task_id + " #" + t.sample));
      row.addEventListener("click", function () { show(i, row); });
      list.appendChild(row);
    });
    count.textContent = n + " of " + trajs.length + " shown";
  }
  [fDomain, fResult, fStatus, fReward].forEach(function (e) { e.addEventListener("input", render); });
  render();
})();
</script>
</body></html>
"""
