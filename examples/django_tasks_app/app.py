"""A one-file Django project using Django's tasks framework, with blitzq as its backend.

Run it from this directory (``BLITZQ_REDIS_URL=redis://localhost:6379/0`` to use a Redis
server; without it both processes share the embedded server in ``./.blitzq``)::

    pip install -e "../..[django]"    # from the checkout (Python < 3.12: the backport too)
    DJANGO_SETTINGS_MODULE=settings blitzq worker --django &
    python app.py runserver 8000 --noreload &
    curl -s -X POST localhost:8000/signup -d name=ada
    # {"signup_id": 1, "result_id": "5d0a…"}
    curl -s localhost:8000/result/5d0a…
    # {"status": "SUCCESSFUL", "return_value": "Welcome, ada! (signup #1)"}
    curl -s localhost:8000/result/no-such-id
    # 404 {"error": "no task result with id no-such-id"}

The view saves a row and enqueues ``send_welcome`` inside ``transaction.atomic()``; with
``ENQUEUE_ON_COMMIT`` the message is published once the row is committed.
"""

from __future__ import annotations

import os
import sys

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")


def signup(request: HttpRequest) -> JsonResponse:
    """POST name=…: save a signup and enqueue its welcome task (published on commit)."""
    from tasks import send_welcome

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO signup (name) VALUES (%s)", [request.POST["name"]])
            signup_id = cursor.lastrowid
        result = send_welcome.enqueue(signup_id)
    return JsonResponse({"signup_id": signup_id, "result_id": result.id})


def result(request: HttpRequest, result_id: str) -> JsonResponse:
    """The framework's view of a task: its status and, once it succeeded, its return value;
    404 with a JSON error for an id the backend has no record of (unknown, or expired)."""
    from tasks import TaskResultDoesNotExist, send_welcome

    try:
        found = send_welcome.get_result(result_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": f"no task result with id {result_id}"}, status=404)
    value = found.return_value if found.status == "SUCCESSFUL" else None
    return JsonResponse({"status": found.status, "return_value": value})


urlpatterns = [path("signup", signup), path("result/<str:result_id>", result)]


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
