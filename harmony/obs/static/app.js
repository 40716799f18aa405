// Harmony dashboard: polls /api/snapshot every second and draws tables and
// SVG charts. Plain JS, no dependencies, no build step.
"use strict";
(function () {
  const COLORS = ["#2f6fdf", "#e0662b", "#2a9d54", "#b8329b", "#8a6d1d", "#1aa3b3",
                  "#d1344c", "#5b4bd6", "#6f8f2a", "#7a7a7a"];
  const NS = "http://www.w3.org/2000/svg";
  const token = new URLSearchParams(location.search).get("token");
  const api = "api/snapshot" + (token ? "?token=" + encodeURIComponent(token) : "");
  const $ = (sel) => document.querySelector(sel);
  const colorOf = {};
  function color(key) {
    if (!(key in colorOf)) colorOf[key] = COLORS[Object.keys(colorOf).length % COLORS.length];
    return colorOf[key];
  }
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function svgEl(tag, attrs) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "";
    // trailing zeros of a fraction only ("2.500" -> "2.5", "200" stays 200)
    return Number(v).toPrecision(digits || 6).replace(/(\.\d*?)0+(e|$)/, "$1$2")
      .replace(/\.(e|$)/, "$1");
  }
  function dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "";
    s = Math.max(0, s);
    if (s < 60) return s.toFixed(1) + "s";
    const m = Math.floor(s / 60), sec = Math.round(s % 60);
    if (m < 60) return m + "m" + String(sec).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h" + String(m % 60).padStart(2, "0") + "m";
  }
  function clock(t) { return t ? new Date(t * 1000).toLocaleTimeString() : ""; }

  // A line chart: series = [{name, color, points: [[x, y], ...]}]
  function lineChart(series, o) {
    o = Object.assign({w: 520, h: 200, ymin: null, ymax: null, log: false,
                       xfmt: (x) => num(x, 3), yfmt: (y) => num(y, 3)}, o || {});
    const pad = {l: 52, r: 10, t: 8, b: 22};
    const svg = svgEl("svg", {viewBox: `0 0 ${o.w} ${o.h}`, class: "chart"});
    const tf = (y) => (o.log ? Math.log10(Math.max(y, 1e-300)) : y);
    let xs = [], ys = [];
    for (const s of series) for (const p of s.points) {
      if (p[1] === null || !isFinite(p[1]) || (o.log && p[1] <= 0)) continue;
      xs.push(p[0]); ys.push(tf(p[1]));
    }
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = o.ymin !== null ? o.ymin : Math.min(...ys);
    let y1 = o.ymax !== null ? o.ymax : Math.max(...ys);
    if (!xs.length) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + (Math.abs(y0) || 1) * 0.1; y0 = y0 - (Math.abs(y0) || 1) * 0.1; }
    const X = (x) => pad.l + (x - x0) / (x1 - x0) * (o.w - pad.l - pad.r);
    const Y = (y) => o.h - pad.b - (y - y0) / (y1 - y0) * (o.h - pad.t - pad.b);
    svg.appendChild(svgEl("rect", {x: pad.l, y: pad.t, width: o.w - pad.l - pad.r,
                                   height: o.h - pad.t - pad.b, fill: "none", class: "axis"}));
    for (let i = 0; i <= 4; i++) {
      const yv = y0 + (y1 - y0) * i / 4, yy = Y(yv);
      svg.appendChild(svgEl("line", {x1: pad.l, x2: o.w - pad.r, y1: yy, y2: yy, class: "axis"}));
      const t = svgEl("text", {x: pad.l - 4, y: yy + 3, "text-anchor": "end"});
      t.textContent = o.yfmt(o.log ? Math.pow(10, yv) : yv);
      svg.appendChild(t);
    }
    for (let i = 0; i <= 4; i++) {
      const xv = x0 + (x1 - x0) * i / 4;
      const t = svgEl("text", {x: X(xv), y: o.h - 6, "text-anchor": "middle"});
      t.textContent = o.xfmt(xv);
      svg.appendChild(t);
    }
    for (const s of series) {
      const pts = s.points.filter((p) => p[1] !== null && isFinite(p[1]) && !(o.log && p[1] <= 0));
      if (!pts.length) continue;
      const d = pts.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + "," +
                        Y(tf(p[1])).toFixed(1)).join("");
      svg.appendChild(svgEl("path", {d: d, stroke: s.color, class: "series",
                                     "data-name": s.name, "data-points": pts.length}));
      if (pts.length <= 60) {
        for (const p of pts) {
          svg.appendChild(svgEl("circle", {cx: X(p[0]).toFixed(1), cy: Y(tf(p[1])).toFixed(1),
                                           r: 2.2, fill: s.color, class: "point"}));
        }
      }
    }
    return svg;
  }
  function legend(series) {
    const d = el("div", {class: "legend"});
    for (const s of series) {
      const it = el("span");
      const sw = el("i"); sw.style.background = s.color;
      it.appendChild(sw); it.appendChild(document.createTextNode(s.name));
      d.appendChild(it);
    }
    return d;
  }
  function barChart(groups) {   // predicted vs measured per group
    const w = 520, h = 26 + 34 * groups.length, pad = 90;
    const svg = svgEl("svg", {viewBox: `0 0 ${w} ${h}`, class: "chart bars"});
    const max = Math.max(1e-9, ...groups.map((g) => Math.max(g.predicted || 0, g.measured || 0)));
    groups.forEach((g, i) => {
      const y = 8 + i * 34;
      const t = svgEl("text", {x: 4, y: y + 14}); t.textContent = g.group; svg.appendChild(t);
      [["predicted", "#9bb7ec"], ["measured", "#2f6fdf"]].forEach(([k, c], j) => {
        const v = g[k]; if (v === null || v === undefined) return;
        const bw = (w - pad - 130) * v / max;
        svg.appendChild(svgEl("rect", {x: pad, y: y + j * 13, width: Math.max(1, bw), height: 11,
                                       fill: c, class: "bar " + k}));
        const lt = svgEl("text", {x: pad + bw + 4, y: y + j * 13 + 9});
        lt.textContent = k + " " + num(v, 3) + "s"; svg.appendChild(lt);
      });
    });
    return svg;
  }

  function jobCell(j) {   // the job's id links to its page
    const td = el("td");
    td.appendChild(el("a", {href: "#job=" + encodeURIComponent(j.id), class: "joblink"}, j.id));
    if (j.name && j.name !== j.app) td.appendChild(document.createTextNode(" (" + j.name + ")"));
    return td;
  }
  // A job's page (#job=ID): its story, why it runs where it runs or why it
  // waits, its group's predicted vs measured iteration, its iterations and
  // objective per epoch, checkpoints, moves and start-ups, drawn from the
  // snapshot; its logs below it (#joblogs: pollLogs).
  function renderJobPage(snap) {
    const box = $("#jobpage");
    const m = location.hash.match(/^#job=(.+)$/);
    if (!m) { box.hidden = true; box.textContent = ""; return; }
    const id = decodeURIComponent(m[1]);
    const j = snap.jobs.find((x) => x.id === id);
    box.hidden = false;
    box.textContent = "";
    box.setAttribute("data-job", id);
    const close = el("a", {href: "#", class: "close"}, "close");
    if (!j) {
      box.appendChild(el("h2", {}, "Job " + id));
      box.appendChild(el("p", {class: "muted"}, "not in the live views (unknown, or ended " +
        "longer ago than the master's retention): 'harmony status " + id + " --events'"));
      box.appendChild(close);
      return;
    }
    box.setAttribute("data-state", j.state);
    const h = el("h2", {}, "Job " + j.id + (j.name && j.name !== j.app ? " (" + j.name + ")" : "") +
                 " · " + j.app + " · ");
    h.appendChild(el("span", {class: "state " + j.state}, j.state));
    box.appendChild(h);
    box.appendChild(close);
    const g = snap.groups.find((x) => x.jobs.includes(j.id));
    const moves = j.events.filter((e) => /moves to|MiB moved|resiz/.test(e[2]));
    const ck = j.checkpoint;
    const facts = [
      ["why", j.state === "failed" ? j.error : (j.reason || j.note || "")],
      ["machines", (j.workers.length ? j.workers.join(", ") : "none now") + " (asked for " +
        j.machines + ")"],
      ["group", j.group ? j.group + (g ? ": " + g.jobs.join(", ") + " on " + g.machines.join(", ") : "")
        : "none"],
      ["attempt", String(j.attempt)],
      ["epochs", j.epoch + " / " + j.max_epochs + (j.objective !== null ? ", objective " +
        num(j.objective, 8) : "")],
      ["times", "submitted " + clock(j.submitted) + (j.started ? ", started " + clock(j.started) : "") +
        (j.ended ? ", ended " + clock(j.ended) : "") + ", elapsed " + dur(j.elapsed) +
        (j.state === "finished" ? "" : ", ETA " + (dur(j.eta) || "unknown"))],
      ["iteration", "measured " + (j.t_iter !== null ? num(j.t_iter, 3) + "s" : "–") +
        " (COMP " + (j.t_cpu !== null ? num(j.t_cpu, 3) + "s" : "–") + ", COMM " +
        (j.t_net !== null ? num(j.t_net, 3) + "s" : "–") + "), predicted " +
        (j.predicted_iter !== null ? num(j.predicted_iter, 3) + "s" : "–")],
      ["checkpoint", ck ? "after epoch " + (ck.epoch + 1) + " at " + clock(ck.time) +
        (ck.final ? " (final)" : "") : "none yet"],
      ["moves", j.migrations + " block migration(s); " + moves.length + " move event(s)"],
      ["start-up", j.setups.length ? j.setups.map((s, i) => "machine " + i + ": " +
        num(s[0], 3) + "s (" + num(s[1], 3) + "s CPU)").join("; ") : "–"],
      ["data", num(j.bytes_pulled / 2 ** 20, 4) + " MiB pulled, " +
        num(j.bytes_pushed / 2 ** 20, 4) + " MiB pushed"],
      ["logs", "streamed below, the last " + LOG_KEEP / 1000 + "k characters of each " +
        "machine's (all of it: harmony logs " + j.id + ")"],
    ];
    const dl = el("dl", {class: "facts"});
    for (const [k, v] of facts) {
      dl.appendChild(el("dt", {}, k));
      dl.appendChild(el("dd", {"data-fact": k}, v));
    }
    box.appendChild(dl);
    box.appendChild(controls(j));
    const charts = el("div", {class: "grid"});
    const it = el("div", {class: "chartbox", id: "job-iters"});
    it.appendChild(el("h3", {}, "seconds per iteration, by epoch"));
    const series = [{name: "measured", color: "#2f6fdf", points: j.iters}];
    if (j.predicted_iter !== null && j.iters.length) {
      series.push({name: "predicted (now)", color: "#9bb7ec",
                   points: [[j.iters[0][0], j.predicted_iter],
                            [j.iters[j.iters.length - 1][0], j.predicted_iter]]});
    }
    it.appendChild(lineChart(series, {w: 420, h: 160, ymin: 0}));
    it.appendChild(legend(series));
    charts.appendChild(it);
    const ob = el("div", {class: "chartbox", id: "job-objective"});
    ob.appendChild(el("h3", {}, "objective, by epoch"));
    const os = [{name: "objective", color: color(j.id), points: j.curve.map((p) => [p[0], p[1]])}];
    ob.appendChild(lineChart(os, {w: 420, h: 160}));
    charts.appendChild(ob);
    if (g) {
      const gb = el("div", {class: "chartbox", id: "job-group"});
      gb.appendChild(el("h3", {}, "its group: predicted vs measured iteration"));
      gb.appendChild(barChart([g]));
      charts.appendChild(gb);
    }
    box.appendChild(charts);
    const t = el("table", {id: "job-events"});
    const hr = el("tr");
    ["time", "state", "event"].forEach((x) => hr.appendChild(el("th", {}, x)));
    t.appendChild(el("thead")).appendChild(hr);
    const tb = el("tbody");
    for (const e of j.events.slice().reverse()) {
      const tr = el("tr", {"data-event-state": e[1]});
      tr.appendChild(el("td", {}, clock(e[0])));
      tr.appendChild(el("td", {}, e[1]));
      tr.appendChild(el("td", {class: "note"}, e[2]));
      tb.appendChild(tr);
    }
    t.appendChild(tb);
    box.appendChild(el("h3", {}, "story" + (j.events_earlier ? " (latest " + j.events.length +
      "; " + j.events_earlier + " earlier: harmony status " + j.id + " --events)" : "")));
    box.appendChild(t);
  }

  // cancel, pause and resume: what the CLI does, for the token's key (the
  // master refuses a reader's); the header is what no other site can send
  const said = {};
  function controls(j) {
    const d = el("div", {class: "controls"});
    const acts = {running: ["pause", "cancel"], profiling: ["pause", "cancel"],
                  paused: ["resume", "cancel"], profiled: ["resume", "cancel"],
                  waiting: ["cancel"]}[j.state] || [];
    for (const a of acts) {
      const b = el("button", {type: "button", "data-action": a}, a);
      b.addEventListener("click", async () => {
        if (a === "cancel" && !confirm("cancel " + j.id + "?")) return;
        b.disabled = true;
        try {
          const q = "api/control?action=" + a + "&job=" + encodeURIComponent(j.id) +
            (token ? "&token=" + encodeURIComponent(token) : "");
          const r = await fetch(q, {method: "POST", credentials: "same-origin",
                                    headers: {"X-Harmony-Dashboard": "1"}});
          const body = await r.json();
          said[j.id] = body.ok ? a + ": " + (body.state || "done") : a + " refused: " + body.error;
        } catch (e) {
          said[j.id] = a + " failed: " + e.message;
        }
        const out = $("#job-control-said");
        if (out) out.textContent = said[j.id];
      });
      d.appendChild(b);
    }
    d.appendChild(el("span", {id: "job-control-said", class: "muted"}, said[j.id] || ""));
    return d;
  }

  function renderJobs(snap) {
    const tb = $("#jobs tbody");
    tb.textContent = "";
    for (const j of snap.jobs) {
      const tr = el("tr", {"data-job": j.id, "data-state": j.state});
      const st = el("td"); st.appendChild(el("span", {class: "state " + j.state}, j.state));
      const cells = [
        jobCell(j),
        el("td", {}, j.app), st, el("td", {}, j.group || "–"),
        el("td", {}, j.workers.length ? j.workers.join(", ") : String(j.machines)),
        el("td", {class: "num"}, j.epoch + " / " + j.max_epochs),
        el("td", {class: "num objective"}, num(j.objective, 8)),
        el("td", {class: "num"}, j.t_iter !== null ? num(j.t_iter, 3) + "s" : ""),
        el("td", {class: "num"}, dur(j.elapsed)),
        el("td", {class: "num"}, j.state === "finished" ? "done" : dur(j.eta)),
        el("td", {class: "note" + (j.state === "failed" ? " error" : "")},
           j.state === "failed" ? j.error : (j.reason || j.note)),
      ];
      cells.forEach((c) => tr.appendChild(c));
      tb.appendChild(tr);
    }
  }
  function renderObjective(snap) {
    const box = $("#objective");
    const series = snap.jobs.filter((j) => j.curve.length).map((j) => (
      {name: j.id + " " + j.app, color: color(j.id), points: j.curve.map((p) => [p[0], p[1]])}));
    const pos = series.every((s) => s.points.every((p) => p[1] === null || p[1] > 0));
    box.textContent = "";
    box.appendChild(lineChart(series, {log: pos && series.length > 0, xfmt: (x) => num(x, 3)}));
    box.appendChild(legend(series));
  }
  function renderGroups(snap) {
    const tb = $("#groups tbody");
    tb.textContent = "";
    for (const g of snap.groups) {
      const tr = el("tr", {"data-group": g.group});
      [g.group, g.jobs.join(", "), g.machines.join(", ")].forEach((t) => tr.appendChild(el("td", {}, t)));
      tr.appendChild(el("td", {class: "num"}, g.predicted !== null ? num(g.predicted, 4) + "s" : ""));
      tr.appendChild(el("td", {class: "num"}, g.measured !== null ? num(g.measured, 4) + "s" : ""));
      tr.appendChild(el("td", {class: "num"}, g.error !== null ? (100 * g.error).toFixed(1) + "%" : ""));
      tb.appendChild(tr);
    }
    if (!snap.groups.length) {
      tb.appendChild(el("tr")).appendChild(el("td", {colspan: 6, class: "muted"},
        "no scheduler groups running"));
    }
    const box = $("#groupbars");
    box.textContent = "";
    if (snap.groups.length) box.appendChild(barChart(snap.groups));
  }
  function renderMachines(snap) {
    const box = $("#machines");
    box.textContent = "";
    for (const m of snap.machines) {
      const d = el("div", {class: "machine", "data-machine": m.name});
      const disk = m.disk && m.disk.total ? ", disk " + num(m.disk.free / 2 ** 30, 3) +
        " of " + num(m.disk.total / 2 ** 30, 3) + " GiB free" : "";
      d.appendChild(el("h3", {}, m.name + " (" + m.cpus + " cores, " +
                          num(m.memory / 2 ** 30, 3) + " GiB" + disk + (m.alive ? "" : ", LOST") +
                          ")" + (m.jobs.length ? ": " + m.jobs.join(", ") : "")));
      const t0 = snap.t;
      const pts = (k) => m.timeline.filter((s) => s[k] !== undefined).map((s) => [s.t - t0, s[k]]);
      const series = [
        {name: "CPU", color: "#2f6fdf", points: pts("cpu")},
        {name: "network", color: "#e0662b", points: pts("net")},
        {name: "CPU queue busy", color: "#2a9d54", points: pts("q_cpu")},
        {name: "NET queue busy", color: "#b8329b", points: pts("q_net")},
        {name: "memory", color: "#7a5c2e", points: pts("mem")},
      ].filter((s) => s.points.length);
      d.appendChild(lineChart(series, {w: 420, h: 150, ymin: 0, ymax: 1,
                                       xfmt: (x) => Math.round(x) + "s",
                                       yfmt: (y) => Math.round(100 * y) + "%"}));
      d.appendChild(legend(series));
      if (m.tasks && m.tasks.length) d.appendChild(taskStream(m.tasks));
      box.appendChild(d);
    }
  }
  // The task stream (as Dask draws it): a machine's COMP and COMM subtasks of
  // the last minute, one lane each, coloured by job; x in seconds before now
  function taskStream(tasks) {
    const w = 420, h = 64, pad = {l: 40, r: 10, t: 4, b: 16}, lane = 20;
    const x0 = Math.min(-10, ...tasks.map((t) => t[0]));
    const X = (x) => pad.l + (x - x0) / (0 - x0) * (w - pad.l - pad.r);
    const svg = svgEl("svg", {viewBox: `0 0 ${w} ${h}`, class: "chart tasks"});
    ["cpu", "net"].forEach((k, i) => {
      const t = svgEl("text", {x: pad.l - 4, y: pad.t + i * (lane + 2) + 14, "text-anchor": "end"});
      t.textContent = k === "cpu" ? "COMP" : "COMM";
      svg.appendChild(t);
    });
    for (const [a, b, job, kind] of tasks) {
      const y = pad.t + (kind === "cpu" ? 0 : lane + 2);
      const r = svgEl("rect", {x: X(a).toFixed(1), y: y, height: lane, class: "task",
                               width: Math.max(0.8, X(b) - X(a)).toFixed(1), fill: color(job),
                               "data-job": job, "data-kind": kind});
      const tip = svgEl("title");
      tip.textContent = job + " " + (kind === "cpu" ? "COMP" : "COMM") + " " + num(b - a, 3) + "s";
      r.appendChild(tip);
      svg.appendChild(r);
    }
    for (let i = 0; i <= 3; i++) {
      const xv = x0 * (1 - i / 3);
      const t = svgEl("text", {x: X(xv), y: h - 4, "text-anchor": "middle"});
      t.textContent = Math.round(xv) + "s";
      svg.appendChild(t);
    }
    return svg;
  }
  function renderDecisions(snap) {
    const ol = $("#decisions");
    ol.textContent = "";
    const ds = snap.decisions.slice().reverse();
    for (const dcs of ds) {
      const li = el("li");
      li.appendChild(el("span", {class: "when"}, clock(dcs.t)));
      const parts = [dcs.note || "decision"];
      const fmt = (o) => Object.entries(o).map(([k, v]) => k + "→" + (Array.isArray(v) ? v.join(",") : v)).join("; ");
      if (Object.keys(dcs.profile).length) parts.push("profile " + fmt(dcs.profile));
      if (Object.keys(dcs.start).length) parts.push("start " + fmt(dcs.start));
      if (Object.keys(dcs.pause).length) parts.push("move/pause " + fmt(dcs.pause));
      if (dcs.promote.length) parts.push("promote " + dcs.promote.join(", "));
      if (Object.keys(dcs.predicted).length) parts.push("predicted " + Object.entries(
        dcs.predicted).map(([g, v]) => g + " " + num(v, 3) + "s").join(", "));
      li.appendChild(document.createTextNode(parts.join(" · ")));
      ol.appendChild(li);
    }
    if (!ds.length) ol.appendChild(el("li", {class: "muted"}, "no decisions yet"));
  }
  function render(snap) {
    const by = {};
    for (const j of snap.jobs) by[j.state] = (by[j.state] || 0) + 1;
    // the cluster's memory: the executors' use over what the live machines offer
    let used = 0, offered = 0;
    for (const m of snap.machines) {
      const last = m.timeline.length ? m.timeline[m.timeline.length - 1] : {};
      if (m.alive && last.mem !== undefined) { used += last.mem * m.memory; offered += m.memory; }
    }
    const mem = offered ? " · memory " + (100 * used / offered).toFixed(1) + "% of " +
      num(offered / 2 ** 30, 3) + " GiB used by jobs" : "";
    $("#summary").textContent = snap.mode + " mode · " + snap.endpoint + " · " +
      snap.machines.filter((m) => m.alive).length + " machine(s) · " +
      (Object.entries(by).map(([k, v]) => v + " " + k).join(", ") || "no jobs") + mem;
    $("#updated").textContent = "updated " + clock(snap.t);
    renderJobPage(snap); renderJobs(snap); renderObjective(snap); renderGroups(snap);
    renderMachines(snap); renderDecisions(snap);
    document.body.setAttribute("data-updated", String(snap.t));
  }
  // The job page's logs, streamed: /api/logs every 2 s while the page is
  // open (at once again while a machine has more than one reply's worth),
  // each machine's new text appended to its box as text, never as HTML; at
  // most LOG_KEEP characters kept per machine. The server asks the data
  // services; the page says what it has (machine -> [log, byte offset]).
  const LOG_KEEP = 200000, LOG_EVERY = 2000;
  const logs = {job: null, at: {}, panes: {}, done: false, busy: false, timer: null};
  function logsJob() {
    const m = location.hash.match(/^#job=(.+)$/);
    return m ? decodeURIComponent(m[1]) : null;
  }
  function logPane(machine) {
    let p = logs.panes[machine];
    if (!p) {
      const d = el("div", {class: "log", "data-machine": machine});
      const h = el("h3", {}, machine);
      const pre = el("pre", {class: "logtext", "data-machine": machine});
      d.appendChild(h); d.appendChild(pre);
      $("#joblogs-machines").appendChild(d);
      p = logs.panes[machine] = {d: d, h: h, pre: pre};
    }
    return p;
  }
  function appendLog(pane, text) {
    const pre = pane.pre;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.appendChild(document.createTextNode(text));
    const all = pre.textContent;
    if (all.length > LOG_KEEP) {
      pre.textContent = "…" + all.slice(all.length - LOG_KEEP);
      pre.setAttribute("data-trimmed", "1");
    }
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
  async function pollLogs() {
    logs.timer = null;
    const job = logsJob();
    if (job !== logs.job) {        // another job's page, or none: start afresh
      Object.assign(logs, {job: job, at: {}, panes: {}, done: false});
      $("#joblogs-machines").textContent = "";
      $("#joblogs-note").textContent = job ? "fetching…" : "";
    }
    const sec = $("#joblogs");
    sec.hidden = !job;
    if (job) sec.setAttribute("data-job", job); else sec.removeAttribute("data-job");
    let again = LOG_EVERY;
    if (job && !logs.done && !document.hidden && !logs.busy) {
      logs.busy = true;
      let note;
      try {
        const q = "api/logs?job=" + encodeURIComponent(job) + "&offsets=" +
          encodeURIComponent(JSON.stringify(logs.at)) +
          (token ? "&token=" + encodeURIComponent(token) : "");
        const r = await fetch(q, {cache: "no-store", credentials: "same-origin"});
        const body = await r.json().catch(
          () => ({ok: false, error: r.status + " " + r.statusText}));
        if (logsJob() !== job) {
          again = 0;
        } else if (!body.ok) {
          note = "no logs: " + body.error;
          again = 5 * LOG_EVERY;
        } else {
          let behind = false, writing = false;
          for (const m of body.machines) {
            const pane = logPane(m.machine);
            if (m.error) {
              pane.h.textContent = m.machine + ": not reached (" + m.error + ")";
              pane.d.setAttribute("data-error", "1");
              writing = true;
              continue;
            }
            pane.d.removeAttribute("data-error");
            const had = logs.at[m.machine];
            if (!had || had[0] !== m.name) {     // a log new to the page: which, from where
              appendLog(pane, (had ? "\n" : "") + "==> " + m.name + (m.offset > 0 ?
                " (from byte " + m.offset + " of " + m.size + "; all of it: harmony logs " +
                job + ")" : "") + " <==\n");
            }
            pane.h.textContent = m.machine + ": " + m.name + (m.live ? " (running)" : "");
            if (m.text) appendLog(pane, m.text);
            logs.at[m.machine] = [m.name, m.next];
            behind = behind || m.restart || m.next < m.size;
            writing = writing || m.live;
          }
          note = "updated " + clock(body.t) + (body.quiet.length ? " · no log of this job on " +
            body.quiet.join(", ") : "") + (body.left_out ? " · " + body.left_out +
            " more machine(s) not asked: harmony logs " + job : "");
          if (!body.machines.length) note = "no logs yet · " + note;
          if (behind) again = 300;
          // ended, every log read to its end: nothing more will come
          const j = last && last.jobs.find((x) => x.id === job);
          if (!behind && !writing && body.machines.length && j &&
              ["finished", "failed", "cancelled"].includes(j.state)) logs.done = true;
        }
      } catch (e) {
        note = "logs not updated: " + e.message;
      }
      logs.busy = false;
      if (note !== undefined) $("#joblogs-note").textContent = note;
      sec.setAttribute("data-polled", String(Date.now()));
    }
    logs.timer = setTimeout(pollLogs, again);
  }
  let last = null;
  window.addEventListener("hashchange", () => {
    if (last) renderJobPage(last);
    if (logs.timer !== null && !logs.busy) { clearTimeout(logs.timer); pollLogs(); }
  });
  async function poll() {
    try {
      const r = await fetch(api, {cache: "no-store", credentials: "same-origin"});
      if (!r.ok) throw new Error(r.status + " " + (await r.text()));
      const snap = await r.json();
      if (snap.t) { last = snap; render(snap); }
    } catch (e) {
      $("#updated").textContent = "not updated: " + e.message;
    }
    setTimeout(poll, 1000);
  }
  poll();
  pollLogs();
})();
