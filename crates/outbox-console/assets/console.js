// The outbox console page. It reads the JSON API next to it (URLs relative to the page's
// <base>, which the server sets to the path the page was asked under, so the console works
// when a service mounts it under a prefix) and never writes server data into the page as HTML:
// every value goes in as text (textContent), payloads included.
"use strict";

const api = (path) => "api/v1/" + path;
const $ = (id) => document.getElementById(id);
let currentTab = "outbox";

function token() {
  return sessionStorage.getItem("outbox-console-token") || "";
}

function actorName() {
  return sessionStorage.getItem("outbox-console-actor") || "";
}

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = !message;
}

function say(message) {
  $("action-result").textContent = message;
}

async function getJson(path) {
  const headers = { Accept: "application/json" };
  // A console reachable from the network needs the token for reads too; payloads always do.
  if (token()) headers.Authorization = "Bearer " + token();
  const r = await fetch(api(path), { headers });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// An action: POST with the token; answers [ok, body].
async function act(path, body) {
  body.actor = actorName() || undefined;
  const r = await fetch(api(path), {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + token() },
    body: JSON.stringify(body),
  });
  const out = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) say("refused: " + (out.error || r.status));
  return [r.ok, out];
}

function field(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text != null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

const cell = (text, cls) => el("td", text, cls);

function button(label, onClick, cls) {
  const b = el("button", label, cls);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function checkbox(value, label, checked) {
  const box = document.createElement("input");
  box.type = "checkbox";
  box.value = value;
  box.checked = checked;
  box.setAttribute("aria-label", label);
  const td = document.createElement("td");
  td.append(box);
  return td;
}

const checked = (table) =>
  [...document.querySelectorAll("#" + table + " tbody input:checked")].map((c) => c.value);

// A titled block of pretty JSON (as text).
function jsonBlock(title, value) {
  const d = el("div");
  d.append(el("h4", title), el("pre", JSON.stringify(value, null, 2)));
  return d;
}

function payloadBlock(title, p) {
  const d = el("div", null, "payload");
  d.append(el("h4", title));
  if (!p) {
    d.append(el("p", "not held by this database (the inbox keeps the fingerprint only)", "muted"));
    return d;
  }
  d.append(el("p", "sha256 " + p.sha256 + " · " + p.size + " bytes", "muted mono"));
  let text = p.text;
  if (text != null) {
    try {
      text = JSON.stringify(JSON.parse(text), null, 2);
    } catch (_) {
      /* not JSON: as it is */
    }
    d.append(el("pre", text));
  } else {
    d.append(el("pre", "hex " + p.hex));
  }
  return d;
}

// ---- overview ---------------------------------------------------------------------------

// Counts the server stopped at `counted_up_to` show as "≥ N".
const BOUNDED = new Set(["pending", "in_flight", "retrying", "dead_letters", "published_retained"]);

function renderOverview(o) {
  $("schema").textContent = "schema " + o.schema;
  for (const e of document.querySelectorAll("#overview [data-field]")) {
    const name = e.dataset.field;
    const v = field(o, name);
    let shown = typeof v === "number" && !Number.isInteger(v) ? v.toFixed(1) : String(v);
    if (o.counted_up_to != null && BOUNDED.has(name) && v >= o.counted_up_to) shown = "≥ " + shown;
    e.textContent = shown;
    e.closest(".card").classList.toggle("nonzero", v > 0);
  }
}

// A small bar chart of a series, as SVG built node by node (no markup from data).
function sparkline(values, w = 150, h = 28) {
  const ns = "http://www.w3.org/2000/svg";
  const max = Math.max(1, ...values), bw = w / values.length;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("class", "spark");
  values.forEach((v, i) => {
    const r = document.createElementNS(ns, "rect");
    const bh = Math.max(v > 0 ? 1 : 0, (v / max) * h);
    r.setAttribute("x", i * bw + 1);
    r.setAttribute("y", h - bh);
    r.setAttribute("width", Math.max(1, bw - (bw > 4 ? 2 : 0.5)));
    r.setAttribute("height", bh);
    const t = document.createElementNS(ns, "title");
    t.textContent = v + " in minute " + (i - values.length + 1);
    r.append(t);
    svg.append(r);
  });
  return svg;
}

// The activity of one kind as a bar chart per series over the chosen window: work counted
// (publish: per route, consume: per consumer) with its total and busiest minute, or a level
// (lag, oldest_pending_age, dead_letters: total null) with its highest reading.
function renderActivity(kind, a) {
  const tbody = document.querySelector("#activity-" + kind + " tbody");
  tbody.replaceChildren();
  for (const series of a.series) {
    const tr = el("tr");
    tr.dataset.series = series.name;
    const chart = el("td", null, "chart");
    chart.append(sparkline(series.per_minute, 480, 48));
    const axis = el("div", "", "axis muted");
    axis.append(el("span", "−" + (a.minutes - 1) + " min"), el("span", "now"));
    chart.append(axis);
    const name = kind === "publish" ? routeLabel(series.name) : series.name;
    tr.append(cell(name, "id"), chart);
    if (!a.level) tr.append(cell(String(series.total), "total"));
    tr.append(cell(String(series.peak), "peak"));
    tbody.append(tr);
  }
  $("no-activity-" + kind).hidden = a.series.length > 0;
}

// The kinds of the activity charts on the tab `tab`, in page order.
function activityKinds(tab) {
  return [...document.querySelectorAll("#tab-" + tab + " section.activity-chart")].map((s) => s.dataset.kind);
}

// Reads the activity charts of the tab `tab` (see refresh: what it draws must be current).
function readActivity(tab) {
  return Promise.all(activityKinds(tab).map((kind) => getJson(activityQuery(kind))));
}

// Draws what readActivity read.
function drawActivity(tab, charts) {
  activityKinds(tab).forEach((kind, i) => renderActivity(kind, charts[i]));
}

// A route key ("destination:<d>" or "type:<aggregate type>") as the routes table names it.
function routeLabel(key) {
  if (key.startsWith("destination:")) return key.slice("destination:".length);
  if (key.startsWith("type:")) return "type " + key.slice("type:".length) + " (topic template)";
  return key;
}

function activityQuery(kind) {
  return "activity?kind=" + kind + "&minutes=" + encodeURIComponent($("activity-" + kind + "-minutes").value);
}

// What is paused, as "route:<key>" and "consumer:<name>".
let paused = new Set();

function pauseButton(kind, name, isPaused) {
  const td = el("td");
  if (isPaused === undefined) isPaused = paused.has(kind + ":" + name);
  if (isPaused) {
    td.append(el("span", "paused", "paused-badge"), button("resume", () => pauseAction("resume", kind, name)));
  } else {
    td.append(button("pause", () => pauseAction("pause", kind, name)));
  }
  return td;
}

async function pauseAction(kind, targetKind, name) {
  const reason = $(currentTab === "consumers" ? "consumer-pause-reason" : "pause-reason").value;
  if (kind === "pause" && !reason.trim()) return say("say why first (the field above the paused list)");
  const [ok] = await act("pauses/" + kind, { [targetKind]: name, reason });
  if (ok) say((kind === "pause" ? "paused " : "resumed ") + targetKind + " " + name);
  await refresh();
}

function renderPauses(list) {
  paused = new Set(list.map((p) => p.kind + ":" + p.name));
  const tbody = document.querySelector("#pauses tbody");
  tbody.replaceChildren();
  for (const p of list) {
    const tr = el("tr");
    tr.dataset.name = p.name;
    const td = el("td");
    td.append(button("resume", () => pauseAction("resume", p.kind, p.name)));
    tr.append(cell(p.kind), cell(p.name, "id"), cell(p.paused_at), cell(p.actor || "?"), cell(p.reason || "", "reason"), td);
    tbody.append(tr);
  }
  $("no-pauses").hidden = list.length > 0;
}

function renderRoutes(r) {
  const tbody = document.querySelector("#routes tbody");
  tbody.replaceChildren();
  for (const route of r.routes) {
    const tr = el("tr");
    const name = route.destination != null ? route.destination : "type " + route.aggregate_type + " (topic template)";
    const chart = el("td");
    chart.append(sparkline(route.published_per_minute));
    const perMinute = route.published_per_minute;
    tr.append(
      cell(name, "id"),
      cell(String(route.pending) + (r.complete ? "" : "+")),
      cell(route.oldest_pending_age_seconds.toFixed(1)),
      cell(String(route.dead_letters)),
      chart,
      cell(String(perMinute.reduce((a, b) => a + b, 0))),
      pauseButton("route", route.destination != null ? "destination:" + route.destination : "type:" + route.aggregate_type),
    );
    tr.dataset.route = route.destination != null ? "destination:" + route.destination : "type:" + route.aggregate_type;
    tbody.append(tr);
  }
  $("routes-partial").hidden = r.complete;
}

// A duration as an operator reads it: "4.2 s", "3 min 20 s", "2 h 5 min", "3 d 4 h".
function humanDuration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 60) return s.toFixed(1) + " s";
  const whole = Math.floor(s);
  const [d, h, m, sec] = [Math.floor(whole / 86400), Math.floor(whole / 3600) % 24, Math.floor(whole / 60) % 60, whole % 60];
  if (d > 0) return `${d} d ${h} h`;
  if (h > 0) return `${h} h ${m} min`;
  return `${m} min ${sec} s`;
}

const ago = (seconds) => humanDuration(seconds) + " ago";

// Numbers a process reports that are shown even at 0 (the others only when they are not).
const MAIN_NUMBERS = new Set(["published", "processed", "lag"]);

// A process's own numbers in words: a relay's in-flight batches (its leases, for the polling
// relay) first, then each number as "name value".
function numbers(i) {
  const stats = i.stats || {};
  const parts = [];
  const f = stats.in_flight;
  if (f && (i.status === "up" || i.status === "late")) {
    parts.push(f.batches === 0
      ? "holds nothing"
      : `holds ${f.aggregates} aggregate(s), ${f.rows} row(s) in ${f.batches} batch(es), oldest ${(f.oldest_ms / 1000).toFixed(1)} s`);
  }
  for (const [k, v] of Object.entries(stats)) {
    const name = k.replaceAll("_", " ");
    if (k === "in_flight" || v == null) continue;
    if (typeof v === "boolean") {
      if (v) parts.push(name);
    } else if (typeof v === "number") {
      if (v !== 0 || MAIN_NUMBERS.has(k)) parts.push(name + " " + v);
    } else if (typeof v === "object") {
      parts.push(name + " " + JSON.stringify(v));
    } else {
      parts.push(name + " " + v);
    }
  }
  return parts.join(" · ") || "-";
}

// What an engine says about itself (its heartbeat's health): state, last progress, last error,
// errors in the last minute; "-" for a process that reports none.
function healthCells(h) {
  if (!h) return ["-", "-", "-", "-"].map((t) => cell(t, "muted"));
  const e = h.last_error;
  const error = e ? `${ago(e.age_seconds)} · ${e.kind}: ${e.message}` : "none";
  const rate = cell(String(h.errors_per_minute), h.errors_per_minute > 0 ? "errors nonzero" : "errors");
  rate.title = `${h.errors} since it started`;
  return [
    cell(h.state, "state " + h.state),
    cell(h.last_progress_age_seconds == null ? "none since it started" : ago(h.last_progress_age_seconds)),
    cell(error, "reason"),
    rate,
  ];
}

function renderInstances(list) {
  const tbody = document.querySelector("#instances tbody");
  tbody.replaceChildren();
  for (const i of list) {
    const tr = el("tr");
    const where = cell(i.host + " / " + i.pid);
    where.title = "started " + i.started_at + ", version " + i.version;
    tr.append(
      cell(i.status, "status " + i.status),
      cell(i.kind),
      cell(i.name),
      ...healthCells(i.health),
      cell(numbers(i), "numbers"),
      where,
      cell(ago(i.heartbeat_age_seconds)),
      i.kind === "consumer" ? pauseButton("consumer", i.name) : el("td"),
    );
    tr.dataset.state = i.health ? i.health.state : "";
    tbody.append(tr);
  }
  $("no-instances").hidden = list.length > 0;
}

// ---- outbox dead letters ----------------------------------------------------------------

function deadFilter() {
  const f = {};
  for (const [k, v] of new FormData($("dead-filter"))) if (v.trim()) f[k] = v.trim();
  return f;
}

// The matching dead letters as the groups last counted them (with the filter they were read
// with: the list refreshes on every filter change).
let lastGroups = { groups: [], complete: true };
const matchingCount = () =>
  lastGroups.groups.reduce((n, g) => n + g.count, 0) + (lastGroups.complete ? "" : " or more");

function renderDeadGroups(g) {
  lastGroups = g;
  const tbody = document.querySelector("#dead-groups tbody");
  tbody.replaceChildren();
  for (const group of g.groups) {
    const tr = el("tr");
    const filterBy = button("show these", () => {
      $("dead-filter-group").value = group.reason;
      refresh();
    });
    tr.append(
      cell(String(group.count)),
      cell(group.reason, "reason"),
      cell(group.aggregate_types.join(", ")),
      cell(group.event_types.join(", ")),
      cell(group.first_created_at + " … " + group.last_created_at),
    );
    const td = el("td");
    td.append(filterBy);
    tr.append(td);
    tbody.append(tr);
  }
  $("dead-groups-partial").hidden = g.complete;
}

function renderDeadLetters(list) {
  const selected = new Set(checked("dead-letters"));
  const tbody = document.querySelector("#dead-letters tbody");
  tbody.replaceChildren();
  for (const d of list) {
    const tr = el("tr");
    tr.dataset.eventId = d.event_id;
    const show = el("td");
    show.append(button("details", () => showDeadLetter(d.event_id)));
    tr.append(
      checkbox(d.event_id, "select " + d.event_id, selected.has(d.event_id)),
      cell(d.event_id, "id"),
      cell(d.aggregate_type + "/" + d.aggregate_id),
      cell(String(d.aggregate_version)),
      cell(d.event_type),
      cell(String(d.attempts)),
      cell(String(d.blocked_behind)),
      cell(d.created_at),
      cell(d.last_error || "", "reason"),
      show,
    );
    tbody.append(tr);
  }
  $("no-dead").hidden = list.length > 0;
}

async function showDeadLetter(id) {
  const box = $("dead-detail");
  box.hidden = false;
  box.replaceChildren(el("h3", "Dead letter " + id));
  try {
    const d = await getJson("dead-letters/" + encodeURIComponent(id));
    box.append(
      payloadBlock("payload (" + d.content_type + ", schema version " + d.schema_version + ")", d.payload),
      jsonBlock("headers", d.headers),
      jsonBlock("row", Object.assign({}, d, { payload: undefined, headers: undefined })),
    );
  } catch (e) {
    box.append(el("p", "cannot show it: " + e.message, "error"));
  }
}

async function deadAction(kind, body) {
  body.reason = $("reason").value;
  const [ok, out] = await act("dead-letters/" + kind, body);
  if (ok) say(kind === "requeue" ? "requeued " + out.requeued : "discarded " + out.discarded);
  await refresh();
}

// ---- consumers --------------------------------------------------------------------------

function renderConsumers(list) {
  const tbody = document.querySelector("#consumers tbody");
  tbody.replaceChildren();
  for (const c of list) {
    const tr = el("tr");
    tr.dataset.consumer = c.name;
    const chart = el("td");
    chart.append(sparkline(c.processed_per_minute));
    tr.append(
      cell(c.name, "id"),
      cell(String(c.instances_up)),
      cell(c.lag == null ? "-" : String(c.lag)),
      chart,
      cell(String(c.processed_per_minute.reduce((a, b) => a + b, 0))),
      cell(String(c.dead_letters)),
      cell(String(c.conflicts)),
      pauseButton("consumer", c.name, c.paused),
    );
    tbody.append(tr);
  }
  $("no-consumers").hidden = list.length > 0;
}

function renderConsumerGroups(all) {
  const tbody = document.querySelector("#consumer-groups tbody");
  tbody.replaceChildren();
  for (const g of all.groups) {
    const tr = el("tr");
    const td = el("td");
    td.append(
      button("requeue group", () => {
        if (confirm("Requeue the " + g.count + " dead letter(s) of " + g.consumer_name + " in this group?"))
          consumerAction("requeue", { all: true, consumer: g.consumer_name, reason_group: g.reason });
      }),
    );
    tr.append(
      cell(String(g.count)),
      cell(g.consumer_name),
      cell(g.reason, "reason"),
      cell(g.first_at + " … " + g.last_at),
      td,
    );
    tbody.append(tr);
  }
}

function renderConsumerDeadLetters(list) {
  const selected = new Set(checked("consumer-dead-letters"));
  const tbody = document.querySelector("#consumer-dead-letters tbody");
  tbody.replaceChildren();
  for (const d of list) {
    const tr = el("tr");
    tr.dataset.id = d.id;
    const show = el("td");
    show.append(button("details", () => showConsumerDeadLetter(d.id)));
    tr.append(
      checkbox(String(d.id), "select " + d.id, selected.has(String(d.id))),
      cell(String(d.id)),
      cell(d.consumer_name),
      cell(d.state),
      cell(d.event_id || "-", "id"),
      cell((d.aggregate_type || "-") + "/" + (d.aggregate_id || "-") + " v" + (d.aggregate_version ?? "-")),
      cell(d.event_type || "-"),
      cell(String(d.attempts)),
      cell(d.created_at),
      cell(d.error, "reason"),
      show,
    );
    tbody.append(tr);
  }
}

async function showConsumerDeadLetter(id) {
  const box = $("consumer-detail");
  box.hidden = false;
  box.replaceChildren(el("h3", "Consumer dead letter " + id));
  try {
    const d = await getJson("consumer-dead-letters/" + id);
    box.append(payloadBlock("payload as received", d.payload), jsonBlock("headers as received", d.headers));
  } catch (e) {
    box.append(el("p", "cannot show it: " + e.message, "error"));
  }
}

async function consumerAction(kind, body) {
  body.reason = $("consumer-reason").value;
  const [ok, out] = await act("consumer-dead-letters/" + kind, body);
  if (ok) say(kind === "requeue" ? "requeued " + out.requeued : "discarded " + out.discarded);
  await refresh();
}

function renderConflicts(list) {
  const tbody = document.querySelector("#conflicts tbody");
  tbody.replaceChildren();
  for (const c of list) {
    const tr = el("tr");
    tr.dataset.id = c.id;
    const td = el("td");
    td.append(button("compare", () => showConflict(c.id)));
    if (!c.resolved_at) td.append(button("resolve", () => resolveConflict(c.id)));
    const state = c.resolved_at
      ? "resolved " + c.resolved_at + " by " + (c.resolved_by || "?") + ": " + (c.resolution_reason || "")
      : "open";
    tr.append(
      cell(String(c.id)),
      cell(c.consumer_name),
      cell(c.event_id, "id"),
      cell(c.aggregate_type + "/" + c.aggregate_id + " v" + c.aggregate_version),
      cell(c.event_type),
      cell(c.occurrences + "×"),
      cell(c.first_seen + " / " + c.last_seen),
      cell(state, c.resolved_at ? "reason muted" : "reason"),
      td,
    );
    tbody.append(tr);
  }
}

async function resolveConflict(id) {
  const reason = $("conflict-reason").value;
  if (!reason.trim()) return say("say why first (the field above the conflicts)");
  const [ok, out] = await act("conflicts/resolve", { ids: [id], reason });
  if (ok) say("resolved " + out.resolved + " conflict(s)");
  await refresh();
}

async function showConflict(id) {
  const box = $("conflict-detail");
  box.hidden = false;
  box.replaceChildren(el("h3", "Conflict " + id));
  try {
    const c = await getJson("conflicts/" + id);
    const side = el("div", null, "side-by-side");
    const first = payloadBlock("first payload (applied)", c.first_payload);
    if (!c.first_payload) first.append(el("p", "sha256 " + c.stored_sha256, "muted mono"));
    const received = payloadBlock("conflicting payload (never applied)", c.received_payload);
    side.append(first, received);
    box.append(
      side,
      el(
        "p",
        "To resolve: fix the producer that reused the id; if the conflicting payload should take effect, " +
          "publish it as a new event with a new id. The consumer keeps the first. Then mark it resolved, with why.",
        "muted",
      ),
    );
  } catch (e) {
    box.append(el("p", "cannot show it: " + e.message, "error"));
  }
}

// ---- remote effects ---------------------------------------------------------------------

function renderWorkItems(list) {
  const tbody = document.querySelector("#work-items tbody");
  tbody.replaceChildren();
  for (const w of list) {
    const tr = el("tr");
    tr.dataset.id = w.id;
    const actions = el("td");
    if (w.state === "unknown") {
      actions.append(
        button("reconcile now", () => effectAction(w.id, "reconcile", {})),
        button("succeeded", () => effectAction(w.id, "resolve", { succeeded: $("effects-note").value })),
        button("failed", () => effectAction(w.id, "resolve", { failed: $("effects-note").value }), "danger"),
        button("resend", () => effectAction(w.id, "resolve", { resend: true })),
      );
    }
    tr.append(
      cell(String(w.id)),
      cell(w.kind),
      cell(w.state),
      cell(w.idempotency_key, "id"),
      cell(String(w.attempts)),
      cell(String(w.lookups)),
      cell(w.unknown_since || "-"),
      cell(w.last_error || "", "reason"),
      actions,
    );
    tbody.append(tr);
  }
}

async function effectAction(id, kind, body) {
  if (kind === "resolve" && !body.resend) body.reason = $("effects-note").value;
  else body.reason = $("effects-note").value;
  const [ok, out] = await act("work-items/" + id + "/" + kind, body);
  if (ok) say(kind === "reconcile" ? "work item " + id + ": lookup due now" : "work item " + id + " is now " + out.state);
  await refresh();
}

// ---- trace and audit --------------------------------------------------------------------

async function trace(e) {
  e.preventDefault();
  const f = Object.fromEntries(new FormData($("trace-form")));
  const out = $("trace-result");
  out.replaceChildren();
  try {
    let t;
    if (f.event_id.trim()) {
      t = await getJson("trace/event/" + encodeURIComponent(f.event_id.trim()));
      out.append(
        el("p", t.outbox ? "outbox row: " + t.outbox.state : t.discarded ? "discarded by an operator" :
          "the outbox no longer holds it (published and deleted, or never written here)"),
        jsonBlock("outbox row", t.outbox),
        jsonBlock("discarded", t.discarded),
        jsonBlock("inbox records (" + t.inbox.length + " consumers applied it)", t.inbox),
        jsonBlock("conflicts", t.conflicts),
        jsonBlock("consumer dead letters", t.consumer_dead_letters),
        jsonBlock("work items", t.work_items),
        jsonBlock("audit", t.audit),
      );
    } else {
      const q = new URLSearchParams({ aggregate_type: f.aggregate_type, aggregate_id: f.aggregate_id });
      t = await getJson("trace/aggregate?" + q);
      out.append(
        jsonBlock("outbox rows", t.outbox),
        jsonBlock("discarded", t.discarded),
        jsonBlock("consumers' last applied version", t.consumers),
      );
    }
  } catch (err) {
    out.append(el("p", "cannot trace: " + err.message, "error"));
  }
}

// The replay form's request, or an error message.
function replayRequest() {
  const f = Object.fromEntries(new FormData($("replay-form")));
  const [since, until] = [f.created_after.trim(), f.created_before.trim()];
  if (since || until) {
    if (f.aggregate_id.trim() || f.from_version.trim()) return [null, "give an aggregate or a time range, not both"];
    if (!since || !until) return [null, "a time range needs both ends (RFC 3339, e.g. 2026-12-05T10:00:00Z)"];
    const body = { created_after: since, created_before: until, reason: f.reason };
    if (f.aggregate_type.trim()) body.aggregate_type = f.aggregate_type.trim();
    if (f.destination.trim()) body.destination = f.destination.trim();
    return [body, null];
  }
  const body = { aggregate_type: f.aggregate_type.trim(), aggregate_id: f.aggregate_id.trim(), reason: f.reason };
  if (!body.aggregate_type || !body.aggregate_id) return [null, "give the aggregate's type and id, or a time range"];
  const v = f.from_version.trim();
  if (v) {
    if (!/^[1-9][0-9]*$/.test(v)) return [null, "the version is a whole number from 1"];
    body.from_version = Number(v);
  }
  return [body, null];
}

// A dry run; then, for a replay, a confirmation of its count and the replay expecting it.
async function replay(run) {
  const [body, problem] = replayRequest();
  if (problem) return ($("replay-result").textContent = problem);
  const [ok, plan] = await act("replay", Object.assign({}, body, { dry_run: true }));
  if (!ok) return ($("replay-result").textContent = "refused: " + (plan.error || ""));
  const what = body.created_after
    ? plan.events + " event(s) of " + plan.aggregates + " aggregate(s) (" + plan.in_range + " written in the range)"
    : plan.events + " event(s) of " + body.aggregate_type + "/" + body.aggregate_id;
  if (!run) return ($("replay-result").textContent = "dry run: would republish " + what);
  if (!confirm("Republish " + what + " under their original ids?")) return;
  const [done, out] = await act("replay", Object.assign({}, body, { expect_events: plan.events }));
  $("replay-result").textContent = done ? "republishing " + out.events + " event(s)" : "refused: " + (out.error || "");
}

function renderAudit(list) {
  const tbody = document.querySelector("#audit tbody");
  tbody.replaceChildren();
  for (const a of list) {
    const tr = el("tr");
    tr.append(
      cell(String(a.id)),
      cell(a.at),
      cell(a.actor + (a.credential ? " (" + a.credential + ")" : "")),
      cell(a.via),
      cell(a.db_role),
      cell(a.action),
      cell(JSON.stringify(a.selection), "reason"),
      cell(String(a.affected)),
      cell(a.reason, "reason"),
    );
    tbody.append(tr);
  }
}

// ---- refresh ----------------------------------------------------------------------------

// The latest refresh: a slower, older one (the 5 s timer's, overtaken by a change of a menu)
// draws nothing when it ends, so what is shown is what the menus say now.
let refreshes = 0;

async function refresh() {
  const mine = ++refreshes;
  const current = () => mine === refreshes;
  try {
    const o = await getJson("overview");
    if (!current()) return;
    renderOverview(o);
    if (currentTab === "outbox") {
      const q = new URLSearchParams(deadFilter());
      const [pauses, routes, activity, instances, groups, dead] = await Promise.all([
        getJson("pauses"),
        getJson("routes"),
        readActivity("outbox"),
        getJson("instances"),
        getJson("dead-letters/groups?" + q),
        getJson("dead-letters?limit=500&" + q),
      ]);
      if (!current()) return;
      renderPauses(pauses);
      renderRoutes(routes);
      drawActivity("outbox", activity);
      renderInstances(instances);
      renderDeadGroups(groups);
      renderDeadLetters(dead);
    } else if (currentTab === "consumers") {
      const [consumers, activity, groups, dead, conflicts] = await Promise.all([
        getJson("consumers"),
        readActivity("consumers"),
        getJson("consumer-dead-letters/groups"),
        getJson("consumer-dead-letters?limit=500"),
        getJson("conflicts?limit=500"),
      ]);
      if (!current()) return;
      renderConsumers(consumers);
      drawActivity("consumers", activity);
      renderConsumerGroups(groups);
      renderConsumerDeadLetters(dead);
      renderConflicts(conflicts);
    } else if (currentTab === "effects") {
      const items = await getJson("work-items?limit=500&state=" + encodeURIComponent($("effects-state").value));
      if (!current()) return;
      renderWorkItems(items);
    } else if (currentTab === "audit") {
      const audit = await getJson("audit?limit=200");
      if (!current()) return;
      renderAudit(audit);
    }
    $("refreshed").textContent = "refreshed " + new Date().toLocaleTimeString();
    showError("");
  } catch (e) {
    showError("Cannot read the outbox: " + e.message);
  }
}

function selectTab(name) {
  currentTab = name;
  for (const b of document.querySelectorAll("#tabs button")) b.setAttribute("aria-selected", String(b.dataset.tab === name));
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== "tab-" + name;
  refresh();
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  if ($("token").value) sessionStorage.setItem("outbox-console-token", $("token").value);
  sessionStorage.setItem("outbox-console-actor", $("actor").value.trim());
  $("token").value = "";
  $("token").placeholder = "token set for this tab";
});
$("actor").value = actorName();
for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => selectTab(b.dataset.tab));
$("dead-filter").addEventListener("submit", (e) => {
  e.preventDefault();
  refresh();
});
$("dead-filter-clear").addEventListener("click", () => {
  $("dead-filter").reset();
  refresh();
});
$("requeue-selected").addEventListener("click", () => {
  const ids = checked("dead-letters");
  if (ids.length === 0) return say("select dead letters first");
  deadAction("requeue", { event_ids: ids });
});
$("requeue-filtered").addEventListener("click", () => {
  const f = deadFilter();
  if (Object.keys(f).length === 0) return say("set a filter first (or use Requeue all)");
  if (confirm("Requeue every dead letter matching the filter (" + matchingCount() + ")?")) deadAction("requeue", { filter: f });
});
$("requeue-all").addEventListener("click", () => {
  if (confirm("Requeue every dead letter?")) deadAction("requeue", { all: true });
});
$("discard-selected").addEventListener("click", () => {
  const ids = checked("dead-letters");
  if (ids.length === 0) return say("select dead letters first");
  if (confirm("Discard " + ids.length + " dead letter(s)? They will never be published.")) deadAction("discard", { event_ids: ids });
});
$("discard-filtered").addEventListener("click", () => {
  const f = deadFilter();
  if (Object.keys(f).length === 0) return say("set a filter first");
  if (confirm("Discard every dead letter matching the filter (" + matchingCount() + ")? They will never be published."))
    deadAction("discard", { filter: f });
});
$("select-all").addEventListener("change", (e) => {
  for (const c of document.querySelectorAll("#dead-letters tbody input")) c.checked = e.target.checked;
});
$("consumer-requeue-selected").addEventListener("click", () => {
  const ids = checked("consumer-dead-letters").map(Number);
  if (ids.length === 0) return say("select consumer dead letters first");
  consumerAction("requeue", { ids });
});
$("consumer-discard-selected").addEventListener("click", () => {
  const ids = checked("consumer-dead-letters").map(Number);
  if (ids.length === 0) return say("select consumer dead letters first");
  if (confirm("Discard " + ids.length + " consumer dead letter(s)? They will never be applied.")) consumerAction("discard", { ids });
});
$("effects-state").addEventListener("change", refresh);
// The activity charts' sections, from one template: ids by kind (activity-<kind>,
// activity-<kind>-minutes, no-activity-<kind>), texts from the section's data attributes.
for (const section of document.querySelectorAll("section.activity-chart")) {
  const kind = section.dataset.kind;
  section.append(document.getElementById("activity-template").content.cloneNode(true));
  const title = section.querySelector("h2");
  title.id = "activity-" + kind + "-title";
  title.textContent = section.dataset.title;
  section.setAttribute("aria-labelledby", title.id);
  section.querySelector(".about").textContent = section.dataset.about;
  section.querySelector("select").id = "activity-" + kind + "-minutes";
  section.querySelector("table").id = "activity-" + kind;
  section.querySelector("th.name").textContent = section.dataset.name;
  // A level has no total: its column goes, and the busiest minute is its highest reading.
  if (section.dataset.level !== undefined) {
    section.querySelector("th.total").remove();
    section.querySelector("th.peak").textContent = "highest";
  }
  const none = section.querySelector("p.none");
  none.id = "no-activity-" + kind;
  none.textContent = section.dataset.none;
  section.querySelector("select").addEventListener("change", refresh);
}
$("trace-form").addEventListener("submit", trace);
$("replay-dry-run").addEventListener("click", () => replay(false));
$("replay-run").addEventListener("click", () => replay(true));

refresh();
setInterval(refresh, 5000);
