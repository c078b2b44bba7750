// notify broker dashboard: polls api/overview every second and draws it.
// No dependencies; charts are plain canvas. Data goes into the page with textContent only.
"use strict";

const POLL_MS = 1000;
const TOKEN = new URLSearchParams(location.search).get("token");
const HEADERS = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
const expanded = new Set();
let lastData = null;
let failures = 0;

// ------------------------------------------------------------------ formatting

function fmtNum(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const a = Math.abs(n);
  const d = digits === undefined ? 1 : digits;
  if (a >= 1e9) return (n / 1e9).toFixed(d) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(d) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(d) + "k";
  if (Number.isInteger(n)) return String(n);
  return n.toFixed(a < 10 ? 1 : 0);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
}

function fmtDur(s) {
  s = Math.max(0, Math.floor(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function bar(fraction, cls) {
  const f = Math.max(0, Math.min(1, fraction || 0));
  return el("div", { class: "bar " + (cls || "") },
    el("span", { style: "width:" + (f * 100).toFixed(1) + "%" }));
}

function badge(text, cls) { return el("span", { class: "badge " + (cls || "") }, text); }

function fillBody(table, rows, emptyText, cols) {
  const body = table.tBodies[0];
  if (!rows.length) {
    body.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: String(cols) }, emptyText)));
  } else {
    body.replaceChildren(...rows);
  }
}

function setKpi(id, value, foot, unit) {
  const k = document.getElementById(id);
  k.querySelector(".value").replaceChildren(value, unit ? el("small", {}, unit) : "");
  if (foot !== undefined) {
    const f = document.getElementById(id + "-foot");
    if (f) f.replaceChildren(...(Array.isArray(foot) ? foot : [foot]));
  }
}

// ------------------------------------------------------------------ charts

function sizeCanvas(c) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(10, Math.round(c.clientWidth * dpr));
  const h = Math.max(10, Math.round(c.clientHeight * dpr));
  if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
  const ctx = c.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return [ctx, c.clientWidth, c.clientHeight];
}

function niceMax(v, binary) {
  if (v <= 0) return 1;
  let unit = 1;
  if (binary) while (v / unit >= 1024) unit *= 1024;
  const x = v / unit;
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 4, 6, 8, 10]) if (m * p >= x) return m * p * unit;
  return 10 * p * unit;
}

function drawChart(canvas, rates, series, fmt, binary) {
  const [ctx, W, H] = sizeCanvas(canvas);
  ctx.clearRect(0, 0, W, H);
  // the window grows with the samples there are, up to two minutes
  const span = [30, 60, 90, 120].find((x) => x >= rates.length) || 120;
  const pts = rates.slice(-span);
  let max = 0;
  for (const s of series) for (const r of pts) max = Math.max(max, r[s.key] || 0);
  max = niceMax(max * 1.1, binary);
  ctx.font = "11px system-ui, 'DejaVu Sans', sans-serif";
  let labelW = 0;
  for (let i = 0; i <= 4; i++) labelW = Math.max(labelW, ctx.measureText(fmt((max * i) / 4)).width);
  const padL = Math.ceil(labelW) + 14, padR = 14, padT = 10, padB = 22;
  const w = W - padL - padR, h = H - padT - padB;
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = padT + h - (h * i) / 4;
    ctx.strokeStyle = i === 0 ? "#2b3857" : "#1e2740";
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(padL, Math.round(y) + 0.5); ctx.lineTo(padL + w, Math.round(y) + 0.5); ctx.stroke();
    ctx.fillStyle = "#7d8aa5";
    ctx.textAlign = "right";
    ctx.fillText(fmt((max * i) / 4), padL - 8, y);
  }
  ctx.textBaseline = "top";
  for (let i = 3; i >= 0; i--) {
    const ago = (span * i) / 3;
    const x = padL + w - (w * ago) / span;
    ctx.fillStyle = "#66728c";
    ctx.textAlign = i === 0 ? "right" : i === 3 ? "left" : "center";
    ctx.fillText(ago === 0 ? "now" : "-" + ago + "s", x, padT + h + 6);
  }
  if (pts.length < 2) {
    ctx.fillStyle = "#66728c";
    ctx.textBaseline = "middle";
    ctx.fillText("collecting samples…", padL + w / 2, padT + h / 2);
    return;
  }
  const x0 = padL + w - (w * (pts.length - 1)) / span;
  const step = w / span;
  for (const s of series) {
    const xy = pts.map((r, i) => [x0 + i * step, padT + h - (h * (r[s.key] || 0)) / max]);
    if (s.fill) {
      const g = ctx.createLinearGradient(0, padT, 0, padT + h);
      g.addColorStop(0, s.color + "55");
      g.addColorStop(1, s.color + "00");
      ctx.fillStyle = g;
      ctx.beginPath();
      ctx.moveTo(xy[0][0], padT + h);
      for (const [x, y] of xy) ctx.lineTo(x, y);
      ctx.lineTo(xy[xy.length - 1][0], padT + h);
      ctx.closePath();
      ctx.fill();
    }
    ctx.strokeStyle = s.color;
    ctx.lineWidth = s.width || 2;
    ctx.lineJoin = "round";
    ctx.setLineDash(s.dash || []);
    ctx.beginPath();
    xy.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    ctx.stroke();
    ctx.setLineDash([]);
  }
}

function drawSpark(canvas, rates) {
  const [ctx, W, H] = sizeCanvas(canvas);
  ctx.clearRect(0, 0, W, H);
  const key = canvas.dataset.series, color = canvas.dataset.color;
  const span = Math.min(60, Math.max(10, rates.length));
  const pts = rates.slice(-span).map((r) => r[key] || 0);
  if (pts.length < 2) return;
  const max = Math.max(...pts, 1e-9);
  const step = W / (span - 1);
  const x0 = W - step * (pts.length - 1);
  const g = ctx.createLinearGradient(0, 0, 0, H);
  g.addColorStop(0, color + "66");
  g.addColorStop(1, color + "00");
  ctx.beginPath();
  ctx.moveTo(x0, H);
  pts.forEach((v, i) => ctx.lineTo(x0 + i * step, H - 2 - (H - 4) * (v / max)));
  ctx.lineTo(x0 + (pts.length - 1) * step, H);
  ctx.closePath();
  ctx.fillStyle = g;
  ctx.fill();
  ctx.beginPath();
  pts.forEach((v, i) => {
    const x = x0 + i * step, y = H - 2 - (H - 4) * (v / max);
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.stroke();
}

// ------------------------------------------------------------------ sections

function replicationText(rep) {
  if (!rep) return "";
  if (rep.role === "slave") {
    const lags = (rep.partitions || []).map((p) => p.lag_bytes).filter((x) => x !== null);
    const lag = lags.reduce((a, b) => a + b, 0);
    return " · slave of " + rep.master + (lags.length ? " (lag " + fmtBytes(lag) + ")" : "");
  }
  if (rep.sync_slave) return " · sync slave " + rep.sync_slave.address + ": " + rep.sync_slave.state.replace("_", " ");
  return "";
}

function renderHeader(d) {
  const s = d.system;
  document.getElementById("ident").replaceChildren(
    "broker ", el("b", {}, "#" + s.broker_id), " · ", el("b", {}, s.host + ":" + s.port),
    " · v" + s.version + " · up " + fmtDur(s.uptime_seconds),
    replicationText(s.replication),
    s.auth_required ? " · auth on" : "");
  document.title = "notify #" + s.broker_id + " · " + s.host + ":" + s.port;
}

function renderKpis(d) {
  const last = d.rates.length ? d.rates[d.rates.length - 1] : {};
  const s = d.system;
  setKpi("kpi-put", fmtNum(last.put_tps || 0));
  setKpi("kpi-get", fmtNum(last.get_tps || 0));
  const inb = fmtBytes(last.put_bps || 0).split(" ");
  const outb = fmtBytes(last.get_bps || 0).split(" ");
  setKpi("kpi-in", inb[0], undefined, " " + inb[1] + "/s");
  setKpi("kpi-out", outb[0], undefined, " " + outb[1] + "/s");
  const stored = fmtBytes(d.topics.reduce((a, t) => a + t.size_bytes, 0)).split(" ");
  const parts = d.topics.reduce((a, t) => a + t.num_partitions, 0);
  setKpi("kpi-stored", stored[0], d.topics.length + " topics · " + parts + " partitions", " " + stored[1]);
  setKpi("kpi-conn", fmtNum(s.connections), fmtNum(s.connections_total) + " since start");
  const inDoubt = d.in_doubt;
  setKpi("kpi-tx", fmtNum(d.transactions.length), inDoubt
    ? [el("span", { class: "warn" }, inDoubt + " in doubt")]
    : [s.transactions ? fmtNum(s.transactions.committed) + " committed" : "disabled"]);
  for (const c of document.querySelectorAll("canvas.spark")) drawSpark(c, d.rates);
}

function renderCharts(d) {
  drawChart(document.getElementById("chart-rate"), d.rates, [
    { key: "put_tps", color: "#3ddbd9", fill: true },
    { key: "get_tps", color: "#a78bfa", fill: true },
    { key: "fsync_ps", color: "#fbbf24", width: 1.5, dash: [4, 3] },
  ], (v) => fmtNum(v));
  drawChart(document.getElementById("chart-bytes"), d.rates, [
    { key: "put_bps", color: "#34d399", fill: true },
    { key: "get_bps", color: "#f472b6", fill: true },
  ], (v) => fmtBytes(v).replace(".00 ", " ").replace(".0 ", " ") + "/s", true);
}

function renderTopics(d) {
  const maxSize = Math.max(1, ...d.topics.map((t) => t.size_bytes));
  const rows = [];
  const topics = [...d.topics].sort((a, b) => (a.internal - b.internal) || a.name.localeCompare(b.name));
  for (const t of topics) {
    const open = expanded.has(t.name);
    const pmax = Math.max(1, ...t.partitions.map((p) => p.size_bytes));
    const strip = el("div", { class: "strip", title: "size of each partition" },
      ...t.partitions.slice(0, 64).map((p) =>
        el("i", { style: "height:" + (2 + 20 * (p.size_bytes / pmax)).toFixed(1) + "px",
                  title: t.name + "-" + p.partition + ": " + fmtBytes(p.size_bytes) })));
    const flags = el("span", {},
      t.internal ? badge("internal") : null,
      t.accept_publish ? null : badge("no publish", "bad"),
      t.accept_subscribe ? null : badge("no subscribe", "bad"),
      t.config.unflush_threshold === 0 ? badge("group commit", "info") : null,
      t.partitions.some((p) => p.failed) ? badge("failed", "bad") : null);
    rows.push(el("tr", { class: "topic", "data-topic": t.name,
                         onclick: () => { open ? expanded.delete(t.name) : expanded.add(t.name); render(); } },
      el("td", { class: "tname" }, el("span", { class: "caret" }, open ? "▾" : "▸"), t.name),
      el("td", { class: "num" }, t.num_partitions),
      el("td", {}, el("div", { class: "barcell" }, bar(t.size_bytes / maxSize),
                      el("span", { class: "txt" }, fmtBytes(t.size_bytes)))),
      el("td", { class: "num" }, fmtNum(t.put_messages)),
      el("td", { class: "num" }, fmtNum(t.get_requests)),
      el("td", {}, strip),
      el("td", {}, t.groups.length ? t.groups.slice(0, 4).map((g) => badge(g)).reduce((a, b) => (a.append(b), a), el("span")) : el("span", { class: "hint" }, "—")),
      el("td", {}, flags)));
    if (open) {
      for (const p of t.partitions) {
        rows.push(el("tr", { class: "sub" },
          el("td", { class: "mono" }, "  " + t.name + "-" + p.partition),
          el("td", { class: "num" }, p.segments + " seg"),
          el("td", {}, el("div", { class: "barcell" }, bar(p.size_bytes / pmax),
                          el("span", { class: "txt" }, fmtBytes(p.size_bytes)))),
          el("td", { class: "num mono", colspan: "2" }, "min " + p.min_offset + " · max " + p.max_offset),
          el("td", { class: "mono", colspan: "2" }, "flushed " + p.flushed_offset +
             (p.unflushed_bytes ? " (+" + fmtBytes(p.unflushed_bytes) + " unflushed)" : "")),
          el("td", {}, p.failed ? badge("read-only", "bad") : badge("ok", "ok"))));
      }
    }
  }
  fillBody(document.getElementById("topics"), rows, "No topics configured", 8);
}

function renderGroups(d) {
  const maxLag = Math.max(1, ...d.groups.map((g) => g.lag_bytes));
  const rows = d.groups.map((g) => {
    const level = g.lag_bytes > 16 * 1048576 ? "high" : g.lag_bytes > 1048576 ? "mid" : "";
    return el("tr", {},
      el("td", { class: "tname" }, g.group, " ", g.live ? null : badge("idle")),
      el("td", { class: "mono" }, g.topic + "-" + g.partition),
      el("td", { class: "num mono" }, g.offset),
      el("td", {}, el("div", { class: "barcell" }, bar(g.lag_bytes / maxLag, "lag " + level),
                      el("span", { class: "txt" }, fmtBytes(g.lag_bytes)))),
      el("td", { class: "num" }, fmtDur(g.idle_seconds) + " ago"));
  });
  fillBody(document.getElementById("groups"), rows, "No consumer has fetched yet", 5);
}

function renderTxs(d) {
  const rows = d.transactions.map((t) => {
    const cls = t.state === "PREPARED" ? "warn" : t.state.startsWith("HEURISTIC") ? "bad"
      : t.state === "ACTIVE" || t.state === "ENDED" ? "info" : "";
    return el("tr", { class: t.in_doubt ? "indoubt" : "" },
      el("td", { class: "mono", title: t.key }, t.key.length > 42 ? t.key.slice(0, 40) + "…" : t.key),
      el("td", {}, badge(t.in_doubt ? "in doubt" : t.state.toLowerCase(), cls), t.xa ? badge("XA") : badge("local")),
      el("td", { class: "num" }, t.messages),
      el("td", { class: "num" }, fmtBytes(t.bytes)),
      el("td", { class: "num" }, fmtDur(t.age_seconds)));
  });
  fillBody(document.getElementById("txs"), rows, "No transaction in flight ✓", 5);
  document.getElementById("tx-hint").textContent =
    d.in_doubt ? d.in_doubt + " in doubt: resolve with `notify tx commit|rollback`" : "in flight and in doubt";
}

function renderConfig(d) {
  const c = d.config;
  document.getElementById("config-src").textContent = c.source || "";
  const items = Object.entries(c.system).map(([k, v]) =>
    el("div", {}, el("span", { class: "k" }, k), el("span", { class: "v" }, v === null ? "—" : String(v))));
  document.getElementById("config").replaceChildren(...items);
}

// ------------------------------------------------------------------ queue groups
// api/queues every poll; the open group's dead letters (admin route: with adminSecret set
// the page needs ?token=<adminSecret>) every DLQ_MS and after a replay. A replay is a POST
// with Content-Type: application/json and the page's token, as the server requires; a
// deletion (after a confirm) a DELETE of api/queues/<topic>/<group>, forced when the group
// has consumers (the broker closes their connections).

const DLQ_MS = 5000;
const DLQ_LIMIT = 100;
let queuesData = null;
let queuesError = "";
let openDlq = null;   // "topic/group" shown below the table (also in the URL: #dlq=topic/group)
let dlqData = null;
let dlqError = "";
let dlqNote = "";
let dlqFetchedAt = 0;
let queuesNote = "";

function groupPath(key) {
  const i = key.indexOf("/");
  return "api/queues/" + encodeURIComponent(key.slice(0, i)) + "/" +
    encodeURIComponent(key.slice(i + 1));
}

function queuePath(key) {
  return groupPath(key) + "/dead-letters";
}

function authText(status) {
  return status === 401 || status === 403
    ? "dead letters are an admin view: open this page with ?token=<adminSecret>"
    : "broker answered HTTP " + status;
}

async function pollQueues() {
  try {
    const r = await fetch("api/queues", { headers: HEADERS, cache: "no-store" });
    if (r.status === 503) { queuesData = []; queuesError = "queues are not enabled on this broker"; return; }
    if (!r.ok) throw new Error("broker answered HTTP " + r.status);
    queuesData = (await r.json()).queues;
    queuesError = "";
  } catch (e) {
    queuesError = String(e.message || e);
  }
  if (openDlq && Date.now() - dlqFetchedAt >= DLQ_MS) await loadDlq();
}

async function loadDlq() {
  const key = openDlq;
  if (!key) return;
  dlqFetchedAt = Date.now();
  try {
    const r = await fetch(queuePath(key) + "?limit=" + DLQ_LIMIT, { headers: HEADERS, cache: "no-store" });
    if (key !== openDlq) return;
    if (!r.ok) { dlqData = null; dlqError = authText(r.status); return; }
    dlqData = await r.json();
    dlqError = "";
  } catch (e) {
    dlqError = String(e.message || e);
  }
}

async function replay(key, messages) {
  const body = messages ? { messages } : { all: true };
  try {
    const r = await fetch(queuePath(key) + "/replay", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, HEADERS),
      body: JSON.stringify(body),
      cache: "no-store",
    });
    if (!r.ok) {
      dlqNote = r.status === 401 || r.status === 403 ? authText(r.status)
        : "replay refused: HTTP " + r.status + " " + (await r.text()).slice(0, 200);
    } else {
      const res = await r.json();
      dlqNote = "replayed " + res.replayed + (res.unknown ? ", " + res.unknown + " unknown (gone)" : "");
    }
  } catch (e) {
    dlqNote = "replay failed: " + String(e.message || e);
  }
  await loadDlq();
  await pollQueues();
  renderQueues();
}

async function deleteGroup(key) {
  const q = (queuesData || []).find((x) => x.topic + "/" + x.group === key);
  const busy = q ? q.consumers : 0;
  const what = "Delete queue group " + key + "? Its positions and dead letters are lost" +
    (busy ? "; its " + busy + " consumer connection(s) are closed." : ".");
  if (!confirm(what)) return;
  try {
    const r = await fetch(groupPath(key) + (busy ? "?force=true" : ""), {
      method: "DELETE",
      headers: Object.assign({ "Content-Type": "application/json" }, HEADERS),
      cache: "no-store",
    });
    if (!r.ok) {
      dlqNote = r.status === 401 || r.status === 403 ? "deleting a group is an admin action: " +
        "open this page with ?token=<adminSecret>"
        : "deletion refused: HTTP " + r.status + " " + (await r.text()).slice(0, 200);
    } else {
      queuesNote = "deleted " + key;
      if (openDlq === key) toggleDlq(key);
    }
  } catch (e) {
    dlqNote = "deletion failed: " + String(e.message || e);
  }
  await pollQueues();
  renderQueues();
}

function toggleDlq(key) {
  openDlq = openDlq === key ? null : key;
  dlqData = null; dlqError = ""; dlqNote = "";
  history.replaceState(null, "", openDlq ? "#dlq=" + encodeURIComponent(openDlq) : location.pathname + location.search);
  renderQueues();
  if (openDlq) loadDlq().then(renderQueues);
}

function renderQueues() {
  const hint = document.getElementById("queues-hint");
  hint.textContent = queuesError || queuesNote || "click a group for its dead letters";
  hint.className = "hint" + (queuesError ? " warn" : "");
  const rows = (queuesData || []).map((q) => {
    const key = q.topic + "/" + q.group;
    const dead = q.dead_letters || 0;
    return el("tr", { class: "topic" + (openDlq === key ? " open" : ""), "data-queue": key,
                      onclick: () => toggleDlq(key) },
      el("td", { class: "tname" }, el("span", { class: "caret" }, openDlq === key ? "▾" : "▸"), q.group),
      el("td", { class: "mono" }, q.topic),
      el("td", { class: "num" }, q.consumers),
      el("td", { class: "num" }, fmtNum(q.available)),
      el("td", { class: "num" }, fmtNum(q.acquired)),
      el("td", { class: "num" }, dead ? badge(fmtNum(dead), "bad") : "0"),
      el("td", { class: "num" }, fmtNum(q.delivered)),
      el("td", { class: "num" }, fmtNum(q.redelivered)));
  });
  fillBody(document.getElementById("queues"), rows, queuesError || "No queue group yet", 8);
  const box = document.getElementById("dlq");
  box.hidden = !openDlq;
  if (!openDlq) return;
  document.getElementById("dlq-title").textContent = "Dead letters of " + openDlq;
  const d = dlqData;
  const note = dlqError || dlqNote ||
    (d ? d.total + " dead letter(s)" + (d.dropped ? ", " + d.dropped + " dropped (queueMaxDeadLetters)" : "") +
         (d.total > d.dead_letters.length ? ", first " + d.dead_letters.length + " shown" : "") : "loading…");
  const h = document.getElementById("dlq-hint");
  h.textContent = note;
  h.className = "hint" + (dlqError ? " warn" : "");
  const all = document.getElementById("dlq-replay-all");
  all.disabled = !d || !d.total;
  const key = openDlq;
  all.onclick = () => { if (confirm("Replay every dead letter of " + key + "?")) replay(key, null); };
  document.getElementById("queue-delete").onclick = () => deleteGroup(key);
  const now = Date.now();
  const letters = d ? d.dead_letters : [];
  const dlqRows = letters.map((x) => {
    const m = x.message;
    const text = m === null ? el("span", { class: "hint" }, "deleted by retention")
      : m.text !== null ? (m.text.length > 80 ? m.text.slice(0, 78) + "…" : m.text)
      : el("span", { class: "hint" }, m.size + " B binary");
    return el("tr", { "data-dead": x.partition + ":" + x.offset },
      el("td", { class: "mono" }, key.slice(0, key.indexOf("/")) + "-" + x.partition),
      el("td", { class: "num mono" }, x.offset),
      el("td", {}, badge(x.reason.replace("_", " "), x.reason === "rejected" ? "warn" : "bad")),
      el("td", { class: "num" }, x.deliveries),
      x.at === null ? el("td", { class: "num hint" }, "unknown")
        : el("td", { class: "num", title: x.at }, fmtDur((now - x.at_ms) / 1000) + " ago"),
      el("td", { class: "mono msg" }, text),
      el("td", {}, el("button", { type: "button", class: "act",
        onclick: (ev) => { ev.stopPropagation(); replay(key, [{ partition: x.partition, offset: x.offset }]); } },
        "Replay")));
  });
  fillBody(document.getElementById("dlq-table"), dlqRows, dlqError || (d ? "No dead letter ✓" : "loading…"), 7);
}

function render() {
  const d = lastData;
  if (!d) return;
  renderHeader(d);
  renderKpis(d);
  renderCharts(d);
  renderTopics(d);
  renderGroups(d);
  renderTxs(d);
  renderConfig(d);
  renderQueues();
  document.body.dataset.ready = "1";
}

function setLive(ok, text) {
  const live = document.getElementById("live");
  live.className = "live " + (ok ? "ok" : "err");
  document.getElementById("live-text").textContent = text;
}

async function poll() {
  try {
    const r = await fetch("api/overview", { headers: HEADERS, cache: "no-store" });
    if (r.status === 401) throw new Error("authentication required: open this page with ?token=<authSecret>");
    if (!r.ok) throw new Error("broker answered HTTP " + r.status);
    lastData = await r.json();
    await pollQueues();
    failures = 0;
    document.getElementById("banner").hidden = true;
    setLive(true, "live");
    render();
  } catch (e) {
    failures++;
    setLive(false, failures > 2 ? "offline" : "retrying");
    const b = document.getElementById("banner");
    b.textContent = String(e.message || e);
    b.hidden = false;
  }
}

if (TOKEN) {
  for (const a of document.querySelectorAll("a[data-auth]")) {
    a.href = a.getAttribute("href") + "?token=" + encodeURIComponent(TOKEN);
  }
}
const hashDlq = /^#dlq=(.+\/.+)$/.exec(location.hash);
if (hashDlq) openDlq = decodeURIComponent(hashDlq[1]);
window.addEventListener("resize", render);
poll();
setInterval(poll, POLL_MS);
