"""The example's task, declared with Django's own ``@task`` (no blitzq import)."""

from __future__ import annotations

from django.db import connection

try:
    from django.tasks import task
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]

__all__ = ["TaskResultDoesNotExist", "send_welcome"]


@task(priority=10)
def send_welcome(signup_id: int) -> str:
    """Read the signup (committed before the task was published) and 'send' its welcome."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM signup WHERE id = %s", [signup_id])
        (name,) = cursor.fetchone()
    return f"Welcome, {name}! (signup #{signup_id})"
