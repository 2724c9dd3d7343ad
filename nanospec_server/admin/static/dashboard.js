// nanospec-server dashboard: polls /stats/vocab, draws plain SVG, changes W_max with the admin key.
// `?workers=URL,URL` shows a fleet: the browser reads each worker itself (SGLang's app allows
// any origin) and sums their raw figures; a W_max change goes to every worker.
"use strict";

const PARAMS = new URLSearchParams(location.search);
const POLL_MS = Number(PARAMS.get("interval")) || 1000;
// "" is this page's own server; a worker is named by its host:port, as `nanospec stats` does.
const WORKERS = (PARAMS.get("workers") || "").split(",").map((u) => u.trim().replace(/\/+$/, ""))
  .filter(Boolean);
if (!WORKERS.length) WORKERS.push("");
const workerName = (url) => (url ? new URL(url).host : location.host);
// Raw sums of /stats/vocab's aggregates; the means are derived from them, as the server does.
const SUMMED = ["requests_finished", "requests_aborted", "requests_running", "prompt_tokens",
  "output_tokens", "draft_steps", "emitted_tokens", "covered_tokens", "active_vocab_sum",
  "lm_head_rows_computed", "lm_head_rows_full_vocab", "state_bytes"];
const HISTORY = 60; // polls kept per running request in the charts
const series = new Map(); // rid -> [{active, coverage, accept}]
const $ = (id) => document.getElementById(id);

function fmt(value, digits = 2) {
  if (value === null || value === undefined) return "-";
  return typeof value === "number" && !Number.isInteger(value) ? value.toFixed(digits) : String(value);
}

function cards(container, items) {
  container.replaceChildren(...items.map(([label, value]) => {
    const card = document.createElement("div");
    card.className = "card";
    const l = document.createElement("div");
    l.className = "label";
    l.textContent = label;
    const v = document.createElement("div");
    v.className = "value";
    v.textContent = value;
    v.dataset.name = label;
    card.append(l, v);
    return card;
  }));
}

function colour(rid) {
  let hash = 0;
  for (const ch of rid) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${hash % 360} 65% 42%)`;
}

function drawChart(svg, key) {
  const width = 320, height = 120, pad = 4;
  const values = [...series.values()].flat().map((p) => p[key]).filter((v) => v !== null);
  const max = Math.max(1e-9, ...values);
  const lines = [];
  for (const [rid, points] of series) {
    const xy = points
      .map((p, i) => (p[key] === null ? null : [
        pad + (i + HISTORY - points.length) * (width - 2 * pad) / (HISTORY - 1),
        height - pad - (p[key] / max) * (height - 2 * pad),
      ]))
      .filter(Boolean);
    if (!xy.length) continue;
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour(rid));
    line.setAttribute("stroke-width", "2");
    line.dataset.rid = rid;
    lines.push(line);
  }
  const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
  label.setAttribute("x", "6");
  label.setAttribute("y", "14");
  label.setAttribute("font-size", "11");
  label.textContent = values.length ? `max ${fmt(max)}` : "no running request";
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren(label, ...lines);
}

function combine(replies) {
  const a = Object.fromEntries(SUMMED.map((k) => [k, replies.reduce((t, r) => t + r.aggregates[k], 0)]));
  const ratio = (x, y) => (y ? x / y : null);
  a.active_vocab_mean = ratio(a.active_vocab_sum, a.draft_steps);
  a.coverage_mean = ratio(a.covered_tokens, a.emitted_tokens);
  a.accept_length_mean = ratio(a.emitted_tokens, a.draft_steps);
  const computed = ratio(a.lm_head_rows_computed, a.lm_head_rows_full_vocab);
  a.lm_head_rows_saved_fraction = computed === null ? null : 1 - computed;
  return a;
}

function renderWorkers(results) {
  $("workers-section").hidden = results.length < 2;
  $("workers").replaceChildren(...results.map(({ worker, stats, error }) => {
    const row = document.createElement("tr");
    row.dataset.worker = worker;
    const a = stats ? stats.aggregates : null;
    const values = stats ? [worker, stats.ranks.length, stats.settings.w_max, a.requests_running,
      a.requests_finished, a.requests_aborted, fmt(a.accept_length_mean), fmt(a.coverage_mean, 3)]
      : [worker, `unreachable: ${error}`];
    for (const value of values) {
      const cell = document.createElement("td");
      cell.textContent = fmt(value);
      row.append(cell);
    }
    return row;
  }));
}

function render(results) {
  const answered = results.filter((r) => r.stats);
  const stats = {
    settings: answered[0].stats.settings,
    aggregates: combine(answered.map((r) => r.stats)),
    ranks: answered.flatMap((r) => r.stats.ranks),
    requests: answered.flatMap((r) => r.stats.requests.map((q) => ({ ...q, worker: r.worker })))
      .sort((x, y) => (x.state !== "running") - (y.state !== "running")
        || (y.finished_at || 0) - (x.finished_at || 0)),
  };
  renderWorkers(results);
  const s = stats.settings;
  const wMaxes = [...new Set(answered.map((r) => r.stats.settings.w_max))];
  cards($("settings"), [["mode", s.mode], ["W_max", wMaxes.join(" / ")], ["W_cap", s.w_cap],
    ["K_pre", s.k_pre], ["K_ver", s.k_ver]]);
  if (document.activeElement !== $("w-max-input") && !$("w-max-input").value) {
    $("w-max-input").max = s.w_cap;
  }
  const a = stats.aggregates;
  cards($("aggregates"), [
    ["running", a.requests_running], ["finished", a.requests_finished],
    ["aborted", a.requests_aborted],
    ["prompt tokens", a.prompt_tokens], ["output tokens", a.output_tokens],
    ["active vocab mean", fmt(a.active_vocab_mean, 1)], ["coverage", fmt(a.coverage_mean, 3)],
    ["accept length", fmt(a.accept_length_mean)],
    ["LM-head rows saved", a.lm_head_rows_saved_fraction === null ? "-"
      : `${(100 * a.lm_head_rows_saved_fraction).toFixed(1)}%`],
    ["state", `${(a.state_bytes / 2 ** 20).toFixed(1)} MiB`],
    ["DP ranks", stats.ranks.length], ["workers", `${answered.length} of ${results.length}`],
  ]);

  const running = stats.requests.filter((r) => r.state === "running");
  for (const rid of series.keys()) {
    if (!running.some((r) => r.rid === rid)) series.delete(rid);
  }
  for (const r of running) {
    const points = series.get(r.rid) || [];
    points.push({ active: r.active_vocab_size, coverage: r.coverage, accept: r.accept_length_mean });
    series.set(r.rid, points.slice(-HISTORY));
  }
  drawChart($("chart-active"), "active");
  drawChart($("chart-coverage"), "coverage");
  drawChart($("chart-accept"), "accept");

  $("requests").replaceChildren(...stats.requests.map((r) => {
    const row = document.createElement("tr");
    row.className = r.state;
    row.dataset.rid = r.rid;
    for (const value of [r.rid.slice(0, 12), r.state, r.dp_rank, r.prompt_tokens, r.output_tokens,
      r.w_max, r.active_vocab_size, fmt(r.active_vocab_mean, 1), fmt(r.coverage, 3),
      fmt(r.accept_length_mean), r.draft_steps, r.worker]) {
      const cell = document.createElement("td");
      cell.textContent = fmt(value);
      row.append(cell);
    }
    return row;
  }));
}

async function readWorker(url) {
  const worker = workerName(url);
  try {
    const response = await fetch(`${url}/stats/vocab?limit=50`);
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    return { worker, stats: await response.json() };
  } catch (error) {
    return { worker, error: error.message };
  }
}

async function poll() {
  const results = await Promise.all(WORKERS.map(readWorker));
  const failed = results.filter((r) => r.error);
  try {
    if (failed.length === results.length) throw new Error(failed.map((r) => r.error).join("; "));
    render(results);
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`
      + (failed.length ? ` (${failed.length} worker(s) unreachable)` : "");
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
  setTimeout(poll, POLL_MS);
}

async function postWMax(url, headers, wMax) {
  const response = await fetch(`${url}/nanospec/settings`, {
    method: "POST", headers, body: JSON.stringify({ w_max: wMax }),
  });
  const body = await response.json().catch(() => ({}));
  return { worker: workerName(url), response, body };
}

$("w-max-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const result = $("w-max-result");
  const headers = { "Content-Type": "application/json" };
  const key = $("admin-key-input").value;
  if (key) headers["X-Admin-Key"] = key;
  const wMax = Number($("w-max-input").value);
  let replies;
  try {
    replies = await Promise.all(WORKERS.map((url) => postWMax(url, headers, wMax)));
  } catch (error) {
    result.className = "error";
    result.textContent = `not sent: ${error.message}`;
    return;
  }
  const refused = replies.filter((r) => !r.response.ok);
  const where = (r) => (WORKERS.length > 1 ? ` by ${r.worker}` : "");
  result.className = refused.length ? "error" : "ok";
  result.textContent = refused.length ? refused.map((r) => `refused${where(r)} (${r.response.status}): `
    + `${r.body.detail || r.body.message || r.body.error || "unknown error"}`).join("; ")
    : `W_max is now ${replies[0].body.w_max}` + (WORKERS.length > 1 ? ` on ${replies.length} workers` : "");
});

// A ?workers= link decides where the key typed below goes: say so, so that a link that
// names a stranger's host is seen before the key is sent there.
$("w-max-targets").textContent = `The change and the key go to: ${WORKERS.map(workerName).join(", ")}`;
poll();
