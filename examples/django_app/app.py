"""A one-file Django project: a signup is saved and its welcome task enqueued on commit.

Run it from this directory (``BLITZQ_REDIS_URL=redis://localhost:6379/0`` to use a Redis server;
without it both processes share the embedded server in ``./.blitzq``)::

    pip install -e "../..[django]"    # from the checkout
    blitzq worker tasks:queue &
    python app.py runserver 8000 --noreload &
    curl -s -X POST localhost:8000/signup -d name=ada
    # {"signup_id": 1, "task_id": "5d0a…"}
    curl -s 'localhost:8000/result/5d0a…'
    # {"state": "succeeded", "result": "Welcome, ada! (signup #1)"}
    curl -s -X POST localhost:8000/signup -d name=ada -d fail=1
    # {"rolled_back": true, "task_id": "77c4…"}   (that task is never enqueued)

The view inserts a row and calls ``enqueue_on_commit`` inside ``transaction.atomic()``: the
worker only sees the task once the row is committed, and a rolled-back signup enqueues nothing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from tasks import queue, send_welcome

from blitzq.integrations.django import enqueue_on_commit

settings.configure(
    DEBUG=True,
    SECRET_KEY="example-only",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(tempfile.gettempdir()) / "blitzq-django-example.sqlite3"),
        }
    },
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
)


class Rollback(Exception):
    """Raised inside the transaction to show that nothing is enqueued then."""


def signup(request: HttpRequest) -> JsonResponse:
    """POST name=…: save a signup and enqueue its welcome task once the row is committed."""
    name = request.POST.get("name", "anonymous")
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO signup (name) VALUES (%s)", [name])
                signup_id = cursor.lastrowid
            task_id = enqueue_on_commit(send_welcome, signup_id, name)
            if request.POST.get("fail"):
                raise Rollback
    except Rollback:
        return JsonResponse({"rolled_back": True, "task_id": task_id})
    return JsonResponse({"signup_id": signup_id, "task_id": task_id})


def result(request: HttpRequest, task_id: str) -> JsonResponse:
    """State and result of a welcome task (``pending`` while it waits in the queue)."""
    record = queue.inspect_sync(task_id)
    if record is None:
        return JsonResponse({"state": "pending", "result": None})
    return JsonResponse({"state": record.state.value, "result": record.result})


urlpatterns = [path("signup", signup), path("result/<str:task_id>", result)]


def main(argv: list[str]) -> None:
    """Set Django up, create the table, then run a management command (``runserver``)."""
    import django
    from django.core.management import execute_from_command_line

    django.setup()
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS signup (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)"
        )
    execute_from_command_line(argv)


if __name__ == "__main__":
    main(sys.argv)
