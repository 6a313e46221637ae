"""Django integration: enqueue a task only once the surrounding transaction has committed,
and (as ``BlitzqTaskBackend``) the backend of Django's tasks framework.

A view that saves a row and enqueues a task about it inside ``transaction.atomic()`` must not
let a worker see the task before the row exists, nor run it if the transaction rolls back::

    from blitzq.integrations.django import enqueue_on_commit

    with transaction.atomic():
        order = Order.objects.create(...)
        task_id = enqueue_on_commit(send_receipt, order.id)

The task is enqueued with the sync API from Django's ``on_commit`` hook; outside a transaction
(autocommit) that is at once. The arguments are checked when ``enqueue_on_commit`` is called,
so a :class:`~blitzq.SerializationError` surfaces inside the transaction and rolls it back.
The task id is chosen up front and returned, so the view can hand it out before the commit.
An error of the enqueue itself (broker unreachable) propagates from the commit, as Django does
for any ``on_commit`` callback: the data is committed by then.

``blitzq.integrations.django.BlitzqTaskBackend`` is the ``TASKS`` backend of Django's tasks
framework (:mod:`blitzq.integrations.django_tasks`, also importable from there); it is loaded
on first access, so ``enqueue_on_commit`` needs neither Django 6 nor the django-tasks backport.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.db import transaction

from ..routing import new_task_id
from ..serialization import plain_args, plain_kwargs
from ..task import BoundTask, Task

# BlitzqTaskBackend is left out of __all__: a star import must not need the tasks framework.
__all__ = ["enqueue_on_commit", "enqueue_on_commit_using"]

if TYPE_CHECKING:
    from .django_tasks import BlitzqTaskBackend as BlitzqTaskBackend

P = ParamSpec("P")
R = TypeVar("R")
logger = logging.getLogger("blitzq.integrations.django")


def enqueue_on_commit(
    task: Task[P, R] | BoundTask[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> str:
    """Enqueue ``task(*args, **kwargs)`` when the current transaction of the default database
    commits; nothing happens if it rolls back.

    Args:
        task: a task, or one with options bound (``task.options(delay=5)``).
        args, kwargs: the call's arguments (plain data).

    Returns:
        The id the task will have (a bound ``task_id`` is kept).

    Raises:
        SerializationError: an argument is not plain data (raised now, inside the transaction).
    """
    return _schedule(None, task, args, kwargs)


def enqueue_on_commit_using(
    using: str | None, task: Task[P, R] | BoundTask[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> str:
    """:func:`enqueue_on_commit` for the transaction of database alias ``using``.

    Args:
        using: the database alias (``None``: the default database).
        task: a task, or one with options bound.
        args, kwargs: the call's arguments (plain data).

    Returns:
        The id the task will have.

    Raises:
        SerializationError: an argument is not plain data.
    """
    return _schedule(using, task, args, kwargs)


def _schedule(
    using: str | None,
    task: Task[Any, Any] | BoundTask[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    bound = task if isinstance(task, BoundTask) else task.options()
    task_id = bound.call_options.task_id or new_task_id()
    bound = bound.options(task_id=task_id)
    plain_args(args)
    plain_kwargs(kwargs)
    transaction.on_commit(functools.partial(_enqueue, bound, args, kwargs), using=using)
    return task_id


def _enqueue(bound: BoundTask[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    handle = bound.enqueue_sync(*args, **kwargs)
    if handle.duplicate:  # a unique task whose equal call is pending: the id given is unused
        logger.warning(
            "enqueue_on_commit: %s(...) duplicates the pending task %s; nothing was enqueued, "
            "and the id handed out, %s, names no task",
            bound.task.name,
            handle.id,
            bound.call_options.task_id,
        )


def __getattr__(name: str) -> Any:
    """``BlitzqTaskBackend``, imported on first access (it needs Django's tasks framework:
    Django >= 6, or the django-tasks backport).

    Raises:
        AttributeError: any other name.
        ImportError: neither ``django.tasks`` nor ``django_tasks`` is installed.
    """
    if name == "BlitzqTaskBackend":
        from .django_tasks import BlitzqTaskBackend

        return BlitzqTaskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
