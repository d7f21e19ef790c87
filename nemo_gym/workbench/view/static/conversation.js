// One rollout as a conversation: the prompt's messages, then the model's output items (reasoning, text, each tool
// call with its arguments and the tool's output), the verifier's own fields, usage, and the raw line on demand.
// Every text goes in with textContent: a rollout can hold anything, none of it is trusted as HTML.
"use strict";

// Keys of a rollout line that are not the verifier's own fields.
const FRAMEWORK_KEYS = new Set([
  "responses_create_params", "response", "reward", "reward_components", "agent_ref", "_ng_task_index", "_ng_rollout_index",
]);
const FAILURE_KEYS = new Set(["row", "result", "_ng_task_index", "_ng_rollout_index", "message", "agent_name", "error_type"]);

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid == null || kid === false) continue;
    node.append(kid instanceof Node ? kid : String(kid));
  }
  return node;
}

function fmtNumber(v, digits = 3) {
  if (v == null) return "–";
  return Number.isInteger(v) ? v.toLocaleString() : Number(v).toFixed(digits);
}

function plural(n, word) {
  return `${fmtNumber(n ?? 0)} ${word}${n === 1 ? "" : "s"}`;
}

function rewardBadge(reward) {
  const cls = reward == null ? "" : reward >= 1 ? "good" : reward <= 0 ? "bad" : "mid";
  return el("span", { class: `reward ${cls}`, title: "reward" }, reward == null ? "no reward" : fmtNumber(reward));
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return content == null ? "" : JSON.stringify(content, null, 2);
  return content
    .map((part) => {
      if (typeof part === "string") return part;
      if (!part || typeof part !== "object") return String(part);
      if (typeof part.text === "string") return part.text;
      if (typeof part.refusal === "string") return `[refusal] ${part.refusal}`;
      if (part.type && part.type.includes("image")) return "[image]";
      if (part.type && part.type.includes("file")) return `[file ${part.filename || ""}]`;
      return JSON.stringify(part);
    })
    .join("\n");
}

function prettyJson(text) {
  // Tool arguments and outputs are JSON text as often as not: indent them when they parse.
  if (typeof text !== "string") return { text: JSON.stringify(text, null, 2), ok: true };
  try {
    return { text: JSON.stringify(JSON.parse(text), null, 2), ok: true };
  } catch (e) {
    return { text, ok: false };
  }
}

function turn(kind, label, ...body) {
  return el("div", { class: `turn ${kind}` }, el("div", { class: "role" }, label), ...body);
}

function messageNode(item) {
  const role = item.role || "assistant";
  return turn(role, role, el("div", { class: "text" }, contentText(item.content)));
}

function reasoningNode(item) {
  const texts = [
    ...(Array.isArray(item.summary) ? item.summary : []),
    ...(Array.isArray(item.content) ? item.content : []),
  ].map((p) => (p && typeof p.text === "string" ? p.text : JSON.stringify(p)));
  const details = el("details", { open: true }, el("summary", {}, "reasoning"),
    el("div", { class: "text" }, texts.join("\n\n") || "(empty)"));
  return el("div", { class: "turn reasoning" }, details);
}

function toolCallNode(call, output) {
  const args = prettyJson(call.arguments ?? call.input ?? call.action ?? "");
  const name = call.name || call.type;
  const body = [
    el("div", {}, el("span", { class: "tool-name" }, name), args.ok ? null : el("span", { class: "tag" }, "arguments are not valid JSON")),
    el("pre", { class: "tool-args" }, args.text),
  ];
  if (output) {
    const out = prettyJson(output.output ?? "");
    body.push(el("div", { class: "role" }, "tool output"), el("pre", { class: "tool-output" }, out.text));
  } else {
    body.push(el("div", { class: "muted" }, "(no tool output)"));
  }
  return turn("tool-call", `tool call${call.call_id ? " · " + call.call_id : ""}`, ...body);
}

function conversationItems(row) {
  const params = (row && row.responses_create_params) || {};
  let input = params.input;
  if (typeof input === "string") input = [{ type: "message", role: "user", content: input }];
  const items = [];
  if (params.instructions) items.push({ type: "message", role: "system", content: params.instructions });
  if (Array.isArray(input)) items.push(...input);
  const output = row && row.response && Array.isArray(row.response.output) ? row.response.output : [];
  return { items: items.concat(output), promptCount: items.length };
}

function conversationNode(row) {
  const { items } = conversationItems(row);
  const outputs = new Map();
  for (const it of items) {
    if (it && typeof it.type === "string" && it.type.endsWith("_output") && it.call_id) outputs.set(it.call_id, it);
  }
  const shown = new Set();
  const nodes = [];
  for (const it of items) {
    if (!it || typeof it !== "object") continue;
    const type = it.type || (it.role ? "message" : "");
    if (type === "message") nodes.push(messageNode(it));
    else if (type === "reasoning") nodes.push(reasoningNode(it));
    else if (type.endsWith("_call")) {
      const out = outputs.get(it.call_id);
      if (out) shown.add(out);
      nodes.push(toolCallNode(it, out));
    } else if (type.endsWith("_output")) {
      if (!shown.has(it)) nodes.push(turn("tool-call", "tool output", el("pre", {}, prettyJson(it.output ?? "").text)));
    } else nodes.push(turn("other", type || "item", el("pre", {}, JSON.stringify(it, null, 2))));
  }
  return el("div", { class: "conversation" }, nodes.length ? nodes : el("p", { class: "muted" }, "(no messages)"));
}

function kvTable(obj) {
  const rows = Object.entries(obj).map(([k, v]) =>
    el("tr", {}, el("td", {}, k), el("td", {}, typeof v === "object" && v !== null
      ? el("pre", {}, JSON.stringify(v, null, 2)) : el("span", { class: "text" }, String(v)))));
  return el("table", { class: "kv" }, el("tbody", {}, rows));
}

function flatUsage(usage, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(usage || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) flatUsage(v, `${prefix}${k}.`, out);
    else out[prefix + k] = v;
  }
  return out;
}

// data: {info, row} as /api/rollout answers; opts: {compact, onTask, rank}
// The drift check of a rollout's token trajectory (nemo_gym/workbench/tokens.py): exact, re-tokenized, unusable.
const TRAJECTORY_LABELS = { exact: "exact", retokenized: "re-tokenized", unusable: "unusable" };
function trajectoryBadge(info) {
  if (!info.trajectory) return null;
  const label = TRAJECTORY_LABELS[info.trajectory] || info.trajectory;
  const text = info.trajectory === "unusable" && info.trajectory_reason ? `${label}: ${info.trajectory_reason}` : label;
  return el("span", { class: `traj traj-${info.trajectory}`, title: "token trajectory (ng export tokens)" }, text);
}

function rolloutNode(data, opts = {}) {
  const { info } = data;
  const isFailure = info.source === 1;
  // A failure the agent declared (a judge that failed, ...) keeps the agent's answer as `result`: show its episode.
  const row = isFailure ? (data.row && (data.row.result || data.row.row)) || {} : data.row || {};
  const where = `task ${info.task ?? "?"} · repeat ${info.rollout ?? "?"}`;
  const head = el("div", { class: "rollout-head" },
    opts.rank ? el("span", { class: "rank" }, opts.rank) : null,
    el("h2", {}, where),
    el("span", { class: "muted" }, info.agent || "(no agent)"),
    isFailure ? el("span", { class: "reward bad" }, "failed") : rewardBadge(info.reward),
    isFailure ? null : trajectoryBadge(info),
    isFailure ? null : el("span", { class: "muted" },
      [plural(info.turns, "turn"), plural(info.tool_calls, "tool call"), plural(info.tokens, "token")].join(" · ")),
    !opts.compact && info.task != null && !isFailure && opts.onTask
      ? el("button", { type: "button", class: "task-button", onclick: () => opts.onTask(info.file, info.task) }, "repeats side by side")
      : null);
  const parts = [head];
  if (typeof data.row !== "object" || data.row === null) {
    parts.push(el("div", { class: "error-box" }, `line ${info.line} is not a JSON object: `, el("pre", {}, String(data.row))));
    return el("div", { class: "rollout" }, parts);
  }
  if (info.status === "incomplete") {
    // Not a failure: verified (its reward is above) and kept in the output, but cut short.
    parts.push(el("div", { class: "warn-box" },
      el("strong", {}, `incomplete: ${info.error_type || "no reason given"}`),
      " · the response stopped early; it was verified and has a reward (ng export leaves it out unless --include-incomplete)"));
  } else if (info.status !== "ok") {
    const fields = isFailure
      ? Object.fromEntries(Object.entries(data.row).filter(([k, v]) => !FAILURE_KEYS.has(k) && v != null))
      : {};
    parts.push(el("div", { class: "error-box" },
      el("strong", {}, `${info.status}: ${info.error_type || ""}`),
      data.row.message || info.message ? el("pre", { class: "error-message" }, data.row.message || info.message) : null,
      Object.keys(fields).length ? kvTable(fields) : null));
  }
  parts.push(el("h3", {}, "conversation"), conversationNode(row));
  if (!isFailure) {
    const extra = Object.fromEntries(Object.entries(row).filter(([k]) => !FRAMEWORK_KEYS.has(k)));
    const components = row.reward_components;
    if (components && typeof components === "object") parts.push(el("h3", {}, "reward components"), kvTable(components));
    parts.push(el("h3", {}, "verifier fields"), Object.keys(extra).length ? kvTable(extra) : el("p", { class: "muted" }, "(none)"));
    const usage = row.response && row.response.usage;
    if (usage) parts.push(el("h3", {}, "usage"), kvTable(flatUsage(usage)));
  }
  if (!opts.compact) {
    const raw = el("pre", { class: "raw", hidden: true });
    const button = el("button", {
      type: "button",
      onclick: async () => {
        if (!raw.hidden) { raw.hidden = true; return; }
        const resp = await fetch(`/api/raw/${info.file}/${info.id}`);
        const text = await resp.text();
        try { raw.textContent = JSON.stringify(JSON.parse(text), null, 2); } catch (e) { raw.textContent = text; }
        raw.hidden = false;
      },
    }, "raw JSON");
    parts.push(el("h3", {}, `line ${info.line}`), button, raw);
  }
  return el("div", { class: "rollout" }, parts);
}
