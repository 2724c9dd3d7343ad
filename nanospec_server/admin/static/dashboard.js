// nanospec-server dashboard: polls /stats/vocab, draws plain SVG, changes W_max with the admin key.
"use strict";

const POLL_MS = Number(new URLSearchParams(location.search).get("interval")) || 1000;
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

function render(stats) {
  const s = stats.settings;
  cards($("settings"), [["mode", s.mode], ["W_max", s.w_max], ["W_cap", s.w_cap],
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
    ["DP ranks", stats.ranks.length],
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
      fmt(r.accept_length_mean), r.draft_steps]) {
      const cell = document.createElement("td");
      cell.textContent = fmt(value);
      row.append(cell);
    }
    return row;
  }));
}

async function poll() {
  try {
    const response = await fetch("/stats/vocab?limit=50");
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    render(await response.json());
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
  setTimeout(poll, POLL_MS);
}

$("w-max-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const result = $("w-max-result");
  const headers = { "Content-Type": "application/json" };
  const key = $("admin-key-input").value;
  if (key) headers["X-Admin-Key"] = key;
  const response = await fetch("/nanospec/settings", {
    method: "POST", headers, body: JSON.stringify({ w_max: Number($("w-max-input").value) }),
  });
  const body = await response.json().catch(() => ({}));
  result.className = response.ok ? "ok" : "error";
  result.textContent = response.ok ? `W_max is now ${body.w_max}`
    : `refused (${response.status}): ${body.detail || body.error || "unknown error"}`;
});

poll();
