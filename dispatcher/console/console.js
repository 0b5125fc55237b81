// The console: polls the dispatcher's API every few seconds with the API key kept in
// sessionStorage (gone when the tab closes). Plain JS, no build step; everything shown is
// inserted as text, never as HTML, so job data cannot inject markup.
"use strict";

const POLL_MS = 3000;
const KEY = "dispatcher.apiKey";
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
let shownJob = null; // the id whose history is on screen, refreshed with the rest
let ui = { url: "", vhost: "/", exchange: "dispatcher.jobs" };

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    const td = el("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell ?? "";
    tr.appendChild(td);
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

async function api(path, options = {}) {
  const key = sessionStorage.getItem(KEY);
  // Writes are JSON even without a body: the node refuses what a cross-site form could send.
  const headers = { accept: "application/json", "content-type": "application/json" };
  if (key) headers.authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(`${response.status}: ${body.message || response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function since(iso) {
  const seconds = (new Date(iso) - Date.now()) / 1000;
  const abs = Math.abs(seconds);
  const text = abs < 90 ? `${abs.toFixed(0)}s` : abs < 5400 ? `${(abs / 60).toFixed(0)}m` : `${(abs / 3600).toFixed(1)}h`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

function rabbitLink(path, text) {
  const a = el("a", text);
  a.href = `${ui.url}/#/${path}`;
  a.target = "_blank";
  a.rel = "noopener";
  return a;
}

const vhost = () => encodeURIComponent(ui.vhost);

function renderStats(stats) {
  ui = { url: stats.rabbitmq_ui, vhost: stats.rabbitmq_vhost, exchange: stats.exchange };
  $("by-state").replaceChildren(
    ...Object.entries(stats.by_state).map(([state, jobs]) => {
      const tile = el("div", null, `tile state-${state}`);
      tile.id = `count-${state}`;
      tile.append(el("b", jobs), el("span", state));
      return tile;
    }),
  );
  $("counted-at").textContent = stats.counted_at ? `counted ${since(stats.counted_at)}` : "not counted yet";
  const counts = [...stats.counts].sort((a, b) => a.routing_key.localeCompare(b.routing_key) || a.state.localeCompare(b.state));
  // Only the keys with the most jobs come by name; the rest of each state is one "other" row.
  const other = Object.entries(stats.other || {}).filter(([, jobs]) => jobs > 0);
  fill($("by-key").tBodies[0], [
    ...counts.map((c) => row([c.routing_key, c.state, c.jobs])),
    ...other.map(([state, jobs]) => row(["(other keys)", state, jobs])),
  ]);
  const horizon = Math.max(60, ...stats.next_due.map((d) => (new Date(d.run_at) - Date.now()) / 1000));
  $("timeline").replaceChildren(
    ...stats.next_due.map((due) => {
      const li = el("li");
      const bar = el("div", null, "bar");
      bar.style.width = `${Math.max(0, ((new Date(due.run_at) - Date.now()) / 1000 / horizon) * 100)}%`;
      bar.title = `${due.routing_key} ${due.id} at ${due.run_at}`;
      const what = el("div");
      what.append(bar, el("small", due.routing_key));
      li.append(el("span", since(due.run_at)), what);
      return li;
    }),
  );
  if (!stats.next_due.length) $("timeline").replaceChildren(el("li", "nothing scheduled"));
}

function renderJob(job) {
  const box = $("job");
  const head = el("p");
  head.append(el("code", job.id), ` ${job.routing_key} `, el("b", job.state, `job-state state-${job.state}`));
  if (job.idempotency_key) head.append(` key ${job.idempotency_key}`);
  const table = el("table");
  table.id = "history";
  table.appendChild(el("thead")).appendChild(row(["when", "step", "attempt", "consumer", "error"]));
  const body = table.appendChild(el("tbody"));
  for (const step of job.history) {
    // An event that changed nothing (another dispatch round, a forgery) says so in its step.
    const name = step.ignored ? `${step.event} (ignored: ${step.ignored})` : step.event;
    const tr = row([new Date(step.at).toLocaleString(), name, step.attempt, step.consumer ? `${step.group}/${step.consumer}` : "", step.error]);
    tr.className = step.ignored ? `step-${step.event} ignored` : `step-${step.event}`;
    tr.cells[0].title = step.at;
    tr.cells[4].className = "error";
    body.appendChild(tr);
  }
  box.replaceChildren(head, table);
}

async function search(text) {
  const query = text.trim();
  if (!query) return;
  try {
    let job;
    if (UUID.test(query)) {
      job = await api(`/v1/jobs/${query}`);
    } else {
      const found = await api(`/v1/jobs?idempotency_key=${encodeURIComponent(query)}`);
      if (!found.jobs.length) throw new Error("no job has this idempotency key");
      job = await api(`/v1/jobs/${found.jobs[0].id}`);
    }
    shownJob = job.id;
    renderJob(job);
  } catch (error) {
    shownJob = null;
    $("job").replaceChildren(el("p", error.status === 404 ? "no such job" : error.message, "error-text"));
  }
}

async function requeue(id, button) {
  button.disabled = true;
  try {
    await api(`/v1/jobs/${id}/requeue`, { method: "POST" });
    $("dead-message").textContent = `requeued ${id}`;
  } catch (error) {
    $("dead-message").textContent = `could not requeue ${id}: ${error.message}`;
    button.disabled = false;
  }
  await refresh();
}

function renderDead(page) {
  fill(
    $("dead").tBodies[0],
    page.jobs.map((job) => {
      const button = el("button", "Requeue", "requeue");
      button.dataset.job = job.id;
      button.addEventListener("click", () => requeue(job.id, button));
      const id = el("a", job.id.slice(0, 8) + "…");
      id.href = "#";
      id.title = job.id;
      id.addEventListener("click", (event) => { event.preventDefault(); $("search").value = job.id; search(job.id); });
      const tr = row([id, job.routing_key, job.last_error, since(job.updated_at), button]);
      tr.cells[2].className = "error";
      tr.dataset.job = job.id;
      return tr;
    }),
  );
}

function ranges(shards) {
  const sorted = shards.map(Number).sort((a, b) => a - b);
  const parts = [];
  for (const shard of sorted) {
    const last = parts[parts.length - 1];
    if (last && last[1] === shard - 1) last[1] = shard; else parts.push([shard, shard]);
  }
  return parts.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(",");
}

function renderCluster(cluster) {
  const nodes = [...new Set([...(cluster.members || []), ...Object.keys(cluster.assignment)])].sort();
  fill(
    $("cluster").tBodies[0],
    nodes.map((node) => {
      // A list of shards (single-node) or a {shard: epoch} map (ZooKeeper).
      const owned = cluster.assignment[node] || [];
      const shards = Array.isArray(owned) ? owned : Object.keys(owned);
      return row([node, node === cluster.leader ? "leader" : "", shards.length, ranges(shards)]);
    }),
  );
}

function renderQueues(queues) {
  const links = [rabbitLink(`exchanges/${vhost()}/${encodeURIComponent(ui.exchange)}`, `exchange ${ui.exchange} (bindings)`)];
  for (const queue of queues) {
    const link = rabbitLink(`queues/${vhost()}/${encodeURIComponent(queue.name)}`, queue.name);
    const item = el("span");
    item.append(link, ` ${queue.messages ?? "?"} messages`);  // null: the broker could not count it
    links.push(item);
  }
  $("queues").replaceChildren(...links.map((link) => { const li = el("li"); li.appendChild(link); return li; }));
}

let refreshing = false; // a slow answer must not pile up polls behind it

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    await refreshAll();
  } finally {
    refreshing = false;
  }
}

async function refreshAll() {
  const status = $("status");
  try {
    renderStats(await api("/v1/stats"));
    renderDead(await api("/v1/jobs?state=dead&limit=50"));
    status.textContent = `live, updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
  } catch (error) {
    status.textContent = error.status === 401 || error.status === 403 ? `API key: ${error.message}` : error.message;
    status.className = "status error";
    return;
  }
  // Admin and management views: shown when this key may see them.
  await api("/v1/cluster").then(renderCluster, () => fill($("cluster").tBodies[0], [row(["needs an admin key"])]));
  await api("/v1/queues").then(renderQueues, (error) => $("queues").replaceChildren(el("li", error.message)));
  if (shownJob) await api(`/v1/jobs/${shownJob}`).then(renderJob, () => {});
}

$("api-key").value = sessionStorage.getItem(KEY) || "";
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("api-key").value.trim());
  refresh();
});
$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  search($("search").value);
});
refresh();
setInterval(refresh, POLL_MS);
