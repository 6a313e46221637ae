"""Flask + blitzq: a view enqueues a task with the sync API; another reads the result.

Run it from the repository root (``BLITZQ_REDIS_URL=redis://localhost:6379/0`` to use a Redis
server; without it both processes share the embedded server in ``./.blitzq``)::

    pip install -e ".[flask]"    # from the checkout
    blitzq worker examples.flask_app:queue &
    flask --app examples.flask_app run --port 5000 &
    curl -s -X POST localhost:5000/thumbnails -H 'content-type: application/json' \\
        -d '{"width": 640, "height": 480}'
    # {"task_id":"9b1e…"}
    curl -s 'localhost:5000/thumbnails/9b1e…?wait=5'
    # {"error":null,"result":[160,120],"state":"succeeded","task_id":"9b1e…"}

Views are synchronous, so they call ``enqueue_sync`` / ``get_result_sync``: every request
thread shares the Queue's one background event loop. ``init_app`` puts the Queue in
``app.extensions`` and closes that loop once, when the app goes away (not per request).
"""

from __future__ import annotations

import contextlib
from typing import Any

from flask import Flask, request

from blitzq import Queue, ResultTimeout, TaskFailed
from blitzq.integrations.flask import get_queue, init_app

queue = Queue("thumbnails")


@queue.task
def make_thumbnail(width: int, height: int, scale: int = 4) -> tuple[int, int]:
    """Size of the thumbnail of a ``width`` x ``height`` image (a sync task: a thread)."""
    return max(1, width // scale), max(1, height // scale)


def create_app() -> Flask:
    """The Flask application, with ``queue`` attached."""
    app = Flask(__name__)
    init_app(app, queue)

    @app.post("/thumbnails")
    def create_thumbnail() -> tuple[dict[str, str], int]:
        body = request.get_json(force=True)
        handle = make_thumbnail.enqueue_sync(int(body["width"]), int(body["height"]))
        return {"task_id": handle.id}, 202

    @app.get("/thumbnails/<task_id>")
    def get_thumbnail(task_id: str) -> dict[str, Any]:
        q = get_queue()
        wait = min(float(request.args.get("wait", 0)), 30.0)
        if wait > 0:
            with contextlib.suppress(ResultTimeout, TaskFailed):
                q.get_result_sync(task_id, timeout=wait)
        record = q.inspect_sync(task_id)
        if record is None:
            return {"task_id": task_id, "state": "pending", "result": None, "error": None}
        return {
            "task_id": task_id,
            "state": record.state.value,
            "result": record.result,
            "error": record.error,
        }

    return app


app = create_app()
