"""The dashboard's pages as HTML: one shell (navigation, status line) around each page's
skeleton, which ``static/app.js`` fills from the JSON API.

Every value put into the HTML here is escaped (:func:`html.escape`, quotes included); user
data (task ids, arguments, errors) reaches the page only through the API and is written by
the script as text, never as markup.
"""

from __future__ import annotations

from html import escape

from ..dead_letters import DEAD_LETTER_REASONS

__all__ = ["PAGES", "render"]

#: Page name -> (path under the app's root, title in the navigation).
PAGES: dict[str, tuple[str, str]] = {
    "queues": ("/", "Queues"),
    "tasks": ("/tasks", "Tasks"),
    "charts": ("/charts", "Charts"),
    "dead-letters": ("/dead-letters", "Dead letters"),
    "workers": ("/workers", "Workers"),
    "periodic": ("/periodic", "Periodic"),
}


def _table(table_id: str, headers: list[str], numeric: tuple[str, ...] = ()) -> str:
    cells = "".join(f"<th{' class=num' if h in numeric else ''}>{escape(h)}</th>" for h in headers)
    return (
        f'<table id="{table_id}"><thead><tr>{cells}</tr></thead>'
        f'<tbody><tr><td colspan="{len(headers)}" class="empty">loading…</td></tr></tbody>'
        "</table>"
    )


def _queues(root: str, note: str = "") -> str:
    summary = "".join(
        f'<div class="card"><span class="label">{label}</span>'
        f'<span class="value" id="s-{key}">-</span></div>'
        for key, label in (
            ("scheduled", "scheduled"),
            ("running", "running"),
            ("workers", "workers"),
            ("completed", "finished / s"),
            ("failed", "failed / s"),
        )
    )
    dead = (
        f'<a class="card link" id="dead-link" href="{root}/dead-letters">'
        '<span class="label">dead letters</span><span class="value" id="s-dead">-</span></a>'
    )
    return (
        f'<section class="cards">{summary}{dead}</section>'
        "<h2>Queues</h2>"
        + '<div class="scroll">'
        + _table(
            "queues",
            ["queue", "waiting", "running", "depth change / s", "state"],
            ("waiting", "running", "depth change / s"),
        )
        + "</div>"
        + '<p class="hint">Running counts tasks taken by a worker and not yet acknowledged '
        "(reliable mode). Rates compare the workers' counters over the last 30 s.</p>"
        + (f'<p class="hint" id="count-note">{escape(note)}.</p>' if note else "")
    )


_STATES = (
    ("recent", "recent (ended)"),
    ("running", "running"),
    ("queued", "queued"),
    ("scheduled", "scheduled"),
    ("succeeded", "succeeded"),
    ("failed", "failed"),
    ("dead_lettered", "dead-lettered"),
    ("cancelled", "cancelled"),
)


def _task_list(queue: str = "") -> str:
    """The filter bar, table and pager of a task list (``queue`` fixed on a queue's page)."""
    states = "".join(f'<option value="{v}">{escape(label)}</option>' for v, label in _STATES)
    queue_field = (
        f'<input type="hidden" name="queue" value="{escape(queue)}">'
        if queue
        else '<input name="queue" placeholder="queue" spellcheck="false">'
    )
    return (
        '<form id="list-filters" class="bar" autocomplete="off">'
        f'<select name="state" aria-label="state">{states}</select>{queue_field}'
        '<input name="task" placeholder="task name" spellcheck="false">'
        '<input name="q" placeholder="id prefix or text in args" spellcheck="false">'
        '<select name="since" aria-label="time"><option value="">any time</option>'
        '<option value="300">last 5 min</option><option value="3600">last hour</option>'
        '<option value="86400">last day</option></select>'
        '<button type="submit">Filter</button></form>'
        '<p id="list-note" class="hint"></p><p id="list-message" role="status"></p>'
        '<div class="scroll">'
        + _table("task-list", ["id", "task", "queue", "state", "when", "args", ""])
        + "</div>"
        '<nav class="pager"><button type="button" id="list-first" disabled>Newest</button>'
        '<button type="button" id="list-next" disabled>Next page</button>'
        '<span id="list-page" class="muted"></span></nav>'
    )


def _tasks(task_id: str) -> str:
    return (
        _task_list() + "<h2>Look up a task</h2>"
        '<form id="search" class="bar" autocomplete="off">'
        '<label for="task-id">Task id</label>'
        f'<input id="task-id" name="id" value="{escape(task_id)}" size="48" '
        'placeholder="e.g. 3f2c…" spellcheck="false">'
        '<button type="submit">Look up</button></form>'
        '<section id="task"><p class="empty">Enter a task id.</p></section>'
    )


def _queue(name: str) -> str:
    return (
        f'<section class="cards" data-queue="{escape(name)}">'
        '<div class="card"><span class="label">waiting</span>'
        '<span class="value" id="q-waiting">-</span></div>'
        '<div class="card"><span class="label">running</span>'
        '<span class="value" id="q-running">-</span></div>'
        '<div class="card"><span class="label">state</span>'
        '<span class="value" id="q-state">-</span></div></section>'
        '<section class="actions-bar" id="queue-actions"></section>'
        "<h2>Tasks</h2>" + _task_list(name)
    )


def _charts() -> str:
    return (
        '<form id="chart-range" class="bar"><select name="minutes" aria-label="range">'
        '<option value="10">last 10 min</option><option value="30">last 30 min</option>'
        '<option value="60">last hour</option></select></form>'
        '<div id="charts" class="charts"><p class="empty">loading…</p></div>'
        '<p class="hint">From the 10 s samples each worker adds to the broker (kept an hour). '
        "Latencies are the upper bounds of histogram buckets: wait is enqueued to started, "
        "run is started to ended.</p>"
    )


def _dead_letters() -> str:
    reasons = "".join(
        f'<option value="{escape(r)}">{escape(r)}</option>' for r in DEAD_LETTER_REASONS
    )
    return (
        '<form id="filters" class="bar" autocomplete="off">'
        '<input name="task" placeholder="task name" spellcheck="false">'
        '<input name="queue" placeholder="queue" spellcheck="false">'
        f'<select name="reason"><option value="">any reason</option>{reasons}</select>'
        '<input name="error_type" placeholder="error type" spellcheck="false">'
        '<select name="newer_than"><option value="">any time</option>'
        '<option value="3600">in the last hour</option>'
        '<option value="86400">in the last day</option></select>'
        '<select name="older_than"><option value="">any age</option>'
        '<option value="3600">over an hour ago</option>'
        '<option value="86400">over a day ago</option>'
        '<option value="604800">over a week ago</option></select>'
        '<input name="q" placeholder="text in id, task or error" spellcheck="false">'
        '<button type="submit">Filter</button></form>'
        '<p id="dl-summary" class="hint"></p><p id="dl-message" role="status"></p>'
        '<div class="scroll">'
        + _table("letters", ["id", "task", "queue", "reason", "error", "args", "failed", ""])
        + "</div>"
        '<nav class="pager"><button type="button" id="dl-prev" disabled>Newer</button>'
        '<button type="button" id="dl-next" disabled>Older</button>'
        '<span id="dl-page" class="muted"></span></nav>'
        '<section id="replay-all"><button type="button" id="replay-all-start">'
        "Replay all matching…</button></section>"
        '<section id="purge" class="danger"><button type="button" id="purge-start">'
        "Purge all dead letters…</button>"
        '<form id="purge-confirm" hidden><label for="purge-input">Type the namespace '
        '<code id="purge-ns"></code> to delete every dead letter:</label> '
        '<input id="purge-input" autocomplete="off" spellcheck="false"> '
        '<button type="submit" id="purge-do" class="bad" disabled>Delete all</button> '
        '<button type="button" id="purge-cancel">Cancel</button></form></section>'
    )


def _workers() -> str:
    return (
        '<div class="scroll">'
        + _table(
            "workers",
            [
                "id",
                "host",
                "pid",
                "queues",
                "concurrency",
                "running",
                "finished",
                "failed",
                "started",
                "last heartbeat",
                "",
            ],
            ("pid", "concurrency", "running", "finished", "failed"),
        )
        + '</div><p id="workers-message" role="status"></p>'
    )


def _periodic() -> str:
    return (
        '<p id="periodic-message" role="status"></p><div class="scroll">'
        + _table(
            "periodic",
            [
                "name",
                "task",
                "schedule",
                "time zone",
                "missed runs",
                "queue",
                "next run",
                "last run",
                "source",
                "",
            ],
        )
        + '</div><p class="hint">Times are given in each schedule\'s own time zone. Source: code '
        "(<code>Queue.periodic</code>) or run-time (<code>blitzq schedule add</code>).</p>"
    )


def render(
    name: str,
    *,
    root: str,
    namespace: str,
    refresh_ms: int,
    task_id: str = "",
    queue: str = "",
    note: str = "",
) -> str:
    """The HTML of page ``name`` (a key of :data:`PAGES`).

    Args:
        name: the page.
        root: the app's mount path ("" at the top), prefixed to every link.
        namespace: the Queue's namespace, shown in the header.
        refresh_ms: milliseconds between two live updates.
        task_id: the task page's initial search (escaped here).
        queue: the queue of a queue's page (escaped here).
        note: what the queues page's ``waiting`` counts when it is not tasks
            (``Broker.count_note``; escaped here); ``""``: tasks.

    Raises:
        KeyError: an unknown page name (``"queue"``, a queue's page, is not in the
            navigation).
    """
    _, title = PAGES.get(name, ("", f"Queue {queue}"))
    root = escape(root)
    nav = "".join(
        f'<a href="{root}{path}"{" class=current" if key == name else ""}>{escape(label)}</a>'
        for key, (path, label) in PAGES.items()
    )
    body = {
        "queues": lambda: _queues(root, note),
        "tasks": lambda: _tasks(task_id),
        "queue": lambda: _queue(queue),
        "charts": _charts,
        "dead-letters": _dead_letters,
        "workers": _workers,
        "periodic": _periodic,
    }[name]()
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · blitzq</title>"
        f'<link rel="stylesheet" href="{root}/static/app.css"><link rel="icon" href="data:,">'
        f'</head><body data-page="{escape(name)}" data-root="{root}" '
        f'data-namespace="{escape(namespace)}" data-refresh="{int(refresh_ms)}">'
        f'<header><a class="brand" href="{root}/">blitzq</a><nav>{nav}</nav>'
        f'<span class="ns">namespace <code>{escape(namespace)}</code></span>'
        '<span id="status" class="muted">connecting…</span></header>'
        f"<main><h1>{escape(title)}</h1>{body}</main>"
        f'<script src="{root}/static/app.js"></script></body></html>'
    )
