// The viewer page: tabs (each titled with its count), the rollouts table (sort, filter, pages), the detail pane,
// the repeats of a task, the summary plots, and the incomplete and failed rollouts. Outcomes use the words of every
// nemo_gym tool (nemo_gym/rollouts/outcome.py): ok, incomplete (verified, stopped early), failed (no usable result).
// Everything comes from the JSON API of the local server (nemo_gym/workbench/view).
"use strict";

const $ = (sel) => document.querySelector(sel);
// Status first (and sticky): it stays in view however narrow the window is.
const COLUMNS = [
  { key: "status", label: "status" },
  { key: "file", label: "file", multi: true },
  { key: "task", label: "task", num: true },
  { key: "rollout", label: "repeat", num: true },
  { key: "agent", label: "agent" },
  { key: "reward", label: "reward", num: true },
  { key: "turns", label: "turns", num: true },
  { key: "tool_calls", label: "tool calls", num: true },
  { key: "tokens", label: "tokens", num: true },
  { key: "trajectory", label: "trajectory", tokens: true },
  { key: "preview", label: "prompt", sortable: false },
];
const PAGE = 50;
const state = {
  tab: "rollouts", sort: "line", desc: false, offset: 0, version: null, files: [],
  selected: null, task: null, threshold: null, tokenData: false,
  listOffset: { incomplete: 0, failed: 0 },
};
// The Incomplete and Failed tabs: one listing each, of the rows with that status.
const LISTINGS = {
  incomplete: { table: "#incomplete", info: "#i-page-info", prev: "#i-prev", next: "#i-next", reason: "reason", reward: true, empty: "no incomplete rollouts" },
  failed: { table: "#failures", info: "#f-page-info", prev: "#f-prev", next: "#f-next", reason: "error type", message: true, empty: "no failed rollouts" },
};
const TAB_LISTING = { incomplete: "incomplete", failures: "failed" };

// The table's columns: "file" only with several files, "trajectory" only when some rollout has token ids.
function visibleColumns() {
  return COLUMNS.filter((c) => (!c.multi || multiFile()) && (!c.tokens || state.tokenData));
}

async function api(path, params = {}) {
  const url = new URL(path, location.href);
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null && v !== false) url.searchParams.set(k, v);
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`${resp.status} ${(await resp.text()).slice(0, 300)}`);
  return resp.json();
}

function problem(where, err) {
  where.replaceChildren(el("div", { class: "problem" }, String(err.message || err)));
}

function multiFile() { return state.files.length > 1; }

function fileName(i) { return (state.files[i] && state.files[i].name) || `file ${i}`; }

// ---------------------------------------------------------------------------------------------------- status
async function refreshStatus() {
  const st = await api("/api/status");
  state.files = st.files;
  const tokensChanged = state.tokenData !== Boolean(st.token_data);
  state.tokenData = Boolean(st.token_data);
  const chips = st.files.map((f) => {
    const pct = f.bytes ? Math.floor((100 * f.indexed_bytes) / f.bytes) : 100;
    return el("span", { class: "file-chip", title: f.path },
      f.name,
      f.bad_lines ? `, ${f.bad_lines.toLocaleString()} bad line${f.bad_lines === 1 ? "" : "s"} skipped` : "",
      pct < 100 ? ` (indexing ${pct}%)` : "",
      f.error ? el("span", { class: "tag" }, f.error) : null);
  });
  $("#files").replaceChildren(...chips);
  renderOutcomes(st.outcomes);
  syncOptions($("#f-agent"), st.agents.map((a) => [a, a]));
  syncOptions($("#f-file"), st.files.map((f) => [String(f.file), f.name]));
  $("#f-file-label").hidden = !multiFile();
  const changed = state.version !== null && (state.version !== st.version || tokensChanged);
  const first = state.version === null;
  state.version = st.version;
  return { changed, first };
}

// The header's sentence (the one the collector prints) and the counts in the tab titles.
function renderOutcomes(o) {
  const p = o.phrases;  // worded by the server, as the collector words them (OutcomeCounts)
  $("#outcomes").replaceChildren(
    `${o.total} rollout${o.total === 1 ? "" : "s"}: `,
    el("span", { class: "status-ok" }, p.ok), ", ",
    el("span", { class: o.incomplete ? "status-incomplete" : "" }, p.incomplete), ", ",
    el("span", { class: o.failed ? "status-failed" : "" }, p.failed));
  $("#outcomes").dataset.text = o.text;
  setCount("#count-rollouts", o.total, "");
  setCount("#count-incomplete", o.incomplete, "warn");
  setCount("#count-failed", o.failed, "bad");
}

function setCount(sel, n, tone) {
  const node = $(sel);
  node.textContent = n == null ? "" : n.toLocaleString();
  node.className = `count${n && tone ? " " + tone : ""}`;
}

function syncOptions(select, pairs) {
  const have = [...select.options].slice(1).map((o) => o.value).join("\n");
  if (have === pairs.map((p) => p[0]).join("\n")) return;
  const current = select.value;
  select.replaceChildren(el("option", { value: "" }, "all"), ...pairs.map(([v, label]) => el("option", { value: v }, label)));
  select.value = current;
}

// ---------------------------------------------------------------------------------------------------- table
function filters() {
  return {
    q: $("#f-text").value.trim(),
    min_reward: $("#f-min").value,
    max_reward: $("#f-max").value,
    agent: $("#f-agent").value,
    status: $("#f-status").value,
    file: $("#f-file").value,
  };
}

function renderHead() {
  const cells = visibleColumns().map((c) => {
    const sortable = c.sortable !== false;
    const cls = [c.num ? "num" : "", ["preview", "status", "agent", "file"].includes(c.key) ? c.key : "", sortable ? "sortable" : "", state.sort === c.key ? "sorted" : "",
      state.sort === c.key && state.desc ? "desc" : ""].join(" ");
    return el("th", {
      class: cls, "data-key": c.key,
      onclick: sortable ? () => {
        if (state.sort === c.key) state.desc = !state.desc;
        else { state.sort = c.key; state.desc = c.key === "reward"; }
        state.offset = 0;
        loadTable();
      } : null,
    }, c.label);
  });
  $("#rollouts thead").replaceChildren(el("tr", {}, cells));
}

// A status cell: the outcome word in its colour, then the reason (incomplete, failed) in small type.
function statusCell(r) {
  const text = `${r.status}${r.error_type ? ": " + r.error_type : ""}`;
  return el("td", { class: `status status-${r.status}`, title: text, "data-status": r.status },
    r.status, r.error_type ? el("span", { class: "reason" }, r.error_type) : null);
}

function cell(c, r) {
  if (c.key === "file") return el("td", { class: "file", title: fileName(r.file) }, fileName(r.file));
  if (c.key === "reward") return el("td", { class: "num" }, r.source === 1 ? "–" : fmtNumber(r.reward));
  if (c.key === "status") return statusCell(r);
  if (c.key === "agent") return el("td", { class: "agent", title: r.agent || "" }, r.agent ?? "");
  if (c.key === "trajectory") return el("td", {}, trajectoryBadge(r) || "–");
  if (c.key === "preview") return el("td", { class: "preview", title: r.preview || "" }, r.preview || "");
  if (c.num) return el("td", { class: "num" }, fmtNumber(r[c.key]));
  return el("td", {}, r[c.key] ?? "");
}

let tableRequest = 0;
async function loadTable() {
  const mine = ++tableRequest;
  renderHead();
  try {
    const data = await api("/api/rows", { ...filters(), sort: state.sort, desc: state.desc ? "true" : "", offset: state.offset, limit: PAGE });
    if (mine !== tableRequest) return;  // a newer request was made meanwhile
    const cols = visibleColumns();
    const rows = data.rows.map((r) => {
      const key = `${r.file}:${r.id}`;
      return el("tr", {
        class: "rollout-row" + (state.selected === key ? " selected" : ""), "data-key": key,
        onclick: (ev) => { selectRow(r.file, r.id); markSelected(ev.currentTarget); },
      }, cols.map((c) => cell(c, r)));
    });
    $("#rollouts tbody").replaceChildren(...rows);
    const end = Math.min(data.total, state.offset + data.rows.length);
    $("#page-info").textContent = data.total
      ? `${(state.offset + 1).toLocaleString()}–${end.toLocaleString()} of ${data.total.toLocaleString()}`
      : "no rollouts match";
    $("#page-info").dataset.total = data.total;
    $("#prev").disabled = state.offset === 0;
    $("#next").disabled = end >= data.total;
  } catch (err) {
    problem($("#rollouts tbody"), err);
  }
}

function markSelected(tr) {
  for (const row of document.querySelectorAll("#rollouts tr.selected")) row.classList.remove("selected");
  if (tr) tr.classList.add("selected");
}

async function selectRow(file, id) {
  state.selected = `${file}:${id}`;
  const pane = $("#detail");
  try {
    const data = await api(`/api/rollout/${file}/${id}`);
    pane.replaceChildren(rolloutNode(data, { onTask: showTask }));
    pane.scrollTop = 0;
  } catch (err) {
    problem(pane, err);
  }
}

// ---------------------------------------------------------------------------------------------------- repeats
async function showTask(file, task) {
  state.task = { file, task };
  $("#task-tab").hidden = false;
  setCount("#count-task", null);
  switchTab("task");
}

async function loadTask() {
  if (!state.task) return;
  const { file, task } = state.task;
  const allFiles = $("#all-files") ? $("#all-files").checked : false;
  try {
    const data = await api(`/api/task/${file}/${task}`, { all_files: allFiles ? "true" : "" });
    const head = [el("h2", {}, `task ${task}: ${data.total} rollout${data.total === 1 ? "" : "s"}`),
      el("span", { class: "muted" }, "best reward first, then the worst, then the rest")];
    if (multiFile()) {
      head.push(el("label", {}, el("input", { type: "checkbox", id: "all-files", checked: allFiles, onchange: loadTask }),
        " same task index in every file"));
    }
    if (data.total > data.rows.length) head.push(el("span", { class: "muted" }, `(showing ${data.rows.length})`));
    $("#task-head").replaceChildren(...head);
    setCount("#count-task", data.total, "");
    const n = data.rows.length;
    $("#repeats").replaceChildren(...data.rows.map((d, i) => {
      const rank = n > 1 && i === 0 ? "best" : n > 1 && i === 1 ? "worst" : "";
      const label = [rank, multiFile() ? fileName(d.info.file) : ""].filter(Boolean).join(" · ");
      return el("div", { class: "repeat" }, rolloutNode(d, { compact: true, rank: label }));
    }));
  } catch (err) {
    problem($("#repeats"), err);
  }
}

// ---------------------------------------------------------------------------------------------------- summary
async function loadSummary() {
  try {
    const s = await api("/api/summary", { threshold: state.threshold });
    const input = $("#threshold");
    if (state.threshold == null && document.activeElement !== input) input.value = s.pass_threshold;
    const charts = [];
    const h = s.histogram;
    const binLabel = (b) => (h.discrete ? fmtNumber(b.lo) : `${b.lo.toFixed(2)}–${b.hi.toFixed(2)}`);
    charts.push(barChart(`reward histogram (${h.count.toLocaleString()} rewarded rollouts)`,
      h.bins.map((b) => ({ label: binLabel(b), value: b.count })), { format: (v) => v.toLocaleString(), integer: true }));
    charts.push(barChart("mean reward per agent", s.agents.map((a) => ({ label: a.agent, value: a.mean_reward || 0 })),
      { format: (v) => v.toFixed(2), color: "#1f8a4c", max: Math.max(1, ...s.agents.map((a) => a.mean_reward || 0)) }));
    const series = s.agents.filter((a) => a.pass_at_k.length).map((a) => ({ name: a.agent, points: a.pass_at_k.map((p) => [p.k, p.value]) }));
    charts.push(series.length ? lineChart(`pass@k per agent (reward ≥ ${s.pass_threshold})`, series)
      : chartBox("pass@k per agent", el("p", { class: "muted" }, "no rewarded rollouts yet")));
    // Incomplete rollouts (amber: verified, a reward) and failed ones (red: no result), by reason.
    const notOk = [
      ...s.incomplete.map((f) => ({ label: f.reason, value: f.count, color: "#b7791f", title: `incomplete: ${f.reason}: ${f.count}` })),
      ...s.failures.map((f) => ({ label: f.error_type, value: f.count, color: "#c0392b", title: `failed: ${f.error_type}: ${f.count}` })),
    ];
    charts.push(notOk.length
      ? barChart("incomplete (amber) and failed (red) rollouts, by reason", notOk, { format: (v) => v.toLocaleString(), integer: true })
      : chartBox("incomplete and failed rollouts, by reason", el("p", { class: "muted" }, "none: every rollout is ok")));
    $("#charts").replaceChildren(...charts);
    renderTrajectories(s.trajectories);
    const maxK = Math.max(0, ...s.agents.map((a) => a.pass_at_k.length));
    const ks = [...new Set([1, maxK])].filter((k) => k > 0);
    $("#agent-table").replaceChildren(
      el("thead", {}, el("tr", {}, ["agent", "tasks", "rollouts", "ok", "incomplete", "failed", "mean reward", "mean tokens", ...ks.map((k) => `pass@${k}`)]
        .map((t, i) => el("th", { class: i ? "num" : "" }, t)))),
      el("tbody", {}, s.agents.map((a) => el("tr", {},
        el("td", {}, a.agent), ...[a.tasks, a.rollouts, a.ok, a.incomplete, a.failed, a.mean_reward, a.mean_tokens].map((v) => el("td", { class: "num" }, fmtNumber(v))),
        ...ks.map((k) => el("td", { class: "num" }, fmtNumber((a.pass_at_k[k - 1] || {}).value)))))));
  } catch (err) {
    problem($("#charts"), err);
  }
}

// The drift check counts: exact / re-tokenized / unusable (per reason); hidden when no rollout has token ids.
function renderTrajectories(t) {
  const box = $("#trajectories");
  box.hidden = !t;
  if (!t) return box.replaceChildren();
  const total = t.exact + t.retokenized + t.unusable;
  const reasons = Object.entries(t.reasons).map(([r, n]) => `${r} ${n.toLocaleString()}`).join(", ");
  box.replaceChildren(
    el("h4", {}, `token trajectories (${total.toLocaleString()} rollouts)`),
    el("span", { class: "traj traj-exact", "data-kind": "exact" }, `exact ${t.exact.toLocaleString()}`), " ",
    el("span", { class: "traj traj-retokenized", "data-kind": "retokenized" }, `re-tokenized ${t.retokenized.toLocaleString()}`), " ",
    el("span", { class: "traj traj-unusable", "data-kind": "unusable" }, `unusable ${t.unusable.toLocaleString()}`),
    reasons ? el("span", { class: "muted" }, ` (${reasons})`) : null);
}

// ---------------------------------------------------------------------------------------------------- incomplete, failed
async function loadListing(status) {
  const spec = LISTINGS[status];
  const offset = state.listOffset[status];
  try {
    const data = await api("/api/failures", { status, offset, limit: PAGE });
    const heads = [...(multiFile() ? ["file"] : []), "status", "task", "repeat", "agent", ...(spec.reward ? ["reward"] : []),
      spec.reason, ...(spec.message ? ["message"] : [])];
    const numeric = new Set(["task", "repeat", "reward"]);
    $(`${spec.table} thead`).replaceChildren(el("tr", {}, heads.map((t) => el("th", { class: numeric.has(t) ? "num" : "" }, t))));
    $(`${spec.table} tbody`).replaceChildren(...data.rows.map((r) => el("tr", {
      class: "listing-row",
      onclick: () => { switchTab("rollouts"); selectRow(r.file, r.id); },
    },
    multiFile() ? el("td", {}, fileName(r.file)) : null,
    el("td", { class: `status-${r.status}` }, r.status),
    el("td", { class: "num" }, fmtNumber(r.task)), el("td", { class: "num" }, fmtNumber(r.rollout)), el("td", {}, r.agent || ""),
    spec.reward ? el("td", { class: "num" }, fmtNumber(r.reward)) : null,
    el("td", {}, r.error_type || ""),
    spec.message ? el("td", { class: "message" }, r.message || "") : null)));
    const end = Math.min(data.total, offset + data.rows.length);
    const lines = data.total !== data.rollouts ? ` (${data.total.toLocaleString()} lines of ${data.rollouts.toLocaleString()} rollouts: one per attempt)` : "";
    $(spec.info).textContent = data.total ? `${offset + 1}–${end} of ${data.total.toLocaleString()}${lines}` : spec.empty;
    $(spec.prev).disabled = offset === 0;
    $(spec.next).disabled = end >= data.total;
  } catch (err) {
    problem($(`${spec.table} tbody`), err);
  }
}

function pageListing(status, step) {
  state.listOffset[status] = Math.max(0, state.listOffset[status] + step);
  loadListing(status);
}

// ---------------------------------------------------------------------------------------------------- wiring
function switchTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
  for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== `tab-${tab}`;
  reloadTab();
}

function reloadTab() {
  if (state.tab === "rollouts") return loadTable();
  if (state.tab === "summary") return loadSummary();
  if (TAB_LISTING[state.tab]) return loadListing(TAB_LISTING[state.tab]);
  if (state.tab === "task") return loadTask();
}

let debounce = null;
function onFilter() {
  clearTimeout(debounce);
  debounce = setTimeout(() => { state.offset = 0; loadTable(); }, 250);
}

function wire() {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => switchTab(b.dataset.tab));
  for (const id of ["#f-text", "#f-min", "#f-max"]) $(id).addEventListener("input", onFilter);
  for (const id of ["#f-agent", "#f-file", "#f-status"]) $(id).addEventListener("change", onFilter);
  $("#f-clear").addEventListener("click", () => {
    for (const id of ["#f-text", "#f-min", "#f-max", "#f-agent", "#f-file", "#f-status"]) $(id).value = "";
    onFilter();
  });
  $("#prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadTable(); });
  $("#next").addEventListener("click", () => { state.offset += PAGE; loadTable(); });
  for (const [status, spec] of Object.entries(LISTINGS)) {
    $(spec.prev).addEventListener("click", () => pageListing(status, -PAGE));
    $(spec.next).addEventListener("click", () => pageListing(status, PAGE));
  }
  $("#threshold").addEventListener("change", () => {
    const v = parseFloat($("#threshold").value);
    state.threshold = Number.isFinite(v) ? v : null;
    loadSummary();
  });
}

async function poll() {
  try {
    const { changed } = await refreshStatus();
    $("#live-info").textContent = "";
    // Live: new lines in the files show up without a click. The repeats view is left as it is (it is a comparison).
    if (changed && $("#live").checked && state.tab !== "task") await reloadTab();
  } catch (err) {
    $("#live-info").textContent = "viewer not reachable";
  }
}

async function start() {
  wire();
  try { await refreshStatus(); } catch (err) { $("#live-info").textContent = String(err.message || err); }
  await loadTable();
  setInterval(poll, 2000);
}

start();
