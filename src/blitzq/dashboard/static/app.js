// blitzq dashboard: fills each page from the JSON API and keeps it current by polling.
// User data (ids, arguments, errors) is only ever written as text (append/textContent),
// never as markup, and through visible(): bidirectional overrides and control characters
// are shown escaped, so a task's text cannot reorder or hide what the page shows.
"use strict";
(function () {
  const body = document.body;
  const root = body.dataset.root || "";
  const refresh = Number(body.dataset.refresh) || 2000;
  const $ = (selector) => document.querySelector(selector);
  // C0 controls but tab and newline, DEL, C1 controls, and the bidi marks, embeddings,
  // overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9).
  const HIDDEN = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;
  const visible = (text) =>
    String(text).replace(HIDDEN, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "title") node.setAttribute(key, visible(value));
      else if (key === "href" || key.startsWith("data-")) {
        node.setAttribute(key, value);
      } else node[key] = value;
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : visible(child));
    }
    return node;
  }

  async function api(path, options) {
    const init = Object.assign({ credentials: "same-origin" }, options || {});
    init.headers = Object.assign({ Accept: "application/json" }, init.headers || {});
    const response = await fetch(root + "/api/" + path, init);
    let doc = null;
    try { doc = await response.json(); } catch (e) { doc = null; }
    if (!response.ok) {
      const error = new Error((doc && doc.error) || response.status + " " + response.statusText);
      error.status = response.status;
      throw error;
    }
    return doc;
  }

  function post(path, payload) {
    return api(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(payload || {}),
    });
  }

  const pad = (n) => String(n).padStart(2, "0");
  // The browser's time zone as it names it ("UTC", "CET", "GMT+2"), shown with every time.
  function zoneOf(d) {
    try {
      const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" })
        .formatToParts(d).find((p) => p.type === "timeZoneName");
      if (part) return part.value;
    } catch (e) { /* an old browser: the offset below */ }
    const off = -d.getTimezoneOffset();
    return `UTC${off < 0 ? "-" : "+"}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
  }
  function time(ts) {
    if (ts === null || ts === undefined) return "–";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zoneOf(d)}`;
  }
  function clock(ts) {
    const d = new Date(ts * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }
  function ago(ts) {
    if (ts === null || ts === undefined) return "–";
    const s = Math.max(0, Date.now() / 1000 - ts);
    return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
  }
  function seconds(s) {
    if (s === null || s === undefined) return "–";
    return s < 1 ? `${(s * 1000).toFixed(1)} ms` : `${s.toFixed(3)} s`;
  }
  function rate(x) {
    if (x === null || x === undefined) return "–";
    return (x > 0 ? "+" : "") + x.toFixed(2);
  }
  function short(text, limit) {
    const s = String(text === null || text === undefined ? "" : text);
    return s.length <= limit ? s : s.slice(0, limit - 1) + "…";
  }
  // An action asks for a confirmation in place: its button becomes "Confirm …" and
  // "Cancel". `key` names the action, so a confirmation awaited survives a re-render.
  let awaiting = null;
  function confirmable(key, label, confirmLabel, run) {
    const box = el("span", { class: "confirmable", "data-action": key });
    const start = () => {
      const button = el("button", { type: "button", class: "act" }, label);
      button.addEventListener("click", () => { awaiting = key; ask(); });
      box.replaceChildren(button);
    };
    const ask = () => {
      const yes = el("button", { type: "button", class: "confirm" }, confirmLabel);
      const no = el("button", { type: "button", class: "cancel" }, "Cancel");
      yes.addEventListener("click", async () => { awaiting = null; start(); await run(); });
      no.addEventListener("click", () => { awaiting = null; start(); });
      box.replaceChildren(yes, no);
    };
    if (awaiting === key) ask(); else start();
    return box;
  }
  function say(selector, parts, cls) {
    const m = $(selector);
    if (!m) return;
    m.replaceChildren(...parts);
    m.className = cls;
  }
  async function act(selector, path, payload, done) {
    try {
      const r = await post(path, payload);
      say(selector, [done(r)], "ok");
    } catch (error) { say(selector, [`${path}: ${error.message}`], "bad"); }
  }

  const json = (value) => (value === null || value === undefined ? "–" : JSON.stringify(value));
  const taskLink = (id) => el("a", { href: `${root}/tasks/${encodeURIComponent(id)}`, title: id }, id);
  const queueLink = (name) => el("a", { href: `${root}/queues/${encodeURIComponent(name)}` }, name);

  function fill(table, rows, empty) {
    const tbody = $(table + " tbody");
    const columns = $(table + " thead tr").children.length;
    if (!rows.length) rows = [el("tr", {}, el("td", { colSpan: columns, class: "empty" }, empty))];
    tbody.replaceChildren(...rows);
  }

  function status(error) {
    const line = $("#status");
    line.textContent = error ? `⚠ ${visible(error.message)}` : `live · ${new Date().toLocaleTimeString()}`;
    line.className = error ? "bad" : "ok";
  }

  // Relative times ("3 s ago") written as <span data-ago="<unix seconds>">: kept current on
  // every poll, also when the answer did not change (no re-render, so a selection stays).
  const agoSpan = (ts) => el("span", { class: "ago", "data-ago": ts }, ago(ts));
  function refreshAgo() {
    for (const node of document.querySelectorAll("[data-ago]")) {
      node.textContent = ago(Number(node.dataset.ago));
    }
  }

  // A re-render between a button's press and its release would eat the click: the pressed
  // button is gone, so the browser sends the click to no button (a confirmation that never
  // runs). Renders therefore wait while a pointer is down and run once it is released (after
  // the click), or after HOLD_MS if the release never comes (a drag out of the window).
  const HOLD_MS = 1500;
  let pressedAt = 0;
  const held = new Map(); // render function -> the latest render waiting for the release
  function flushHeld() {
    pressedAt = 0;
    const renders = [...held.values()];
    held.clear();
    for (const run of renders) run();
  }
  document.addEventListener("pointerdown", () => { pressedAt = Date.now(); }, true);
  for (const type of ["pointerup", "pointercancel"]) {
    document.addEventListener(type, () => setTimeout(flushHeld, 0), true);
  }
  window.addEventListener("blur", flushHeld);
  function whenReleased(render, doc) {
    if (pressedAt && Date.now() - pressedAt < HOLD_MS) {
      held.set(render, () => render(doc));
      setTimeout(flushHeld, HOLD_MS);
    } else {
      render(doc);
    }
  }

  // Poll `load` every `refresh` ms; `render` runs when the answer changed (or every time
  // with `always`, for pages showing times relative to now). body[data-polls] counts the
  // answers, so a test can wait for polls to have happened.
  function live(load, render, always) {
    let last = null;
    let timer = null;
    async function tick() {
      try {
        const doc = await load();
        const key = JSON.stringify(doc);
        if (always || key !== last) { last = key; whenReleased(render, doc); }
        refreshAgo();
        status(null);
      } catch (error) { status(error); }
      body.dataset.polls = String(Number(body.dataset.polls || 0) + 1);
      clearTimeout(timer);
      timer = setTimeout(tick, refresh);
    }
    tick();
    return { now: () => { last = null; return tick(); } };
  }

  // ------------------------------------------------------------------ queues
  function queuesPage() {
    live(() => api("queues"), (d) => {
      $("#s-scheduled").textContent = d.scheduled;
      $("#s-running").textContent = d.running;
      $("#s-workers").textContent = d.workers;
      $("#s-completed").textContent = rate(d.rates.completed_per_s).replace("+", "");
      $("#s-failed").textContent = rate(d.rates.failed_per_s).replace("+", "");
      $("#s-dead").textContent = d.dead_letters;
      fill("#queues", d.queues.map((q) => el("tr", { "data-queue": q.name },
        el("td", {}, queueLink(q.name)),
        el("td", { class: "num waiting" }, q.waiting),
        el("td", { class: "num running" }, q.in_flight),
        el("td", { class: "num" }, rate(q.depth_per_s)),
        el("td", { class: "qstate" }, q.paused ? "paused" : "active"))), "no queues used yet");
    });
  }

  // ------------------------------------------------------------------- tasks
  // One line of the record; `key` (the API's field name) is the dd's data-field.
  function field(list, key, label, value, cls) {
    list.append(el("dt", {}, label), el("dd", { class: cls, "data-field": key }, value));
  }

  function renderTask(d) {
    const list = el("dl", { class: "record" });
    field(list, "id", "id", d.id, "mono");
    field(list, "task", "task", d.task || "–");
    field(list, "queue", "queue", d.queue || "–");
    field(list, "state", "state", el("span", { class: `state state-${d.state}`, id: "task-state" }, d.state));
    field(list, "attempts", "attempts", d.attempts ?? "–");
    field(list, "worker", "worker", d.worker || "–", "mono");
    field(list, "enqueued_at", "enqueued", time(d.enqueued_at));
    field(list, "started_at", "started", time(d.started_at));
    field(list, "finished_at", "finished", time(d.finished_at));
    field(list, "wait", "waited", seconds(d.wait));
    field(list, "duration", "ran for", seconds(d.duration));
    if (d.progress) {
      const p = d.progress;
      const bar = el("progress", { max: 1, value: p.fraction === null ? 0 : p.fraction });
      const done = p.total === null ? `${p.current}` : `${p.current} / ${p.total}`;
      field(list, "progress", "progress", el("span", {}, bar, " ", el("span", { class: "done" }, done),
        p.message ? " " : null, p.message ? el("span", { class: "message" }, p.message) : null,
        " (", agoSpan(p.updated_at), ")"));
    }
    if (d.args_from) {
      const from = `from the ${d.args_from}` + (d.args_truncated ? "; cut to 2048 bytes, cuts marked …" : "");
      field(list, "args", "args", el("span", {}, el("code", { id: "task-args" }, json(d.args)), " ", el("small", { class: "muted" }, `(${from})`)), "mono");
      field(list, "kwargs", "kwargs", el("code", { id: "task-kwargs" }, json(d.kwargs)), "mono");
    } else {
      field(list, "args", "args", el("span", { id: "task-args-note" }, `not kept: ${d.args_note || "unknown"}`), "muted");
    }
    if (d.due_at !== null && d.due_at !== undefined) field(list, "due_at", "due", time(d.due_at));
    if (d.state === "succeeded") {
      field(list, "result", "result", d.result_stored ? json(d.result) : "not stored", "mono");
    }
    if (d.error_type || d.error) {
      field(list, "error", "error", `${d.error_type || "error"}: ${d.error || ""}`, "bad mono");
    }
    if (d.dead_letter) {
      field(list, "dead_letter", "dead letter", `${d.dead_letter.reason} at ${time(d.dead_letter.failed_at)}`);
    }
    const parts = [list];
    if (d.traceback) parts.push(el("h3", {}, "Traceback"), el("pre", { class: "traceback", id: "task-traceback" }, d.traceback));
    $("#task").replaceChildren(...parts);
  }

  function tasksPage() {
    const input = $("#task-id");
    const poller = live(async () => {
      const id = input.value.trim();
      if (!id) return { empty: true };
      try { return await api("tasks/" + encodeURIComponent(id)); }
      catch (error) { if (error.status === 404) return { missing: error.message }; throw error; }
    }, (d) => {
      if (d.empty) $("#task").replaceChildren(el("p", { class: "empty" }, "Enter a task id."));
      else if (d.missing) $("#task").replaceChildren(el("p", { class: "empty", id: "task-missing" }, d.missing));
      else renderTask(d);
    });
    $("#search").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = input.value.trim();
      history.replaceState(null, "", id ? `${root}/tasks/${encodeURIComponent(id)}` : `${root}/tasks`);
      poller.now();
    });
  }

  // ------------------------------------------------------------ dead letters
  function deadLettersPage() {
    let confirming = null; // id of the dead letter whose replay awaits confirmation
    let latest = null;
    let offset = 0;
    const LIMIT = 50;
    const message = (text, cls) => { const m = $("#dl-message"); m.replaceChildren(...text); m.className = cls; };

    function query() {
      const params = new URLSearchParams();
      for (const [key, value] of new FormData($("#filters"))) if (value) params.set(key, value);
      params.set("limit", String(LIMIT));
      params.set("offset", String(offset));
      return params.toString();
    }

    async function replay(id) {
      confirming = null;
      try {
        const r = await post(`dead-letters/${encodeURIComponent(id)}/replay`);
        message(["replayed ", taskLink(r.id), ` to queue ${r.queue}`], "ok");
      } catch (error) { message([`replay of ${id} failed: ${error.message}`], "bad"); }
      poller.now();
    }

    function actions(id) {
      if (confirming === id) {
        const yes = el("button", { type: "button", class: "confirm" }, "Confirm replay");
        const no = el("button", { type: "button", class: "cancel" }, "Cancel");
        yes.addEventListener("click", () => replay(id));
        no.addEventListener("click", () => { confirming = null; render(latest); });
        return el("td", { class: "actions" }, yes, no);
      }
      const button = el("button", { type: "button", class: "replay" }, "Replay");
      button.addEventListener("click", () => { confirming = id; render(latest); });
      return el("td", { class: "actions" }, button);
    }

    function render(d) {
      latest = d;
      $("#purge-ns").textContent = d.namespace;
      const shown = d.matched === d.total ? `${d.total} dead letter(s)` : `${d.matched} of ${d.total} dead letter(s) match`;
      $("#dl-summary").textContent = shown + (d.truncated ? " (only the newest were searched)" : "");
      const last = Math.min(d.offset + d.items.length, d.matched);
      $("#dl-page").textContent = d.items.length ? `${d.offset + 1}–${last} of ${d.matched}` : "";
      $("#dl-prev").disabled = d.offset === 0;
      $("#dl-next").disabled = last >= d.matched;
      fill("#letters", d.items.map((x) => el("tr", { "data-id": x.id },
        el("td", { class: "mono" }, taskLink(x.id)),
        el("td", {}, x.task || "?"),
        el("td", {}, x.queue ? queueLink(x.queue) : "?"),
        el("td", {}, x.reason),
        el("td", { class: "mono error", title: x.error }, short(x.error, 160)),
        el("td", { class: "mono args" }, short(json(x.args), 120)),
        el("td", { class: "when" }, time(x.failed_at)),
        actions(x.id))), "no dead letters");
    }

    const poller = live(() => api("dead-letters?" + query()), render);
    $("#filters").addEventListener("submit", (event) => { event.preventDefault(); offset = 0; poller.now(); });
    $("#filters").addEventListener("change", () => { offset = 0; poller.now(); });
    $("#dl-next").addEventListener("click", () => { offset += LIMIT; poller.now(); });
    $("#dl-prev").addEventListener("click", () => { offset = Math.max(0, offset - LIMIT); poller.now(); });
    const replayAll = $("#replay-all");
    const startAll = $("#replay-all-start");
    startAll.addEventListener("click", () => {
      const yes = el("button", { type: "button", class: "confirm", id: "replay-all-do" },
        `Confirm: replay all ${latest ? latest.matched : ""} matching`);
      const no = el("button", { type: "button", class: "cancel" }, "Cancel");
      no.addEventListener("click", () => replayAll.replaceChildren(startAll));
      yes.addEventListener("click", async () => {
        const payload = { confirm: "all matching" };
        for (const [key, value] of new FormData($("#filters"))) if (value && key !== "q") payload[key] = value;
        replayAll.replaceChildren(startAll);
        await act("#dl-message", "dead-letters/replay", payload,
          (r) => {
            const again = r.outcomes["dead-lettered again"] || 0;
            const replayed = (r.outcomes.replayed || 0) + again;
            const note = again ? ` (${again} of them dead-lettered again already)` : "";
            return `replayed ${replayed} of ${r.matched} matching dead letter(s)${note}`;
          });
        offset = 0;
        poller.now();
      });
      replayAll.replaceChildren(yes, no);
    });

    const form = $("#purge-confirm");
    const input = $("#purge-input");
    $("#purge-start").addEventListener("click", () => { form.hidden = false; input.focus(); });
    $("#purge-cancel").addEventListener("click", () => { form.hidden = true; input.value = ""; });
    input.addEventListener("input", () => { $("#purge-do").disabled = input.value !== body.dataset.namespace; });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        const r = await post("dead-letters/purge", { confirm: input.value });
        message([`purged ${r.purged} dead letter(s)`], "ok");
        form.hidden = true;
        input.value = "";
      } catch (error) { message([`purge failed: ${error.message}`], "bad"); }
      poller.now();
    });
  }

  // ------------------------------------------------------- workers, periodic
  const sizes = {}; // the pool size typed for each worker, kept across re-renders
  function workerActions(w) {
    const path = `workers/${encodeURIComponent(w.id)}`;
    const input = el("input", { type: "number", min: 1, max: 100000, class: "size", "aria-label": "pool size",
      value: sizes[w.id] ?? w.concurrency ?? 1 });
    input.addEventListener("input", () => { sizes[w.id] = input.value; });
    const resize = confirmable(`resize:${w.id}`, "Resize", "Confirm resize", () => act("#workers-message",
      `${path}/resize`, { confirm: w.id, concurrency: Number(sizes[w.id] ?? input.value) },
      (r) => `asked worker ${r.worker} to run ${r.concurrency} at once`));
    const stop = confirmable(`shutdown:${w.id}`, "Shut down", "Confirm shutdown", () => act("#workers-message",
      `${path}/shutdown`, { confirm: w.id }, (r) => `asked worker ${r.worker} to shut down`));
    return el("span", { class: "worker-actions" }, input, resize, stop);
  }

  function workersPage() {
    live(() => api("workers"), (d) => fill("#workers", d.workers.map((w) => el("tr", { "data-id": w.id },
      el("td", { class: "mono id" }, w.id),
      el("td", { class: "host" }, w.host || "–"),
      el("td", { class: "num pid" }, w.pid ?? "–"),
      el("td", { class: "queues" }, (w.queues || []).join(", ")),
      el("td", { class: "num concurrency" }, w.concurrency ?? "–"),
      el("td", { class: "num running" }, w.running ?? "–"),
      el("td", { class: "num finished" }, w.processed ?? "–"),
      el("td", { class: "num failed" }, w.failed ?? "–"),
      el("td", { class: "started" }, time(w.started_at)),
      el("td", { class: "heartbeat" }, w.heartbeat_at ? `${time(w.heartbeat_at)} (${ago(w.heartbeat_at)})` : "–"),
      el("td", { class: "actions" }, workerActions(w)))),
    "no live workers"), true);
  }

  function periodicActions(p) {
    const path = `periodic/${encodeURIComponent(p.name)}`;
    const run = confirmable(`run:${p.name}`, "Run now", "Confirm run", () => act("#periodic-message",
      `${path}/run`, { confirm: p.name }, (r) => `sent ${r.name} as task ${r.id} to ${r.queue}`));
    const toggle = p.paused
      ? confirmable(`presume:${p.name}`, "Resume", "Confirm resume", () => act("#periodic-message",
        `${path}/resume`, { confirm: p.name }, (r) => `${r.name} resumed`))
      : confirmable(`ppause:${p.name}`, "Pause", "Confirm pause", () => act("#periodic-message",
        `${path}/pause`, { confirm: p.name }, (r) => `${r.name} paused`));
    return el("span", {}, p.paused ? el("span", { class: "state state-cancelled" }, "paused") : null, run, toggle);
  }

  function periodicPage() {
    const local = (iso) => (iso ? iso.replace("T", " ") : "–");
    live(() => api("periodic"), (d) => fill("#periodic", d.periodic.map((p) => el("tr", { "data-name": p.name },
      el("td", {}, p.name),
      el("td", {}, p.task),
      el("td", { class: "mono wrap" }, p.schedule),
      el("td", {}, p.tz),
      el("td", {}, p.missed),
      el("td", {}, p.queue),
      el("td", {}, local(p.next_run_local)),
      el("td", {}, local(p.last_run_local)),
      el("td", {}, p.source === "runtime" ? "run-time" : p.source),
      el("td", { class: "actions" }, periodicActions(p)))),
    "no periodic tasks registered on this Queue"));
  }


  // -------------------------------------------------------------- task list
  // The list of the tasks page and of a queue's page: filters, a cursor pager, live.
  function taskList() {
    const form = $("#list-filters");
    if (!form) return;
    let cursor = null;
    let page = 1;
    let latest = null;
    function query() {
      const params = new URLSearchParams();
      for (const [key, value] of new FormData(form)) {
        if (!value) continue;
        if (key === "since") params.set("since", String(Date.now() / 1000 - Number(value)));
        else params.set(key, value);
      }
      if (cursor) params.set("cursor", cursor);
      params.set("limit", "25");
      return params.toString();
    }
    function note(d) {
      const ended = d.index > 0
        ? `Ended tasks come from each queue's index of its newest ${d.index} (recent_index), kept result_ttl; `
        : "The index of ended tasks is off (recent_index=0): succeeded, failed and cancelled tasks are not listed; ";
      return ended + "running tasks from the workers (their oldest 20 each); queued and scheduled ones from the queues and the schedule. " +
        "Arguments show where a record or message keeps them.";
    }
    function actions(x) {
      const id = x.id;
      if (x.state === "queued" || x.state === "scheduled" || x.state === "running") {
        return confirmable(`cancel:${id}`, "Cancel", "Confirm cancel", () => act("#list-message",
          `tasks/${encodeURIComponent(id)}/cancel`, { confirm: id },
          (r) => `task ${r.id}: ${r.cancelled}`).then(() => poller.now()));
      }
      if (x.state === "dead_lettered") {
        return confirmable(`replay:${id}`, "Replay", "Confirm replay", () => act("#list-message",
          `dead-letters/${encodeURIComponent(id)}/replay`, { confirm: id },
          (r) => `replayed ${r.id} to queue ${r.queue}`).then(() => poller.now()));
      }
      return null;
    }
    function render(d) {
      latest = d;
      $("#list-note").textContent = note(d);
      fill("#task-list", d.items.map((x) => el("tr", { "data-id": x.id, "data-state": x.state },
        el("td", { class: "mono id" }, taskLink(x.id)),
        el("td", { class: "task" }, x.task),
        el("td", { class: "queue" }, queueLink(x.queue)),
        el("td", {}, el("span", { class: `state state-${x.state}` }, x.state)),
        el("td", { class: "when" }, time(x.at)),
        el("td", { class: "mono args", title: x.args === null ? "" : json([x.args, x.kwargs]) },
          x.args === null ? "–" : short(json(x.args), 60)),
        el("td", { class: "actions" }, actions(x)))), "no tasks");
      $("#list-next").disabled = !d.next;
      $("#list-first").disabled = page === 1;
      $("#list-page").textContent = `page ${page}` + (d.next ? "" : " (last)");
    }
    const poller = live(() => api("tasks?" + query()), render);
    const restart = () => { cursor = null; page = 1; poller.now(); };
    form.addEventListener("submit", (event) => { event.preventDefault(); restart(); });
    form.addEventListener("change", restart);
    $("#list-next").addEventListener("click", () => {
      if (!latest || !latest.next) return;
      cursor = latest.next; page += 1; poller.now();
    });
    $("#list-first").addEventListener("click", restart);
  }

  // ------------------------------------------------------------- one queue
  function queuePage() {
    const name = $("[data-queue]").dataset.queue;
    const base = name.replace(/:(high|low)$/, "");
    live(() => api("queues"), (d) => {
      const rows = d.queues.filter((q) => q.name === name || q.name.replace(/:(high|low)$/, "") === name);
      $("#q-waiting").textContent = rows.reduce((n, q) => n + q.waiting, 0);
      $("#q-running").textContent = rows.reduce((n, q) => n + q.in_flight, 0);
      const paused = rows.some((q) => q.paused);
      $("#q-state").textContent = paused ? "paused" : "active";
      const path = `queues/${encodeURIComponent(base)}`;
      const toggle = paused
        ? confirmable(`resume:${base}`, "Resume", "Confirm resume", () => act("#list-message", `${path}/resume`, { confirm: base }, () => `queue ${base} resumed`))
        : confirmable(`pause:${base}`, "Pause", "Confirm pause", () => act("#list-message", `${path}/pause`, { confirm: base }, () => `queue ${base} paused`));
      const purge = confirmable(`purge:${name}`, "Purge waiting messages", "Confirm purge", () => act("#list-message",
        `queues/${encodeURIComponent(name)}/purge`, { confirm: name }, (r) => `purged ${r.purged} message(s) from ${r.queue}`));
      $("#queue-actions").replaceChildren(toggle, purge);
    });
    taskList();
  }

  // ---------------------------------------------------------------- charts
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    for (const child of children) node.append(child);
    return node;
  }
  // A line chart of `series` ([{name, values}]) over `times` (Unix seconds).
  function chart(title, times, series, unit) {
    const W = 360, H = 150, L = 62, B = 22, T = 8;
    const all = series.flatMap((s) => s.values.filter((v) => v !== null));
    const top = Math.max(...all, 0) || 1;
    const x = (i) => L + (times.length < 2 ? 0 : (i * (W - L - 4)) / (times.length - 1));
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
    box.append(svg("line", { x1: L, y1: H - B, x2: W - 4, y2: H - B, class: "axis" }));
    box.append(svg("text", { x: L - 4, y: T + 8, class: "tick", "text-anchor": "end" }, fmt(top, unit)));
    box.append(svg("text", { x: L - 4, y: H - B, class: "tick", "text-anchor": "end" }, "0"));
    if (times.length) {
      box.append(svg("text", { x: L, y: H - 6, class: "tick" }, clock(times[0])));
      box.append(svg("text", { x: W - 4, y: H - 6, class: "tick", "text-anchor": "end" }, clock(times[times.length - 1])));
    }
    series.forEach((s, n) => {
      const k = s.color ?? n;
      const points = s.values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
      if (points.length) box.append(svg("polyline", { points: points.join(" "), class: `line line-${k}` }));
    });
    const legend = el("p", { class: "legend" }, ...series.map((s, n) => el("span", { class: `key key-${s.color ?? n}` }, s.name)));
    return el("figure", { class: "chart-box", "data-chart": title }, el("figcaption", {}, title), box, legend);
  }
  function fmt(v, unit) {
    if (unit === "s") return seconds(v);
    return v >= 100 ? v.toFixed(0) : v.toFixed(2).replace(/\.?0+$/, "");
  }
  function chartsPage() {
    const form = $("#chart-range");
    const poller = live(() => api("series?minutes=" + new FormData(form).get("minutes")), (d) => {
      const p = d.points;
      const times = p.map((q) => q.at);
      const queues = [...new Set(p.flatMap((q) => Object.keys(q.depth)))].sort();
      const nulls = (key) => p.map((q) => q[key]);
      $("#charts").replaceChildren(
        chart("Throughput (tasks / s)", times, [
          { name: "finished", values: p.map((q) => q.done_per_s) },
          { name: "failed", values: p.map((q) => q.failed_per_s) }]),
        chart("Failures (tasks / s)", times, [{ name: "failed", color: 1, values: p.map((q) => q.failed_per_s) }]),
        chart("Queue depth (waiting)", times, queues.slice(0, 6).map((name) => ({
          name, values: p.map((q) => (name in q.depth ? q.depth[name] : null)) }))),
        chart("Wait latency", times, [
          { name: "p50", values: nulls("wait_p50") }, { name: "p95", values: nulls("wait_p95") },
          { name: "p99", values: nulls("wait_p99") }], "s"),
        chart("Run latency", times, [
          { name: "p50", values: nulls("run_p50") }, { name: "p95", values: nulls("run_p95") },
          { name: "p99", values: nulls("run_p99") }], "s"));
    });
    form.addEventListener("change", () => poller.now());
  }

  const pages = {
    queues: queuesPage,
    tasks: () => { taskList(); tasksPage(); },
    queue: queuePage,
    charts: chartsPage,
    "dead-letters": deadLettersPage,
    workers: workersPage,
    periodic: periodicPage,
  };
  (pages[body.dataset.page] || (() => {}))();
})();
