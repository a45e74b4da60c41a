"""The HTML shell of report.html: style and the trajectory browser's script (no external files).

Placeholders: {{TITLE}}, {{BODY}} (sections built by honing.eval.report) and {{DATA}} (the
browser's payload, gzip + base64, see honing.eval.report_data: {"sources", "tasks", "rows",
"notes", "cap"}). The script decompresses it with DecompressionStream, then filters, sorts and
pages over the rows in memory; a row expands in place to its prompt, turns and verdict. When
it is done, `#traj-list` gets `data-ready="1"` and `window.reportTiming` holds
{decode_ms, render_ms, rows}.

Row keys: s source, st step, d domain, t task (index into tasks: id, p prompt, ref), g group,
j sample, r reward, a advantage, v verdict label (pass/fail/infra/none), sc score, det details,
cmp components, ly reward layers, fr finish reason, sr stop reason, tc context truncated,
nt/np completion/prompt tokens, pv policy version, u training use, us step it was used at,
x completion, tu turns (k index, a action, o observation, tool, ok, pe parse error), ans
extracted answer, loc shard:row; `<key>_n` is a capped text's full length.
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<link rel="icon" href="data:,">
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
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
.filters { display: flex; gap: .6rem 1.1rem; flex-wrap: wrap; align-items: center; margin-bottom: .5rem; }
.filters input[type=number] { width: 4.2rem; } .filters .search input { width: 16rem; }
.pager { display: flex; justify-content: space-between; align-items: center; flex-wrap: wrap; gap: .5rem;
         margin: .3rem 0; }
.pager .pg { display: flex; gap: .3rem; align-items: center; } #pg-info { min-width: 7rem; text-align: center; }
#f-count { font-weight: 600; } #f-count .vc { font-weight: normal; color: #555; margin-left: .6rem; }
#traj-table { border-collapse: collapse; width: 100%; font-size: .9em; }
#traj-table th { background: #f4f4f6; text-align: left; padding: .3rem .45rem; border-bottom: 1px solid #ccc;
                 white-space: nowrap; user-select: none; }
#traj-table th[data-key] { cursor: pointer; } #traj-table th[data-key]:hover { background: #e8ebf2; }
#traj-table th.asc::after { content: " ▲"; font-size: .75em; } #traj-table th.desc::after { content: " ▼"; font-size: .75em; }
#traj-table td { padding: .25rem .45rem; border-bottom: 1px solid #eee; vertical-align: top; }
#traj-table .num { text-align: right; font-variant-numeric: tabular-nums; }
tr.traj { cursor: pointer; } tr.traj:hover { background: #f3f6fb; } tr.traj.sel { background: #dfe9f8; }
tr.traj td.task { font-family: ui-monospace, monospace; font-size: .95em; white-space: nowrap; }
tr.traj td.preview { font-family: ui-monospace, monospace; color: #444; max-width: 26rem; overflow: hidden;
                     text-overflow: ellipsis; white-space: nowrap; }
tr.detail > td { background: #fafbfd; padding: .5rem .9rem 1rem; border-bottom: 2px solid #c9d4e8; }
.hide-source .c-source { display: none; }
.badge { display: inline-block; padding: 0 .4rem; border-radius: 3px; font-size: .8em; margin-right: .3rem;
         white-space: nowrap; }
.badge.pass { background: #d8f0dc; color: #135c22; } .badge.fail { background: #f6dcdc; color: #8a1a1a; }
.badge.infra { background: #f3e6c4; color: #6b5000; } .badge.none { background: #e6e6e6; color: #444; }
.badge.trunc { background: #e6e6e6; color: #444; }
.meta { color: #444; margin: .2rem 0 .4rem; } .meta b { font-weight: 600; }
.msg { border-left: 3px solid #ccc; padding: .2rem .6rem; margin: .5rem 0; }
.msg.user { border-color: #1f77b4; } .msg.system { border-color: #999; } .msg.assistant { border-color: #2ca02c; }
.msg.observation { border-color: #ff7f0e; } .msg.verdict { border-color: #9467bd; }
.msg .role { font-size: .8em; color: #666; text-transform: uppercase; letter-spacing: .04em; }
.more { font-size: .85em; margin: .1rem 0 .3rem; } .cut { color: #8a6d00; font-size: .85em; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2rem 0; font: 12.5px/1.4 ui-monospace, monospace; }
.hint { color: #777; }
</style></head>
<body>
{{BODY}}
<script type="application/octet-stream" id="report-data" data-encoding="gzip+base64">{{DATA}}</script>
<script>
(function () {
  "use strict";
  var list = document.getElementById("traj-list");
  if (!list) { return; }
  var PREVIEW = 2000;
  var $ = function (id) { return document.getElementById(id); };
  var count = $("f-count"), table = $("traj-table");
  var t0 = performance.now();

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function load() {
    var node = $("report-data");
    var bin = atob(node.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)"));
    }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }

  load().then(start, function (err) {
    count.textContent = "the trajectory data could not be read: " + err.message;
    list.dataset.ready = "error";
  });

  function start(data) {
    var t1 = performance.now();
    var rows = data.rows || [], tasks = data.tasks || [], sources = data.sources || [];
    var fSource = $("f-source"), fDomain = $("f-domain"), fVerdict = $("f-verdict"), fUse = $("f-use");
    var fStepMin = $("f-step-min"), fStepMax = $("f-step-max"), fRMin = $("f-reward-min"), fRMax = $("f-reward-max");
    var fSearch = $("f-search"), fSize = $("f-pagesize");
    var matched = [], page = 0, sortKey = null, sortDir = 1, open = null;
    var LABEL = {pass: "pass", fail: "fail", infra: "infra error", none: "no verdict"};

    rows.forEach(function (r, i) { r.i = i; });
    function uniq(f) {
      var seen = {}; rows.forEach(function (r) { var v = f(r); if (v !== undefined && v !== null) { seen[v] = 1; } });
      return Object.keys(seen).sort();
    }
    function options(select, values, labels) {
      values.forEach(function (v) { var o = el("option", "", labels ? labels[v] : v); o.value = v; select.appendChild(o); });
    }
    var srcIdx = uniq(function (r) { return r.s; });
    options(fSource, srcIdx, sources);
    if (srcIdx.length < 2) { $("l-source").style.display = "none"; table.classList.add("hide-source"); }
    options(fDomain, uniq(function (r) { return r.d; }));
    var uses = uniq(function (r) { return r.u; });
    if (uses.length) { options(fUse, uses); } else { $("l-use").style.display = "none"; }
    if (!rows.some(function (r) { return r.st !== undefined; })) { $("l-step").style.display = "none"; }

    function task(r) { return tasks[r.t] || {id: "?"}; }
    function haystack(r) {
      if (r._h === undefined) {
        var t = task(r), parts = [t.id, r.d, r.x, r.det, r.ans, t.ref];
        (t.p || []).forEach(function (m) { parts.push(m.content); });
        (r.tu || []).forEach(function (u) { parts.push(u.a, u.o, u.tool); });
        r._h = parts.filter(function (p) { return p; }).join("\n").toLowerCase();
      }
      return r._h;
    }
    function num(input) { var v = parseFloat(input.value); return isNaN(v) ? null : v; }
    var SORT = {
      v: function (r) { return r.v; }, s: function (r) { return r.s; }, st: function (r) { return r.st; },
      d: function (r) { return r.d; }, task: function (r) { return task(r).id; }, r: function (r) { return r.r; },
      a: function (r) { return r.a; }, tu: function (r) { return (r.tu || []).length; },
      nt: function (r) { return r.nt; }
    };
    function cmp(a, b) {
      var f = SORT[sortKey], x = f(a), y = f(b);
      if (x === undefined || x === null) { return (y === undefined || y === null) ? a.i - b.i : 1; }
      if (y === undefined || y === null) { return -1; }
      return (x < y ? -1 : x > y ? 1 : a.i - b.i) * sortDir;
    }
    function filter() {
      var src = fSource.value, d = fDomain.value, v = fVerdict.value, u = fUse.value;
      var s0 = num(fStepMin), s1 = num(fStepMax), r0 = num(fRMin), r1 = num(fRMax);
      var q = fSearch.value.trim().toLowerCase();
      matched = rows.filter(function (r) {
        if (src !== "" && String(r.s) !== src) { return false; }
        if (d && r.d !== d) { return false; }
        if (v && r.v !== v) { return false; }
        if (u && r.u !== u) { return false; }
        if ((s0 !== null || s1 !== null) && r.st === undefined) { return false; }
        if (s0 !== null && r.st < s0) { return false; }
        if (s1 !== null && r.st > s1) { return false; }
        if ((r0 !== null || r1 !== null) && (r.r === undefined || r.r === null)) { return false; }
        if (r0 !== null && r.r < r0) { return false; }
        if (r1 !== null && r.r > r1) { return false; }
        if (q && haystack(r).indexOf(q) < 0) { return false; }
        return true;
      });
      if (sortKey) { matched.sort(cmp); }
      page = 0;
      open = null;
      render();
    }
    function fmt(x, n) { return (x === undefined || x === null) ? "–" : Number(x).toFixed(n); }
    function badges(r) {
      var span = el("span");
      span.appendChild(el("span", "badge " + r.v, LABEL[r.v] || r.v));
      if (r.fr === "length") { span.appendChild(el("span", "badge trunc", "truncated")); }
      if (r.tc) { span.appendChild(el("span", "badge trunc", "context cut")); }
      return span;
    }
    function preview(r) {
      var s = r.x;
      if (s === undefined && r.tu && r.tu.length) { s = r.tu[r.tu.length - 1].a; }
      s = (s || "").replace(/\s+/g, " ");
      return s.length > 140 ? s.slice(0, 140) + "…" : s;
    }
    function pages() { return Math.max(1, Math.ceil(matched.length / (parseInt(fSize.value, 10) || 50))); }
    function render() {
      var size = parseInt(fSize.value, 10) || 50, n = pages();
      if (page >= n) { page = n - 1; }
      list.textContent = "";
      open = null;
      var frag = document.createDocumentFragment();
      matched.slice(page * size, page * size + size).forEach(function (r) {
        var tr = el("tr", "traj");
        tr.dataset.index = r.i;
        tr.dataset.verdict = r.v;
        var c = el("td"); c.appendChild(badges(r)); tr.appendChild(c);
        tr.appendChild(el("td", "c-source", sources[r.s]));
        tr.appendChild(el("td", "num", r.st === undefined ? "–" : r.st));
        tr.appendChild(el("td", "", r.d));
        tr.appendChild(el("td", "task", task(r).id + (r.j !== undefined ? " #" + r.j : "")));
        tr.appendChild(el("td", "num", fmt(r.r, 3)));
        tr.appendChild(el("td", "num", fmt(r.a, 3)));
        tr.appendChild(el("td", "num", (r.tu || []).length || 1));
        tr.appendChild(el("td", "num", r.nt === undefined ? "–" : r.nt));
        tr.appendChild(el("td", "preview", preview(r)));
        tr.addEventListener("click", function () { toggle(r, tr); });
        frag.appendChild(tr);
      });
      list.appendChild(frag);
      var by = {pass: 0, fail: 0, infra: 0, none: 0};
      matched.forEach(function (r) { by[r.v] = (by[r.v] || 0) + 1; });
      count.textContent = matched.length.toLocaleString("en") + " of " + rows.length.toLocaleString("en") + " shown";
      var vc = el("span", "vc", ["pass", "fail", "infra", "none"].filter(function (k) { return by[k]; })
        .map(function (k) { return LABEL[k] + " " + by[k].toLocaleString("en"); }).join(" · "));
      count.appendChild(vc);
      $("pg-info").textContent = "page " + (page + 1) + " of " + n;
      $("pg-prev").disabled = $("pg-first").disabled = page === 0;
      $("pg-next").disabled = $("pg-last").disabled = page >= n - 1;
    }

    function block(cls, title, text, full) {
      var d = el("div", "msg " + cls);
      d.appendChild(el("div", "role", title));
      text = text || "";
      var pre = el("pre", "", text.length > PREVIEW ? text.slice(0, PREVIEW) + "…" : text);
      d.appendChild(pre);
      if (text.length > PREVIEW) {
        var b = el("button", "more", "show full text (" + text.length.toLocaleString("en") + " characters)");
        b.type = "button";
        b.addEventListener("click", function (ev) { ev.stopPropagation(); pre.textContent = text; b.remove(); });
        d.appendChild(b);
      }
      if (full && full > text.length) {
        d.appendChild(el("div", "cut", "… " + (full - text.length).toLocaleString("en") +
                         " more characters are not embedded in this page (see the trajectory shard)."));
      }
      return d;
    }
    function detail(r) {
      var box = el("div"), t = task(r);
      var meta = el("div", "meta");
      meta.appendChild(badges(r));
      var bits = [sources[r.s]];
      if (r.st !== undefined) { bits.push("step " + r.st + (r.us !== undefined ? " (trained at step " + r.us + ")" : "")); }
      bits.push(r.d, t.id + (r.g !== undefined ? " · group " + r.g : "") + (r.j !== undefined ? " · sample " + r.j : ""));
      if (r.r !== undefined) { bits.push("reward " + fmt(r.r, 4)); }
      if (r.a !== undefined) { bits.push("advantage " + fmt(r.a, 4)); }
      if (r.u) { bits.push("training use: " + r.u); }
      if (r.pv !== undefined) { bits.push("policy v" + r.pv); }
      if (r.nt !== undefined) { bits.push((r.np !== undefined ? r.np + " prompt + " : "") + r.nt + " completion tokens"); }
      if (r.fr) { bits.push("finish: " + r.fr); }
      if (r.sr) { bits.push("stop: " + r.sr); }
      if (r.loc) { bits.push("trajectories/" + r.loc); }
      meta.appendChild(el("span", "", bits.join(" · ")));
      box.appendChild(meta);
      if (t.p && t.p.length) {
        t.p.forEach(function (m) { box.appendChild(block(m.role, m.role, m.content, m.content_n)); });
      } else {
        box.appendChild(el("p", "hint", "prompt not recorded" + (r.np !== undefined ? " (" + r.np + " tokens)" : "")));
      }
      if (r.tu && r.tu.length) {
        r.tu.forEach(function (u, k) {
          var title = "assistant · turn " + ((u.k !== undefined ? u.k : k) + 1) + (u.tool ? " · tool " + u.tool : "") +
                      (u.ok === false ? " · error" : "") + (u.pe ? " · parse error" : "") + (u.fr ? " · " + u.fr : "");
          var d = block("assistant", title, u.a, u.a_n);
          d.classList.add("turn");
          box.appendChild(d);
          if (u.o) { box.appendChild(block("observation", "observation" + (u.ot ? " (truncated)" : ""), u.o, u.o_n)); }
        });
      } else {
        var d = block("assistant", "assistant · completion", r.x, r.x_n);
        d.classList.add("turn");
        box.appendChild(d);
      }
      var v = "verdict: " + (LABEL[r.v] || r.v) + (r.sc !== undefined ? "\nscore: " + r.sc : "") +
              (t.ref !== undefined ? "\nreference answer: " + t.ref : "") +
              (r.ans !== undefined ? "\nextracted answer: " + r.ans : "") +
              (r.cmp ? "\ncomponents: " + JSON.stringify(r.cmp) : "") +
              (r.ly ? "\nreward layers: " + JSON.stringify(r.ly) : "") +
              (r.det ? "\ndetails: " + r.det : "");
      box.appendChild(block("verdict", "verdict", v, r.det_n ? v.length + r.det_n - (r.det || "").length : 0));
      return box;
    }
    function toggle(r, tr) {
      var was = open;
      Array.prototype.forEach.call(list.querySelectorAll("tr.detail"), function (x) { x.remove(); });
      Array.prototype.forEach.call(list.querySelectorAll("tr.traj.sel"), function (x) { x.classList.remove("sel"); });
      open = null;
      if (was === r.i) { return; }
      var row = el("tr", "detail"), td = el("td");
      td.colSpan = 10;
      td.appendChild(detail(r));
      row.appendChild(td);
      tr.classList.add("sel");
      tr.after(row);
      open = r.i;
    }

    var timer = null;
    function later() { clearTimeout(timer); timer = setTimeout(filter, 150); }
    [fSource, fDomain, fVerdict, fUse].forEach(function (e) { e.addEventListener("change", filter); });
    [fStepMin, fStepMax, fRMin, fRMax, fSearch].forEach(function (e) {
      e.addEventListener("input", later);
      e.addEventListener("change", function () { clearTimeout(timer); filter(); });
    });
    fSize.addEventListener("change", function () { page = 0; render(); });
    $("pg-first").addEventListener("click", function () { page = 0; render(); });
    $("pg-prev").addEventListener("click", function () { page = Math.max(0, page - 1); render(); });
    $("pg-next").addEventListener("click", function () { page = Math.min(pages() - 1, page + 1); render(); });
    $("pg-last").addEventListener("click", function () { page = pages() - 1; render(); });
    Array.prototype.forEach.call(table.querySelectorAll("th[data-key]"), function (th) {
      th.addEventListener("click", function () {
        var k = th.dataset.key;
        sortDir = sortKey === k ? -sortDir : 1;
        sortKey = k;
        Array.prototype.forEach.call(table.querySelectorAll("th"), function (h) { h.classList.remove("asc", "desc"); });
        th.classList.add(sortDir > 0 ? "asc" : "desc");
        matched.sort(cmp);
        page = 0;
        render();
      });
    });
    filter();
    list.dataset.ready = "1";
    window.reportTiming = {decode_ms: Math.round(t1 - t0), render_ms: Math.round(performance.now() - t1),
                           rows: rows.length};
  }
})();
</script>
</body></html>
"""
