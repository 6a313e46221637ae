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
  function time(ts) {
    if (ts === null || ts === undefined) return "–";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
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
  const json = (value) => (value === null || value === undefined ? "–" : JSON.stringify(value));
  const taskLink = (id) => el("a", { href: `${root}/tasks/${encodeURIComponent(id)}` }, id);

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

  // Poll `load` every `refresh` ms; `render` runs when the answer changed (or every time
  // with `always`, for pages showing times relative to now).
  function live(load, render, always) {
    let last = null;
    let timer = null;
    async function tick() {
      try {
        const doc = await load();
        const key = JSON.stringify(doc);
        if (always || key !== last) { last = key; render(doc); }
        refreshAgo();
        status(null);
      } catch (error) { status(error); }
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
        el("td", {}, q.name),
        el("td", { class: "num waiting" }, q.waiting),
        el("td", { class: "num running" }, q.in_flight),
        el("td", { class: "num" }, rate(q.depth_per_s)))), "no queues used yet");
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
    const message = (text, cls) => { const m = $("#dl-message"); m.replaceChildren(...text); m.className = cls; };

    function query() {
      const params = new URLSearchParams();
      for (const [key, value] of new FormData($("#filters"))) if (value) params.set(key, value);
      params.set("limit", "100");
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
      fill("#letters", d.items.map((x) => el("tr", { "data-id": x.id },
        el("td", { class: "mono" }, taskLink(x.id)),
        el("td", {}, x.task || "?"),
        el("td", {}, x.queue),
        el("td", {}, x.reason),
        el("td", { class: "mono error", title: x.error }, short(x.error, 160)),
        el("td", { class: "mono" }, short(json(x.args), 120)),
        el("td", {}, time(x.failed_at)),
        actions(x.id))), "no dead letters");
    }

    const poller = live(() => api("dead-letters?" + query()), render);
    $("#filters").addEventListener("submit", (event) => { event.preventDefault(); poller.now(); });
    $("#filters").addEventListener("change", () => poller.now());

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
      el("td", { class: "heartbeat" }, w.heartbeat_at ? `${time(w.heartbeat_at)} (${ago(w.heartbeat_at)})` : "–"))),
    "no live workers"), true);
  }

  function periodicPage() {
    const local = (iso) => (iso ? iso.replace("T", " ") : "–");
    live(() => api("periodic"), (d) => fill("#periodic", d.periodic.map((p) => el("tr", { "data-name": p.name },
      el("td", {}, p.name),
      el("td", {}, p.task),
      el("td", { class: "mono" }, p.schedule),
      el("td", {}, p.tz),
      el("td", {}, p.missed),
      el("td", {}, p.queue),
      el("td", {}, local(p.next_run_local)),
      el("td", {}, local(p.last_run_local)),
      el("td", {}, p.source === "runtime" ? "run-time" : p.source))),
    "no periodic tasks registered on this Queue"));
  }

  const pages = {
    queues: queuesPage,
    tasks: tasksPage,
    "dead-letters": deadLettersPage,
    workers: workersPage,
    periodic: periodicPage,
  };
  (pages[body.dataset.page] || (() => {}))();
})();
