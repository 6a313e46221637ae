"""Flask integration: keep the application's Queue on the app, close it with the app.

::

    app = Flask(__name__)
    init_app(app, queue)

    @app.post("/reports")
    def create_report():
        handle = build_report.enqueue_sync(request.json["month"])
        return {"task_id": handle.id}, 202

Flask views are synchronous, so they use the ``*_sync`` API: one background event loop per
Queue, shared by every request thread. ``init_app`` stores the Queue in
``app.extensions["blitzq"]`` (:func:`get_queue` finds it from a view or a CLI command) and closes
the sync API's connections and loop once, when the app is garbage-collected or the process
exits, or when :func:`close` is called. Not after each request: Flask's ``teardown_appcontext``
runs per request, and reconnecting on every request would cost a round trip each time.
"""

from __future__ import annotations

import weakref

from flask import Flask, current_app

from ..queue import Queue

__all__ = ["EXTENSION", "close", "get_queue", "init_app"]

#: Key of the Queue in ``app.extensions``.
EXTENSION = "blitzq"
_FINALIZERS = "blitzq.finalizer"


def init_app(app: Flask, queue: Queue) -> Queue:
    """Attach ``queue`` to ``app``; its sync API is closed when the app goes away.

    Args:
        app: the Flask application.
        queue: the application's Queue.

    Returns:
        ``queue``.

    Raises:
        RuntimeError: another Queue is already attached to ``app``.
    """
    current = app.extensions.get(EXTENSION)
    if current is not None and current is not queue:
        raise RuntimeError("a different blitzq Queue is already attached to this Flask app")
    if current is None:
        app.extensions[EXTENSION] = queue
        app.extensions[_FINALIZERS] = weakref.finalize(app, queue.close_sync)
    return queue


def get_queue(app: Flask | None = None) -> Queue:
    """The Queue attached to ``app`` (default: the current app).

    Raises:
        RuntimeError: no Queue is attached (call :func:`init_app`), or no app is given and
            there is no application context.
    """
    target = app if app is not None else current_app
    try:
        queue: Queue = target.extensions[EXTENSION]
    except KeyError:
        raise RuntimeError("no blitzq Queue on this Flask app: call init_app(app, queue)") from None
    return queue


def close(app: Flask) -> None:
    """Close the sync API of the Queue attached to ``app`` now (idempotent).

    Its next ``*_sync`` call opens new connections again.
    """
    finalizer = app.extensions.get(_FINALIZERS)
    if isinstance(finalizer, weakref.finalize):
        finalizer()
        # A later use reopens the portal: close it again at exit.
        app.extensions[_FINALIZERS] = weakref.finalize(app, get_queue(app).close_sync)
