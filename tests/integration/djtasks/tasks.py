"""Django tasks of the test project, declared with the framework's ``@task`` (Django 6's
``django.tasks``, else the ``django_tasks`` backport)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.db import connection

try:
    from django.tasks import task
except ImportError:  # Django < 6: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@task(queue_name="emails", priority=10)
def shout(text: str) -> str:
    """Return ``text`` in capitals (queue ``emails``, high priority)."""
    return text.upper()


@task
def boom(message: str) -> None:
    """Fail with ``ValueError(message)``."""
    raise ValueError(message)


@task(takes_context=True)
def whoami(context: Any, x: int) -> dict[str, Any]:
    """Return what the task context tells: the result id and the attempt."""
    return {"id": context.task_result.id, "attempt": context.attempt, "x": x}


@task
async def slow_add(a: int, b: int) -> tuple[int, int, int]:
    """An async task: return ``(a, b, a + b)`` (a tuple: the result reads a list)."""
    await asyncio.sleep(0)
    return (a, b, a + b)


@task
def query() -> int:
    """Run a query on the worker's database connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 41 + 1")
        row = cursor.fetchone()
    return int(row[0])
