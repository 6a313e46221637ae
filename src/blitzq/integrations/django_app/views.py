"""A read-only admin page of blitzq's task records, for Django's admin site.

The records live in Redis (``{ns}:t:<id>``, until ``result_ttl``), not in the database, so
there is no model and no ``ModelAdmin``: a ``ModelAdmin`` needs a table, and a non-managed
model would still query one. These are plain views wrapped by ``admin.site.admin_view`` (the
admin's login and staff check) and drawn in the admin's templates, listing the records
through blitzq's inspection API (:func:`blitzq.client.listing.recent_records`, a bounded scan)::

    # urls.py (before the admin's own patterns, whose catch-all would answer first)
    urlpatterns = [
        path("admin/blitzq/tasks/", include("blitzq.integrations.django_app.urls")),
        path("admin/", admin.site.urls),
    ]

The Queue read is ``settings.BLITZQ_QUEUE`` (``"module:attribute"`` of a blitzq Queue) when
set, else the Queue of the blitzq backend in ``TASKS`` (as ``manage.py blitzq_worker`` runs).
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ...client.listing import RecordPage, recent_records
from ...client.lookup import inspect
from ...exceptions import BlitzQError
from ...queue import Queue
from ...records import TaskRecord, TaskState

#: Rows a page shows at most.
PAGE_ROWS = 100
#: The states offered as filters, in the order of a task's life.
STATES = [state.value for state in TaskState if state is not TaskState.CANCELLING]


def admin_queue() -> Queue:
    """The Queue whose records the page lists (module docstring).

    Raises:
        ImproperlyConfigured: ``BLITZQ_QUEUE`` does not name a Queue, or it is unset and
            ``TASKS`` has no blitzq backend.
    """
    spec = getattr(settings, "BLITZQ_QUEUE", None)
    if spec:
        module, _, attr = str(spec).partition(":")
        try:
            found: Any = importlib.import_module(module)
            for part in attr.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImproperlyConfigured(f"BLITZQ_QUEUE = {spec!r}: {exc}") from None
        if not isinstance(found, Queue):
            raise ImproperlyConfigured(f"BLITZQ_QUEUE = {spec!r} is not a blitzq.Queue")
        return found
    try:
        from ..django_tasks import BlitzqTaskBackend, framework
        from ..django_worker import _backend_alias

        backend = framework.task_backends[_backend_alias()]
    except Exception as exc:  # no framework, no such alias, several blitzq backends
        raise ImproperlyConfigured(
            "blitzq's admin page needs BLITZQ_QUEUE = 'module:queue' or a TASKS backend "
            f"blitzq.integrations.django.BlitzqTaskBackend ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(backend, BlitzqTaskBackend):
        raise ImproperlyConfigured("the TASKS backend is not blitzq's: set BLITZQ_QUEUE")
    queue: Queue = backend.queue
    return queue


def _when(unix: float | None) -> datetime | None:
    return None if unix is None else datetime.fromtimestamp(unix, tz=UTC)


def _row(record: TaskRecord) -> dict[str, Any]:
    error = f"{record.error_type}: {record.error}" if record.error_type else ""
    return {
        "id": record.id,
        "task": record.task,
        "queue": record.queue,
        "state": record.state.value,
        "attempts": record.attempts,
        "enqueued_at": _when(record.enqueued_at),
        "started_at": _when(record.started_at),
        "finished_at": _when(record.finished_at),
        "error": error,
        "worker": record.worker or "",
    }


def _context(request: HttpRequest, title: str, **more: Any) -> dict[str, Any]:
    return {**admin.site.each_context(request), "title": title, **more}


def task_list(request: HttpRequest) -> HttpResponse:
    """The newest task records, filtered by ``?state=`` (repeatable) and ``?queue=``,
    searched by ``?q=`` (a task id or its start)."""
    queue = admin_queue()
    states = [TaskState(s) for s in request.GET.getlist("state") if s in STATES]
    queue_name = request.GET.get("queue", "").strip() or None
    search = request.GET.get("q", "").strip() or None

    async def read() -> RecordPage:
        return await recent_records(
            queue.broker, limit=PAGE_ROWS, states=states, queue=queue_name, search=search
        )

    try:
        page = queue._portal.call(read())
        error = None
    except BlitzQError as exc:  # the broker is down: say so on the page
        page, error = RecordPage([], 0, 0, False), str(exc)
    queues = sorted({r.queue for r in page.records})
    context = _context(
        request,
        "Task records",
        rows=[_row(r) for r in page.records],
        page=page,
        error=error,
        states=STATES,
        chosen_states=[s.value for s in states],
        queue_name=queue_name or "",
        queues=queues,
        search=search or "",
        namespace=queue.namespace,
        page_rows=PAGE_ROWS,
    )
    return TemplateResponse(request, "blitzq/admin/task_list.html", context)


def task_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    """One task's record: the list's columns plus its result, traceback and arguments.

    Raises:
        Http404: no record of ``task_id`` (unknown, or expired after ``result_ttl``).
    """
    queue = admin_queue()

    async def read() -> TaskRecord | None:
        return await inspect(queue.broker, task_id)

    try:
        record = queue._portal.call(read())
    except BlitzQError as exc:
        raise Http404(f"no record of {task_id}: {exc}") from None
    if record is None:
        raise Http404(f"no record of task {task_id}")
    context = _context(
        request,
        f"Task {record.id}",
        row=_row(record),
        record=record,
        result=repr(record.result) if record.state is TaskState.SUCCEEDED else None,
        namespace=queue.namespace,
    )
    return TemplateResponse(request, "blitzq/admin/task_detail.html", context)
