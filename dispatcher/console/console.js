// The console: polls the dispatcher's API every few seconds with the API key kept in
// sessionStorage (gone when the tab closes). Plain JS, no build step; everything shown is
// inserted as text, never as HTML, so job data cannot inject markup.
"use strict";

const POLL_MS = 3000;
const PAYLOAD_SHOWN_BYTES = 4096; // a larger payload is cut, and says so
const KEY = "dispatcher.apiKey";
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
let shownJob = null; // the id whose history is on screen, refreshed with the rest
let rules = []; // the flow rules of the last poll: the due panel marks the keys they hold or meter
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

// A panel's table says why it is empty when this key may not read it (or the read failed).
function unavailable(table, error) {
  const text = error.status === 403 ? `not for this key: ${error.message}` : error.message;
  const tr = row([text]);
  tr.cells[0].colSpan = table.tHead.rows[0].cells.length;
  tr.className = "unavailable";
  fill(table.tBodies[0], [tr]);
}

// A job id, whole and in monospace (selectable, so copied whole). UUIDv7 ids made in the same
// minute share their first characters (the time, to the millisecond); the rest, which tells
// jobs made together apart, is bold.
function jobId(id) {
  const code = el("code", null, "job-id");
  code.title = id;
  code.append(el("span", id.slice(0, 14), "id-time"), el("b", id.slice(14)));
  return code;
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
  renderDue(stats);
}

// The next hour's jobs per minute and routing key: one row with a count, not a row per job.
function renderDue(stats) {
  const groups = stats.next_due_by_minute || [];
  const most = Math.max(1, ...groups.map((g) => g.jobs));
  const counted = groups.reduce((sum, g) => sum + g.jobs, 0);
  fill(
    $("due").tBodies[0],
    groups.map((group) => {
      const bar = el("div", null, "bar");
      bar.style.width = `${(group.jobs / most) * 100}%`;
      const jobs = el("div", null, "count");
      jobs.append(el("b", group.jobs), bar);
      const minute = new Date(group.minute);
      const when = el("span", `${minute.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })} (${since(group.minute)})`);
      when.title = group.minute;
      const rule = governing(group.routing_key);
      const held = Boolean(rule && rule.holding);
      const mark = held ? " (paused)" : rule && rule.metering ? " (metered)" : "";
      const tr = row([when, `${group.routing_key}${mark}`, jobs]);
      tr.dataset.routingKey = group.routing_key;
      if (held) tr.classList.add("held");
      tr.cells[2].className = "jobs";
      return tr;
    }),
  );
  if (!groups.length) fill($("due").tBodies[0], [row(["nothing due in the next hour"])]);
  const capped = counted >= stats.next_due_scanned ? ` (counted over the next ${stats.next_due_scanned} jobs)` : "";
  $("due-note").textContent = `${counted} jobs due in the next ${stats.next_due_window_s / 60} minutes${capped}`;
}

function renderPayload(job) {
  const text = JSON.stringify(job.payload, null, 2) ?? "null";
  const bytes = new TextEncoder().encode(text);
  const shown = bytes.length > PAYLOAD_SHOWN_BYTES ? new TextDecoder().decode(bytes.slice(0, PAYLOAD_SHOWN_BYTES)) : text;
  const pre = el("pre", shown, "payload");
  pre.id = "payload";
  const note = el("small", bytes.length > PAYLOAD_SHOWN_BYTES ? `shown ${PAYLOAD_SHOWN_BYTES} of ${bytes.length} bytes` : `${bytes.length} bytes`);
  note.id = "payload-size";
  return [el("h3", "Payload"), note, pre];
}

function renderHeaders(job) {
  const names = Object.keys(job.headers || {}).sort();
  const table = el("table");
  table.id = "headers";
  table.appendChild(el("thead")).appendChild(row(["header", "value"]));
  const body = table.appendChild(el("tbody"));
  for (const name of names) body.appendChild(row([name, JSON.stringify(job.headers[name])]));
  if (!names.length) body.appendChild(row(["no headers", ""]));
  return [el("h3", "Headers"), table];
}


function renderJob(job) {
  const box = $("job");
  const head = el("p");
  head.append(jobId(job.id), ` ${job.routing_key} `, el("b", job.state, `job-state state-${job.state}`));
  if (job.idempotency_key) head.append(` key ${job.idempotency_key}${job.key_released ? " (let go of)" : ""}`);
  const table = el("table");
  table.id = "history";
  table.appendChild(el("thead")).appendChild(row(["when", "step", "attempt", "consumer", "error"]));
  const body = table.appendChild(el("tbody"));
  // A long history shows its newest events; the older ones are counted.
  if (job.events_omitted) {
    const tr = row(["", `${job.events_omitted} older events not shown`, "", "", ""]);
    tr.id = "events-omitted";
    body.appendChild(tr);
  }
  for (const step of job.history) {
    // An event that changed nothing (another dispatch round, a forgery) says so in its step; a
    // change the dispatcher made says what it did (the new time, the bulk action).
    const done = step.detail ? `${step.event}: ${step.detail}` : step.event;
    const name = step.ignored ? `${done} (ignored: ${step.ignored})` : done;
    const tr = row([new Date(step.at).toLocaleString(), name, step.attempt, step.consumer ? `${step.group}/${step.consumer}` : "", step.error]);
    tr.className = step.ignored ? `step-${step.event} ignored` : `step-${step.event}`;
    tr.cells[0].title = step.at;
    tr.cells[4].className = "error";
    body.appendChild(tr);
  }
  // Past the first few, ignored events are only counted (a flood of forgeries stays small).
  if (job.ignored_dropped) {
    const tr = row(["", `${job.ignored_dropped} more ignored events, counted, not kept`, "", "", ""]);
    tr.className = "ignored";
    tr.id = "ignored-dropped";
    body.appendChild(tr);
  }
  box.replaceChildren(head, ...renderPayload(job), ...renderHeaders(job), el("h3", "History"), table);
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

// The dead queue its consumer group parked the job in: from the job's last "dead" event.
async function deadQueue(id) {
  const job = await api(`/v1/jobs/${id}`).catch(() => null);
  const dead = job && [...job.history].reverse().find((step) => step.event === "dead" && step.group);
  return dead ? `${dead.group}.${job.routing_key}.dead` : null;
}

async function requeue(id, button) {
  button.disabled = true;
  const message = $("dead-message");
  try {
    const queue = await deadQueue(id);
    await api(`/v1/jobs/${id}/requeue`, { method: "POST" });
    // The requeue schedules the job again and leaves the consumer's copy in the dead queue;
    // `dispatcher dlq requeue` (given the dispatcher's URL) drops that copy instead of running it.
    const where = queue ? `Its copy in ${queue}` : "Its copy in the consumer group's .dead queue";
    message.replaceChildren(
      `requeued ${id}: it is due now. ${where} stays there until `,
      el("code", "dispatcher dlq requeue"),
      " drops it (it does not run again), or you delete it in the ",
      queue ? rabbitLink(`queues/${vhost()}/${encodeURIComponent(queue)}`, "RabbitMQ UI") : "RabbitMQ UI",
      ".",
    );
  } catch (error) {
    message.textContent = `could not requeue ${id}: ${error.message}`;
    button.disabled = false;
  }
  await refresh(true);
}

function renderDead(page) {
  fill(
    $("dead").tBodies[0],
    page.jobs.map((job) => {
      const button = el("button", "Requeue", "requeue");
      button.dataset.job = job.id;
      button.addEventListener("click", () => requeue(job.id, button));
      const id = el("a");
      id.appendChild(jobId(job.id));
      id.href = "#";
      id.addEventListener("click", (event) => { event.preventDefault(); $("search").value = job.id; search(job.id); });
      const tr = row([id, job.routing_key, job.last_error, since(job.updated_at), button]);
      tr.cells[2].className = "error";
      tr.dataset.job = job.id;
      return tr;
    }),
  );
}

// Bulk requeue: a dry run counts the dead jobs of the filter; the button then requeues exactly
// that filter (a changed filter hides it until counted again), and the action's progress is
// polled with the rest until it ends.
let bulkFilter = null; // the filter the button's count is for
let bulkShown = null; // the bulk action whose progress is on screen

function deadFilter() {
  const filter = {};
  const prefix = $("bulk-prefix").value.trim();
  const error = $("bulk-error").value.trim();
  if (prefix) filter.routing_key_prefix = prefix;
  if (error) filter.error_contains = error;
  return filter;
}

function bulkBody(dryRun) {
  return JSON.stringify({ action: "requeue", filter: bulkFilter, dry_run: dryRun });
}

async function countDead() {
  const go = $("bulk-go");
  go.hidden = true;
  bulkFilter = deadFilter();
  try {
    const dry = await api("/v1/bulk-actions", { method: "POST", body: bulkBody(true) });
    $("bulk-message").textContent = `${dry.matched.toLocaleString()} dead jobs match`;
    go.dataset.matched = dry.matched;
    go.textContent = `Requeue these ${dry.matched.toLocaleString()} jobs`;
    go.hidden = dry.matched === 0;
  } catch (error) {
    $("bulk-message").textContent = `could not count: ${error.message}`;
  }
}

async function requeueAll(button) {
  const count = Number(button.dataset.matched).toLocaleString();
  if (!window.confirm(`Requeue ${count} dead jobs? Each is scheduled again, due now.`)) return;
  button.hidden = true;
  try {
    renderBulk(await api("/v1/bulk-actions", { method: "POST", body: bulkBody(false) }));
  } catch (error) {
    $("bulk-message").textContent = `could not requeue: ${error.message}`;
  }
  await refresh(true);
}

function renderBulk(action) {
  bulkShown = action.status === "running" ? action.id : null;
  const reason = action.reason ? ` (${action.reason})` : "";
  $("bulk-message").textContent = `bulk requeue ${action.id}: ${action.status}, `
    + `${action.touched.toLocaleString()} of ${action.matched_estimate.toLocaleString()} requeued${reason}`;
}

function every(seconds) {
  if (seconds % 86400 === 0) return `every ${seconds / 86400}d`;
  if (seconds % 3600 === 0) return `every ${seconds / 3600}h`;
  if (seconds % 60 === 0) return `every ${seconds / 60}m`;
  return `every ${seconds}s`;
}

async function pause(schedule, paused, button) {
  button.disabled = true;
  const message = $("schedules-message");
  try {
    await api(`/v1/schedules/${encodeURIComponent(schedule.name)}`, { method: "PATCH", body: JSON.stringify({ paused }) });
    message.textContent = `${paused ? "paused" : "resumed"} ${schedule.name}`;
  } catch (error) {
    message.textContent = `could not ${paused ? "pause" : "resume"} ${schedule.name}: ${error.message}`;
    button.disabled = false;
  }
  await refresh(true);
}

function renderSchedules(page) {
  fill(
    $("schedules").tBodies[0],
    page.schedules.map((schedule) => {
      const timing = schedule.cron ? `${schedule.cron} (${schedule.timezone})` : every(schedule.interval_s);
      const next = schedule.paused || !schedule.next_at ? "" : `${new Date(schedule.next_at).toLocaleString()} (${since(schedule.next_at)})`;
      const state = schedule.error ? `paused: ${schedule.error}` : schedule.paused ? "paused" : "active";
      const button = el("button", schedule.paused ? "Resume" : "Pause", "pause-toggle");
      button.dataset.schedule = schedule.name;
      button.addEventListener("click", () => pause(schedule, !schedule.paused, button));
      const name = schedule.namespace ? `${schedule.name} (${schedule.namespace})` : schedule.name;
      const tr = row([name, timing, schedule.job.routing_key, next, state, button]);
      tr.dataset.schedule = schedule.name;
      tr.cells[4].className = `schedule-state ${schedule.paused ? "paused" : "active"}`;
      return tr;
    }),
  );
  if (!page.schedules.length) fill($("schedules").tBodies[0], [row(["no schedules"])]);
}

// The rule governing a routing key's jobs: the longest rule key that is the routing key or a
// prefix of its words (namespaces aside: the panel counts every namespace together).
function governing(routingKey) {
  return rules
    .filter((rule) => routingKey === rule.key || routingKey.startsWith(`${rule.key}.`))
    .sort((a, b) => b.key.length - a.key.length)[0];
}

// What a rule's meter allows, e.g. "200/s, burst 20; 50 in flight, 300 s" ("" when unmetered).
function meter(rule) {
  const parts = [];
  if (rule.rate_per_s !== null && rule.rate_per_s !== undefined) parts.push(`${rule.rate_per_s}/s, burst ${rule.burst}`);
  if (rule.max_in_flight !== null && rule.max_in_flight !== undefined) parts.push(`${rule.max_in_flight} in flight, ${rule.in_flight_timeout_s} s`);
  return parts.join("; ");
}

function scope(rule) {
  return rule.namespace === null ? "" : `?namespace=${encodeURIComponent(rule.namespace)}`;
}

function where(rule) {
  if (rule.namespace === null) return "every namespace";
  return rule.namespace === "" ? "(default)" : rule.namespace;
}

async function resumeKey(rule, button) {
  const pace = rule.metering || meter(rule) ? "at its meter's pace" : "now";
  if (!window.confirm(`Resume ${rule.key} in ${where(rule)}? Its held jobs go ${pace}, oldest due first.`)) return;
  button.disabled = true;
  const message = $("limits-message");
  try {
    await api(`/v1/limits/${encodeURIComponent(rule.key)}/resume${scope(rule)}`, { method: "POST" });
    message.textContent = `resumed ${rule.key}`;
  } catch (error) {
    message.textContent = `could not resume ${rule.key}: ${error.message}`;
    button.disabled = false;
  }
  await refresh(true);
}

async function pauseKey(key, note) {
  const message = $("limits-message");
  if (!key) return;
  if (!window.confirm(`Pause ${key} in every namespace? None of its jobs is published until it is resumed.`)) return;
  try {
    await api(`/v1/limits/${encodeURIComponent(key)}/pause`, { method: "POST", body: JSON.stringify({ note: note || null }) });
    message.textContent = `paused ${key}`;
    $("pause-key").value = "";
    $("pause-note").value = "";
  } catch (error) {
    message.textContent = `could not pause ${key}: ${error.message}`;
  }
  await refresh(true);
}

function renderLimits(answer) {
  rules = answer.limits;
  fill(
    $("limits").tBodies[0],
    rules.map((rule) => {
      const until = rule.paused_until ? `paused until ${new Date(rule.paused_until).toLocaleString()} (${since(rule.paused_until)})` : "paused";
      const state = rule.holding ? until : rule.metering ? "metered" : "not holding";
      // A metered rule never paused has nothing to resume (its meter stays either way).
      const button = rule.paused || !rule.metering ? el("button", "Resume", "resume-key") : "";
      if (button) {
        button.dataset.key = rule.key;
        button.addEventListener("click", () => resumeKey(rule, button));
      }
      const tr = row([rule.key, where(rule), state, meter(rule), rule.note, button]);
      tr.dataset.key = rule.key;
      tr.cells[2].className = rule.holding ? "limit-state paused" : rule.metering ? "limit-state metered" : "limit-state";
      tr.cells[3].className = "limit-meter";
      return tr;
    }),
  );
  if (!rules.length) fill($("limits").tBodies[0], [row(["no routing key is held back"])]);
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
let refreshAgain = false; // a write landed while a poll ran: that poll may show what came before it

// afterWrite: a pause, resume or requeue just answered. A poll already running may have read the
// state before the write, so one more follows it rather than leaving the old state up to a period.
async function refresh(afterWrite = false) {
  if (refreshing) {
    refreshAgain = refreshAgain || afterWrite;
    return;
  }
  refreshing = true;
  try {
    do {
      refreshAgain = false;
      await refreshAll();
    } while (refreshAgain);
  } finally {
    refreshing = false;
  }
}

async function refreshAll() {
  const status = $("status");
  try {
    renderStats(await api("/v1/stats"));
    status.textContent = `live, updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
  } catch (error) {
    status.className = "status error";
    if (error.status !== 403) {
      status.textContent = error.status === 401 ? `API key: ${error.message}` : error.message;
      return;
    }
    // A producer key: no figures, but its namespace's jobs and schedules below.
    status.textContent = `updated ${new Date().toLocaleTimeString()}; the figures need a monitor or admin key`;
    unavailable($("due"), error);
  }
  // A monitor key sees the figures above; jobs and schedules need a producer or admin key.
  await api("/v1/jobs?state=dead&limit=50").then(renderDead, (error) => unavailable($("dead"), error));
  await api("/v1/schedules?limit=100").then(renderSchedules, (error) => unavailable($("schedules"), error));
  await api("/v1/limits").then(renderLimits, (error) => { rules = []; unavailable($("limits"), error); });
  // Admin and management views: shown when this key may see them.
  await api("/v1/cluster").then(renderCluster, () => fill($("cluster").tBodies[0], [row(["needs an admin key"])]));
  await api("/v1/queues").then(renderQueues, (error) => $("queues").replaceChildren(el("li", error.message)));
  if (shownJob) await api(`/v1/jobs/${shownJob}`).then(renderJob, () => {});
  if (bulkShown) await api(`/v1/bulk-actions/${bulkShown}`).then(renderBulk, () => {});
}

$("api-key").value = sessionStorage.getItem(KEY) || "";
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("api-key").value.trim());
  refresh();
});
$("pause-form").addEventListener("submit", (event) => {
  event.preventDefault();
  pauseKey($("pause-key").value.trim(), $("pause-note").value.trim());
});
$("bulk-form").addEventListener("submit", (event) => {
  event.preventDefault();
  countDead();
});
$("bulk-go").addEventListener("click", () => requeueAll($("bulk-go")));
for (const input of ["bulk-prefix", "bulk-error"]) {
  $(input).addEventListener("input", () => { $("bulk-go").hidden = true; });
}
$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  search($("search").value);
});
refresh();
setInterval(refresh, POLL_MS);
