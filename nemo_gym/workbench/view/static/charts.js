// SVG charts drawn by the page itself (no chart library, nothing fetched): bars and lines.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b6fd8", "#e07b39", "#1f8a4c", "#9b59b6", "#c0392b", "#16a5a5", "#b7791f", "#7f8c8d"];

function svg(tag, attrs, ...kids) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const kid of kids) node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return node;
}

function chartBox(title, body, legend) {
  const box = document.createElement("div");
  box.className = "chart";
  const h = document.createElement("h4");
  h.textContent = title;
  box.append(h);
  if (legend) box.append(legend);
  box.append(body);
  return box;
}

// Axis ticks from 0 to at least `max`: a round step (1, 2 or 5 times a power of ten), at most 5 steps.
function ticks(max, integer = false) {
  if (!(max > 0)) max = 1;
  const rough = max / 5, p = Math.pow(10, Math.floor(Math.log10(rough)));
  const step = Math.max(integer ? 1 : 0, [1, 2, 5, 10].map((m) => m * p).find((s) => s >= rough));
  const out = [];
  for (let v = 0; v < max + step / 2; v += step) out.push(Number(v.toPrecision(12)));
  if (out[out.length - 1] < max) out.push(Number((out[out.length - 1] + step).toPrecision(12)));
  return out;
}

// bars: [{label, value, title?, color?}]; opts: {max, format, color, integer (counts: whole-number ticks)}
function barChart(title, bars, opts = {}) {
  const W = 420, H = 220, left = 44, bottom = 46, top = 12, right = 10;
  const axis = ticks(opts.max ?? Math.max(0, ...bars.map((b) => b.value || 0)), opts.integer);
  const max = axis[axis.length - 1];
  const fmt = opts.format || ((v) => String(v));
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": title });
  const plotH = H - top - bottom, plotW = W - left - right;
  for (const v of axis) {
    const y = top + plotH - (plotH * v) / max;
    root.append(svg("line", { x1: left, x2: W - right, y1: y, y2: y, stroke: "#e2e2e6" }));
    root.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, fmt(v)));
  }
  const slot = plotW / Math.max(1, bars.length);
  bars.forEach((b, i) => {
    const h = max ? (plotH * Math.max(0, b.value || 0)) / max : 0;
    const x = left + i * slot + slot * 0.12;
    const rect = svg("rect", {
      x, y: top + plotH - h, width: Math.max(1, slot * 0.76), height: h, fill: b.color || opts.color || PALETTE[0], rx: 2,
    });
    rect.append(svg("title", {}, b.title || `${b.label}: ${fmt(b.value)}`));
    root.append(rect);
    if (bars.length <= 24) {
      const label = String(b.label);
      const short = label.length > 14 ? label.slice(0, 13) + "…" : label;
      const lx = left + i * slot + slot / 2, ly = top + plotH + 14;
      const t = svg("text", { x: lx, y: ly, "text-anchor": bars.length > 8 ? "end" : "middle" }, short);
      if (bars.length > 8) t.setAttribute("transform", `rotate(-40 ${lx} ${ly})`);
      root.append(t);
    }
  });
  return chartBox(title, root);
}

// series: [{name, points: [[x, y], ...]}]; y from 0 to opts.max (default 1)
function lineChart(title, series, opts = {}) {
  const W = 420, H = 220, left = 44, bottom = 30, top = 12, right = 14;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const xMin = Math.min(...xs, 1), xMax = Math.max(...xs, 2);
  const yMax = opts.max ?? 1;
  const plotH = H - top - bottom, plotW = W - left - right;
  const X = (x) => left + ((x - xMin) / Math.max(1e-9, xMax - xMin)) * plotW;
  const Y = (y) => top + plotH - (plotH * y) / yMax;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": title });
  for (let i = 0; i <= 4; i++) {
    const y = Y((yMax * i) / 4);
    root.append(svg("line", { x1: left, x2: W - right, y1: y, y2: y, stroke: "#e2e2e6" }));
    root.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, ((yMax * i) / 4).toFixed(2)));
  }
  const step = Math.max(1, Math.ceil((xMax - xMin) / 10));
  for (let x = xMin; x <= xMax; x += step) {
    root.append(svg("text", { x: X(x), y: H - bottom + 16, "text-anchor": "middle" }, `k=${x}`));
  }
  const legend = document.createElement("div");
  legend.className = "legend";
  series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${X(p[0])},${Y(p[1])}`).join(" ");
    root.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2 }));
    for (const p of s.points) {
      const dot = svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: color });
      dot.append(svg("title", {}, `${s.name}: pass@${p[0]} = ${p[1].toFixed(3)}`));
      root.append(dot);
    }
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color;
    item.append(sw, s.name);
    legend.append(item);
  });
  return chartBox(title, root, legend);
}
