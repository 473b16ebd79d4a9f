// The outbox console page. It reads the JSON API next to it (URLs relative to the page's
// <base>, which the server sets to the path the page was asked under, so the console works
// when a service mounts it under a prefix) and never writes server data into the page as HTML:
// every value goes in as text.
"use strict";

const api = (path) => "api/v1/" + path;
const $ = (id) => document.getElementById(id);

function token() {
  return sessionStorage.getItem("outbox-console-token") || "";
}

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = !message;
}

async function getJson(path) {
  const headers = { Accept: "application/json" };
  // A console reachable from the network needs the token for reads too.
  if (token()) headers.Authorization = "Bearer " + token();
  const r = await fetch(api(path), { headers });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function field(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

// Counts the server stopped at `counted_up_to` show as "≥ N".
const BOUNDED = new Set(["pending", "in_flight", "retrying", "dead_letters", "published_retained"]);

function renderOverview(o) {
  $("schema").textContent = "schema " + o.schema;
  for (const el of document.querySelectorAll("#overview [data-field]")) {
    const name = el.dataset.field;
    const v = field(o, name);
    let shown = typeof v === "number" && !Number.isInteger(v) ? v.toFixed(1) : String(v);
    if (o.counted_up_to != null && BOUNDED.has(name) && v >= o.counted_up_to) shown = "≥ " + shown;
    el.textContent = shown;
    el.closest(".card").classList.toggle("nonzero", v > 0);
  }
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function renderDeadLetters(list) {
  const selected = new Set([...document.querySelectorAll("#dead-letters tbody input:checked")].map((c) => c.value));
  const tbody = document.querySelector("#dead-letters tbody");
  tbody.replaceChildren();
  for (const d of list) {
    const tr = document.createElement("tr");
    tr.dataset.eventId = d.event_id;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = d.event_id;
    box.checked = selected.has(d.event_id);
    box.setAttribute("aria-label", "select " + d.event_id);
    const first = document.createElement("td");
    first.append(box);
    tr.append(
      first,
      cell(d.event_id, "id"),
      cell(d.aggregate_type + "/" + d.aggregate_id),
      cell(String(d.aggregate_version)),
      cell(d.event_type),
      cell(String(d.attempts)),
      cell(String(d.blocked_behind)),
      cell(d.created_at),
      cell(d.last_error || "", "reason"),
    );
    tbody.append(tr);
  }
  $("no-dead").hidden = list.length > 0;
}

async function refresh() {
  try {
    const [o, dead] = await Promise.all([getJson("overview"), getJson("dead-letters?limit=500")]);
    renderOverview(o);
    renderDeadLetters(dead);
    $("refreshed").textContent = "refreshed " + new Date().toLocaleTimeString();
    showError("");
  } catch (e) {
    showError("Cannot read the outbox: " + e.message);
  }
}

async function requeue(body) {
  body.reason = $("reason").value;
  const r = await fetch(api("dead-letters/requeue"), {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + token() },
    body: JSON.stringify(body),
  });
  const out = await r.json().catch(() => ({ error: r.statusText }));
  $("action-result").textContent = r.ok ? "requeued " + out.requeued : "refused: " + (out.error || r.status);
  await refresh();
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("outbox-console-token", $("token").value);
  $("token").value = "";
  $("token").placeholder = "token set for this tab";
});
$("requeue-selected").addEventListener("click", () => {
  const ids = [...document.querySelectorAll("#dead-letters tbody input:checked")].map((c) => c.value);
  if (ids.length === 0) {
    $("action-result").textContent = "select dead letters first";
    return;
  }
  requeue({ event_ids: ids });
});
$("requeue-all").addEventListener("click", () => {
  if (confirm("Requeue every dead letter?")) requeue({ all: true });
});
$("select-all").addEventListener("change", (e) => {
  for (const c of document.querySelectorAll("#dead-letters tbody input")) c.checked = e.target.checked;
});

refresh();
setInterval(refresh, 5000);
