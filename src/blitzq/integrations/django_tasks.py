"""A backend for Django's tasks framework (DEP 14) that enqueues through blitzq.

Django 6's ``django.tasks`` (Python >= 3.12) is used when it exists; else the ``django-tasks``
backport (``django_tasks``, Django 4.2-5.2), which has the same API::

    TASKS = {
        "default": {
            "BACKEND": "blitzq.integrations.django.BlitzqTaskBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"redis_url": "redis://localhost:6379/0", "namespace": "myapp"},
        }
    }

A ``@task`` function is published under its dotted module path (``Task.module_path``) as a
blitzq task of that name, to the blitzq queue named by its ``queue_name``, at the priority
level its ``priority`` maps to (:func:`priority_level`), with ``run_after`` as its eta.
``blitzq worker --django`` runs them (:mod:`blitzq.integrations.django_worker`).
``get_result`` reads blitzq's task record (:func:`status_of` maps the states).

The backend's Queue keeps the record of every task current (``track_state``) and stores
return values, so a result just enqueued reads ``READY`` and a running one ``RUNNING``.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import threading
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ..exceptions import BlitzQError
from ..queue import Queue
from ..records import TaskRecord, TaskState
from ..routing import base_queue, check_queue_name, new_task_id


def _load_framework() -> tuple[Any, Any, Any, Any, Any, type[Exception], type[Exception]]:
    """Django's ``django.tasks`` (Django >= 6), else the ``django_tasks`` backport: its base
    module, backend base module, exceptions module, signals module and package, then the
    classes of an invalid task and of an invalid backend."""
    try:
        package = importlib.import_module("django.tasks")
        name = "django.tasks"
    except ModuleNotFoundError:
        try:
            package = importlib.import_module("django_tasks")
        except ModuleNotFoundError:
            raise ImportError(
                "blitzq's Django tasks backend needs Django >= 6 (django.tasks) or the "
                "django-tasks backport: pip install django-tasks"
            ) from None
        name = "django_tasks"
    base = importlib.import_module(f"{name}.base")
    backends = importlib.import_module(f"{name}.backends.base")
    exceptions = importlib.import_module(f"{name}.exceptions")
    signals = importlib.import_module(f"{name}.signals")
    if name == "django.tasks":
        return (
            base,
            backends,
            exceptions,
            signals,
            package,
            exceptions.InvalidTask,
            exceptions.InvalidTaskBackend,
        )
    return (
        base,
        backends,
        exceptions,
        signals,
        package,
        exceptions.InvalidTaskError,
        exceptions.InvalidTaskBackendError,
    )


_base, _backends, _exceptions, _signals, framework, InvalidTask, InvalidTaskBackend = (
    _load_framework()
)
#: The framework's classes, whichever package provides them.
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskError: Any = _base.TaskError
DjangoTask: Any = _base.Task
TaskContext: Any = _base.TaskContext
#: The framework's JSON normalization of arguments and return values.
normalize_json: Any = _base.normalize_json
#: The framework's signals module (``task_enqueued``, ``task_started``, ``task_finished``).
signals: Any = _signals
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist

#: OPTIONS keys passed to :class:`~blitzq.Queue` as they are.
QUEUE_OPTIONS = frozenset(
    {
        "redis_url",
        "namespace",
        "mode",
        "visibility_timeout",
        "max_deliveries",
        "result_ttl",
        "max_message_size",
        "max_result_size",
        "dead_letter_cap",
        "dead_letter_ttl",
    }
)

#: blitzq's task states and the framework's status of each (docs/integrations.md).
STATUS_OF: dict[TaskState, str] = {
    TaskState.SCHEDULED: "READY",
    TaskState.QUEUED: "READY",
    TaskState.RETRYING: "READY",
    TaskState.RUNNING: "RUNNING",
    TaskState.CANCELLING: "RUNNING",
    TaskState.SUCCEEDED: "SUCCESSFUL",
    TaskState.FAILED: "FAILED",
    TaskState.DEAD_LETTERED: "FAILED",
    TaskState.CANCELLED: "FAILED",
    TaskState.EXPIRED: "FAILED",
}

#: Error types of records written by blitzq itself (no exception class), and the class each
#: is reported as in a ``TaskError``.
_REASONS = {
    "TaskCancelled": "blitzq.exceptions.TaskCancelled",
    "TaskExpired": "blitzq.exceptions.TaskExpired",
}


def priority_level(priority: int) -> str:
    """blitzq's priority level of a framework priority (an int from -100 to 100):
    ``"high"`` above 0, ``"normal"`` at 0 (the default), ``"low"`` below 0."""
    if priority > 0:
        return "high"
    if priority < 0:
        return "low"
    return "normal"


def status_of(state: TaskState) -> Any:
    """The framework's ``TaskResultStatus`` of a blitzq task state (see :data:`STATUS_OF`)."""
    return TaskResultStatus[STATUS_OF[state]]


def exception_path(error_type: str | None) -> str:
    """A ``TaskError.exception_class_path`` for a record's ``error_type``: dotted paths as
    they are, builtins prefixed with ``builtins.``, blitzq's own reasons (cancelled,
    expired) as its exception classes, and any other reason (``MaxDeliveriesExceeded``,
    ``unknown task``) as :class:`blitzq.exceptions.TaskFailed`."""
    if not error_type:
        return "blitzq.exceptions.TaskFailed"
    if error_type in _REASONS:
        return _REASONS[error_type]
    found = vars(builtins).get(error_type)
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"builtins.{error_type}"
    if "." in error_type and " " not in error_type:
        return error_type
    return "blitzq.exceptions.TaskFailed"


def when(unix: float | None) -> datetime | None:
    """A record's Unix time (seconds) as the framework's datetime: aware in UTC with
    ``USE_TZ``, else naive in the current time zone."""
    if unix is None:
        return None
    moment = datetime.fromtimestamp(unix, tz=UTC)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


def eta_of(run_after: datetime) -> datetime:
    """``run_after`` as an aware datetime (a naive one is in the current time zone)."""
    if timezone.is_naive(run_after):
        aware: datetime = timezone.make_aware(run_after)
        return aware
    return run_after


def result_from_record(task: Any, record: TaskRecord, alias: str) -> Any:
    """The framework's ``TaskResult`` of a blitzq ``record`` of Django ``task``.

    ``args`` and ``kwargs`` are empty: blitzq's record keeps only a preview of the arguments
    (cut at 2048 bytes, non-JSON values as text), not the values. ``worker_ids`` has one
    entry per attempt, so ``attempts`` is blitzq's count; only the last attempt's worker is
    recorded, earlier entries are ``""``.
    """
    errors = []
    if record.state is not TaskState.SUCCEEDED and record.error_type is not None:
        trace = record.traceback or f"{record.error_type}: {record.error}\n"
        errors.append(
            TaskError(exception_class_path=exception_path(record.error_type), traceback=trace)
        )
    attempts = record.attempts
    worker_ids = [""] * max(0, attempts - 1) + [record.worker or ""] if attempts else []
    result = TaskResult(
        task=task,
        id=record.id,
        status=status_of(record.state),
        enqueued_at=when(record.enqueued_at),
        started_at=when(record.started_at),
        finished_at=when(record.finished_at) if record.state.is_final else None,
        last_attempted_at=when(record.started_at),
        args=[],
        kwargs={},
        backend=alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    if record.state is TaskState.SUCCEEDED:
        object.__setattr__(result, "_return_value", record.result)
    return result


_BaseTaskBackend: Any = _backends.BaseTaskBackend
_queues: dict[str, Queue] = {}
_queues_lock = threading.Lock()


def shared_queue(name: str, options: dict[str, Any]) -> Queue:
    """The process's one Queue for a backend's settings (Django makes a backend per thread;
    they share the Queue, its connections and its sync-API loop).

    Raises:
        ConfigurationError: a bad option (as for :class:`~blitzq.Queue`).
    """
    key = repr((name, sorted(options.items())))
    with _queues_lock:
        queue = _queues.get(key)
        if queue is None:
            queue = _queues[key] = Queue(name, store_results=True, track_state=True, **options)
        return queue


class BlitzqTaskBackend(_BaseTaskBackend):  # type: ignore[misc]
    """The framework's task backend on blitzq (``TASKS[alias]["BACKEND"]``).

    Settings of its alias: ``QUEUES`` (the blitzq queues tasks may name; the framework's
    default is ``["default"]``; an empty list allows any), ``ENQUEUE_ON_COMMIT`` (``True``:
    an enqueue inside ``transaction.atomic()`` is published once the transaction commits, and
    not at all if it rolls back; default ``False``), and ``OPTIONS``, given to
    :class:`~blitzq.Queue`: ``redis_url``, ``namespace``, ``mode``, ``visibility_timeout``,
    ``max_deliveries``, ``result_ttl``, ``max_message_size``, ``max_result_size``,
    ``dead_letter_cap``, ``dead_letter_ttl`` (absent ones read ``BLITZQ_*`` as a Queue does).

    Args:
        alias: the backend's name in ``TASKS``.
        params: its settings dict.

    Raises:
        InvalidTaskBackend (the framework's; an ``ImproperlyConfigured``): an unknown
            OPTIONS key, a bad value, or a queue name blitzq refuses.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - QUEUE_OPTIONS
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]: unknown OPTIONS {sorted(unknown)}; "
                f"blitzq takes {sorted(QUEUE_OPTIONS)}"
            )
        on_commit = params.get("ENQUEUE_ON_COMMIT", False)
        if not isinstance(on_commit, bool):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]: ENQUEUE_ON_COMMIT must be a bool")
        self.enqueue_on_commit = on_commit
        try:
            for name in self.queues:
                check_queue_name("queue name", name)
            self.queue = shared_queue(min(self.queues) if self.queues else "default", self.options)
        except BlitzQError as exc:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]: {exc}") from exc

    def validate_task(self, task: Any) -> None:
        """The framework's checks, then blitzq's on the queue name.

        Raises:
            InvalidTask: what the framework refuses, or a ``queue_name`` blitzq refuses.
        """
        super().validate_task(task)
        try:
            check_queue_name("queue_name", task.queue_name)
        except BlitzQError as exc:
            raise InvalidTask(str(exc)) from None

    def _message(self, task: Any, args: Any, kwargs: Any) -> tuple[Any, Any, dict[str, Any]]:
        """Validate ``task`` and its arguments (JSON data, as the framework requires); return
        the arguments normalized and the options of the blitzq message."""
        self.validate_task(task)
        if not _same_task(task):
            raise InvalidTask(
                f"{task.module_path} is not the Task itself: a worker finds a task by its "
                "module path, so decorate the function where it is defined"
            )
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": priority_level(task.priority),
        }
        if task.run_after is not None:
            options["eta"] = eta_of(task.run_after)
        return normalize_json(list(args)), normalize_json(dict(kwargs)), options

    def _ready(self, task: Any, result_id: str, args: Any, kwargs: Any) -> Any:
        """The ``TaskResult`` of a call just enqueued (``READY``); sends ``task_enqueued``."""
        result = TaskResult(
            task=task,
            id=result_id,
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        _signals.task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Publish one call of Django ``task``; return its ``TaskResult`` (``READY``).

        With ``ENQUEUE_ON_COMMIT`` inside an atomic block the message is published when the
        transaction commits (nothing on rollback); the result and its id are returned now.

        Raises:
            InvalidTask: a task the backend cannot run.
            TypeError, ValueError: an argument that is not JSON data (the framework's check).
            SerializationError, MessageTooLarge, BrokerError: as for a blitzq enqueue.
        """
        args, kwargs, options = self._message(task, args, kwargs)
        if self.enqueue_on_commit and transaction.get_connection().in_atomic_block:
            result_id = new_task_id()  # chosen now: the caller gets it before the commit
            send = functools.partial(
                self.queue.send_sync, task.module_path, args, kwargs, task_id=result_id, **options
            )
            transaction.on_commit(send)
        else:
            result_id = self.queue.send_sync(task.module_path, args, kwargs, **options).id
        return self._ready(task, result_id, args, kwargs)

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """:meth:`enqueue` from async code (on the running loop; with ``ENQUEUE_ON_COMMIT``
        through the framework's ``sync_to_async``, where the transaction is)."""
        if self.enqueue_on_commit:
            return await super().aenqueue(task, args, kwargs)
        args, kwargs, options = self._message(task, args, kwargs)
        handle = await self.queue.send(task.module_path, args, kwargs, **options)
        return self._ready(task, handle.id, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of task ``result_id`` from its blitzq record.

        Raises:
            TaskResultDoesNotExist: no record (unknown id, or expired after ``result_ttl``).
            ImportError: the task's module cannot be imported here.
            BrokerError: the broker could not be reached.
        """
        return self._result(result_id, self.queue.inspect_sync(result_id))

    async def aget_result(self, result_id: str) -> Any:
        """:meth:`get_result` from async code."""
        return self._result(result_id, await self.queue.inspect(result_id))

    def _result(self, result_id: str, record: TaskRecord | None) -> Any:
        if record is None or not record.task:
            raise TaskResultDoesNotExist(result_id)
        task = import_string(record.task)
        if not isinstance(task, DjangoTask):
            raise TaskResultDoesNotExist(f"{result_id}: {record.task} is not a Django task")
        logical = base_queue(record.queue)
        if logical and logical != task.queue_name and (not self.queues or logical in self.queues):
            task = task.using(queue_name=logical)
        return result_from_record(task, record, self.alias)


def _same_task(task: Any) -> bool:
    """Whether the Task at ``task``'s module path runs the same function (``task`` is it, or
    derived from it with ``using()``)."""
    try:
        found = import_string(task.module_path)
    except ImportError:
        return False
    return isinstance(found, DjangoTask) and found.func is task.func


__all__ = [
    "STATUS_OF",
    "BlitzqTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "exception_path",
    "priority_level",
    "result_from_record",
    "status_of",
]
