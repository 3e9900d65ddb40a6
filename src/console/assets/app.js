// The idem console's page. Everything that comes from the store (keys,
// tenants, operations, answers) is attacker-controlled: it is put in the
// document with textContent only, never parsed as HTML.
"use strict";

const csrf = document.querySelector('meta[name="idem-csrf"]').content;
const PAGE = 50;
const HISTORY = 60;
const state = { offset: 0, total: 0, filter: {}, detail: null, history: {}, calls: null };

function $(id) { return document.getElementById(id); }

function text(el, s) { el.textContent = s === undefined || s === null ? "" : String(s); }

function shown(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (v.hex !== undefined) return "(bytes, hex) " + v.hex;
  return JSON.stringify(v);
}

function when(ms) {
  return ms > 0 ? new Date(ms).toISOString().replace(".000Z", "Z") : "-";
}

function age(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}

// A record's state as an operator reads it: a holder whose lease has
// ended is acting no more, and the record waits like an unknown outcome.
function stateOf(r) {
  return r.state === "in_progress" && r.lease_ended ? "in_progress (lease ended)" : r.state;
}

function say(msg, bad) {
  const m = $("message");
  text(m, msg);
  m.className = bad ? "bad" : "good";
}

async function api(path, body) {
  const init = { credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.headers["X-CSRF-Token"] = csrf;
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) { location.reload(); throw new Error("logged out"); }
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((j.title || r.statusText) + (j.detail ? ": " + j.detail : ""));
  return j;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "") q.set(k, v);
  return q.toString();
}

function cell(tr, value, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  text(td, value);
  tr.appendChild(td);
  return td;
}

function row(tbody, r, cols) {
  const tr = document.createElement("tr");
  tr.className = "record";
  tr.tabIndex = 0;
  for (const [value, cls] of cols) cell(tr, value, cls);
  const open = () => showRecord(r.tenant, r.operation, r.key);
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  tbody.appendChild(tr);
}

async function loadUnknown() {
  const j = await api("/api/records?" + query({ state: "unknown", limit: 100 }));
  const tbody = $("unknown-list").tBodies[0];
  tbody.replaceChildren();
  // The oldest wait first: they have waited longest for a person.
  const list = j.records.slice().reverse();
  for (const r of list)
    row(tbody, r, [[r.key, "key"], [r.operation, "operation"], [r.tenant, "tenant"], [age(r.age_ms), "age"], [r.attempt, "attempt"]]);
  $("unknown-none").hidden = list.length > 0;
}

async function loadRecords() {
  const f = state.filter;
  const j = await api("/api/records?" + query({ state: f.state, operation: f.operation, tenant: f.tenant, prefix: f.prefix, offset: state.offset, limit: PAGE }));
  state.total = j.total;
  const tbody = $("records").tBodies[0];
  tbody.replaceChildren();
  for (const r of j.records)
    row(tbody, r, [[r.key, "key"], [stateOf(r), "state"], [r.operation, "operation"], [r.tenant, "tenant"], [r.attempt, "attempt"], [when(r.updated_ms), "updated"]]);
  const last = Math.min(state.offset + j.records.length, j.total);
  text($("page-info"), j.total ? (state.offset + 1) + "-" + last + " of " + j.total : "no records");
  $("prev").disabled = state.offset === 0;
  $("next").disabled = last >= j.total || state.offset + PAGE >= 10000;
}

function spark(svg, values) {
  svg.replaceChildren();
  if (values.length < 2) return;
  const max = Math.max(1, ...values);
  const step = 120 / (HISTORY - 1);
  const start = HISTORY - values.length;
  const points = values.map((v, i) => ((start + i) * step).toFixed(1) + "," + (29 - (v / max) * 27).toFixed(1)).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.appendChild(line);
}

function remember(name, v) {
  const h = state.history[name] || (state.history[name] = []);
  h.push(v);
  if (h.length > HISTORY) h.shift();
  return h;
}

async function loadMetrics() {
  const j = await api("/api/metrics");
  for (const name of ["unknown", "in_progress", "completed", "recovered"]) {
    const n = j.records[name];
    text($("count-" + name), n + (j.at_least && j.at_least[name] ? "+" : ""));
    spark($("chart-" + name), remember(name, n));
  }
  if (j.calls) {
    $("rates").hidden = false;
    const now = j.now_ms;
    const list = $("rate-list");
    if (state.calls) {
      const dt = Math.max(1, now - state.calls.at) / 1000;
      list.replaceChildren();
      for (const name of ["proceed", "replay", "conflict", "in_flight", "unknown", "recover"]) {
        if (j.calls[name] === undefined) continue;
        const rate = Math.max(0, (j.calls[name] - (state.calls.values[name] || 0)) / dt);
        const div = document.createElement("div");
        div.className = "count";
        const label = document.createElement("span");
        label.className = "label";
        text(label, name.replace("_", " "));
        const n = document.createElement("span");
        n.className = "n";
        n.id = "rate-" + name;
        text(n, rate.toFixed(1));
        const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
        svg.setAttribute("class", "chart");
        svg.setAttribute("viewBox", "0 0 120 30");
        spark(svg, remember("rate-" + name, rate));
        div.append(label, n, svg);
        list.appendChild(div);
      }
    }
    state.calls = { at: now, values: j.calls };
  }
}

async function showRecord(tenant, operation, key) {
  let r;
  try {
    r = await api("/api/records/show?" + query({ tenant, operation, key }));
  } catch (e) {
    say(e.message, true);
    return;
  }
  state.detail = { tenant, operation, key, state: r.state };
  text($("detail-key"), r.key);
  text($("detail-state"), stateOf(r));
  text($("detail-operation"), r.operation);
  text($("detail-tenant"), r.tenant);
  text($("detail-attempt"), r.attempt);
  text($("detail-recovered"), r.recovered ? "yes: an earlier attempt may also have acted" : "no");
  text($("detail-created"), when(r.created_ms));
  text($("detail-updated"), when(r.updated_ms) + " (" + age(r.age_ms) + " ago)");
  text($("detail-lease"), when(r.lease_expires_ms));
  text($("detail-expires"), when(r.expires_ms));
  text($("detail-fingerprint"), r.fingerprint);
  text($("detail-status"), r.response ? r.response.status : "-");
  text($("detail-answer"), r.response ? shown(r.response.body) : (r.sealed ? "(sealed: " + r.sealed + ")" : "(none yet)"));
  text($("detail-request"), shown(r.request) || "(not kept)");
  $("actions").hidden = r.state === "completed" || r.state === "recovered";
  $("resolve-released").disabled = false;
  $("detail").hidden = false;
  $("detail").scrollIntoView({ block: "nearest" });
}

function confirmThen(message) {
  const d = $("confirm");
  text($("confirm-text"), message);
  return new Promise((resolve) => {
    const done = (yes) => {
      $("confirm-yes").onclick = $("confirm-no").onclick = null;
      d.close();
      resolve(yes);
    };
    $("confirm-yes").onclick = () => done(true);
    $("confirm-no").onclick = () => done(false);
    d.showModal();
  });
}

async function act(outcome) {
  const d = state.detail;
  if (!d) return;
  const body = { tenant: d.tenant, operation: d.operation, key: d.key };
  if ($("resolve-force").checked) body.force = true;
  let what;
  if (outcome === "delete") {
    what = "Delete the record of key “" + d.key + "”? A retry then acts again.";
  } else {
    body.outcome = outcome;
    const s = $("resolve-status").value.trim();
    const b = $("resolve-body").value;
    if (outcome !== "released") {
      if (s !== "") body.status = Number(s);
      if (b !== "") body.body = b;
    }
    what = {
      completed: "Resolve key “" + d.key + "” as completed? Its retries will be answered status " + (s || "?") + " and the body given.",
      failed: "Resolve key “" + d.key + "” as failed? Its retries will be answered an error.",
      released: "Release key “" + d.key + "”? The record is deleted and the next call acts.",
    }[outcome];
  }
  if (!(await confirmThen(what))) return;
  try {
    if (outcome === "delete") await api("/api/records/delete", body);
    else await api("/api/records/resolve", body);
    say((outcome === "delete" ? "Deleted " : "Resolved (" + outcome + ") ") + d.key);
    if (outcome === "delete" || outcome === "released") $("detail").hidden = true;
    else await showRecord(d.tenant, d.operation, d.key);
  } catch (e) {
    say(e.message, true);
  }
  await refresh();
}

async function refresh() {
  try {
    await Promise.all([loadMetrics(), loadUnknown(), loadRecords()]);
  } catch (e) {
    say(e.message, true);
  }
}

function readFilter() {
  state.filter = {
    state: $("filter-state").value,
    operation: $("filter-operation").value,
    tenant: $("filter-tenant").value,
    prefix: $("filter-prefix").value,
  };
  state.offset = 0;
}

document.addEventListener("DOMContentLoaded", () => {
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); readFilter(); loadRecords().catch((x) => say(x.message, true)); });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadRecords().catch((x) => say(x.message, true)); });
  $("next").addEventListener("click", () => { state.offset += PAGE; loadRecords().catch((x) => say(x.message, true)); });
  $("resolve-completed").addEventListener("click", () => act("completed"));
  $("resolve-failed").addEventListener("click", () => act("failed"));
  $("resolve-released").addEventListener("click", () => act("released"));
  $("delete").addEventListener("click", () => act("delete"));
  $("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
  $("logout-submit").addEventListener("click", async () => {
    await fetch("/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
    location.reload();
  });
  api("/api/session").then((s) => text($("operator-name"), s.operator)).catch(() => {});
  refresh();
  setInterval(() => { loadMetrics().then(loadUnknown).catch((x) => say(x.message, true)); }, 2000);
});
