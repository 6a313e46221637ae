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


def _queues(root: str) -> str:
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
        + _table(
            "queues",
            ["queue", "waiting", "running", "depth change / s"],
            ("waiting", "running", "depth change / s"),
        )
        + '<p class="hint">Running counts messages taken by a worker and not yet acknowledged '
        "(reliable mode). Rates compare the workers' counters over the last 30 s.</p>"
    )


def _tasks(task_id: str) -> str:
    return (
        '<form id="search" class="bar" autocomplete="off">'
        '<label for="task-id">Task id</label>'
        f'<input id="task-id" name="id" value="{escape(task_id)}" size="48" '
        'placeholder="e.g. 3f2c…" spellcheck="false">'
        '<button type="submit">Look up</button></form>'
        '<section id="task"><p class="empty">Enter a task id.</p></section>'
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
        + _table("letters", ["id", "task", "queue", "reason", "error", "args", "failed", ""])
        + '<section id="purge" class="danger"><button type="button" id="purge-start">'
        "Purge all dead letters…</button>"
        '<form id="purge-confirm" hidden><label for="purge-input">Type the namespace '
        '<code id="purge-ns"></code> to delete every dead letter:</label> '
        '<input id="purge-input" autocomplete="off" spellcheck="false"> '
        '<button type="submit" id="purge-do" class="bad" disabled>Delete all</button> '
        '<button type="button" id="purge-cancel">Cancel</button></form></section>'
    )


def _workers() -> str:
    return _table(
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
        ],
        ("pid", "concurrency", "running", "finished", "failed"),
    )


def _periodic() -> str:
    return (
        _table(
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
            ],
        )
        + '<p class="hint">Times are given in each schedule\'s own time zone. Source: code '
        "(<code>Queue.periodic</code>) or run-time (<code>blitzq schedule add</code>).</p>"
    )


def render(name: str, *, root: str, namespace: str, refresh_ms: int, task_id: str = "") -> str:
    """The HTML of page ``name`` (a key of :data:`PAGES`).

    Args:
        name: the page.
        root: the app's mount path ("" at the top), prefixed to every link.
        namespace: the Queue's namespace, shown in the header.
        refresh_ms: milliseconds between two live updates.
        task_id: the task page's initial search (escaped here).

    Raises:
        KeyError: an unknown page name.
    """
    _, title = PAGES[name]
    root = escape(root)
    nav = "".join(
        f'<a href="{root}{path}"{" class=current" if key == name else ""}>{escape(label)}</a>'
        for key, (path, label) in PAGES.items()
    )
    body = {
        "queues": lambda: _queues(root),
        "tasks": lambda: _tasks(task_id),
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
