"""``current_task()``: what a running task can know about itself.

The worker sets a :class:`TaskContext` in a context variable before it calls the task, so
async and thread tasks (and code they call) can read it; tasks enqueued from inside a task
inherit its correlation id and headers. Process-pool tasks run in another interpreter and see
``None``.

Each run has a :class:`contextvars.Context` of its own, a fresh copy of the worker's base
context (see :mod:`blitzq.worker.executors`): the current task, and any context variable the
task sets, are never seen by another task or by the worker.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import _checks

#: The result of a run that has not returned a value (``Job.result`` until it does; a
#: failed run keeps it), told apart from a task that returned ``None``.
NO_RESULT: Any = object()


class TaskContext:
    """The running task's identity and attempt.

    Attributes:
        id: task id.
        task: task name.
        queue: physical queue it came from.
        attempt: 1-based attempt number (retries and crash redeliveries counted).
        max_attempts: attempts allowed in all (``retries + 1``).
        correlation_id: id shared by related tasks, or ``None``.
        headers: the message's headers (plain data), or ``None``.
        workflow_id: the id of the workflow this run is a step of, or ``None``.
        options: the call's per-call options that middleware declare
            (``Middleware.call_options``), by name, or ``None`` when it has none.
        cancelled: set by the worker when ``cancel()`` was called for this task; a thread
            task should check it now and then and stop.

    The constructor takes the attributes above in order (the worker makes it) and, keyword
    only, ``flow``: the message's workflow part (a dict whose ``"w"`` is the workflow id), of
    which only ``workflow_id`` is kept, and ``options``.
    """

    __slots__ = (
        "_reporter",
        "attempt",
        "cancelled",
        "correlation_id",
        "headers",
        "id",
        "max_attempts",
        "options",
        "queue",
        "task",
        "workflow_id",
    )

    def __init__(
        self,
        task_id: str,
        task: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        correlation_id: str | None,
        headers: dict[str, Any] | None,
        *,
        flow: Any = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.id = task_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.correlation_id = correlation_id
        self.headers = headers
        self.options = options
        workflow = flow.get("w") if flow is not None and isinstance(flow, dict) else None
        self.workflow_id: str | None = str(workflow) if workflow else None
        self.cancelled = False
        #: Where :meth:`update_progress` goes (set by the worker; ``None`` once finished).
        self._reporter: Any = None

    def update_progress(
        self, current: float, total: float | None, message: str | None = None
    ) -> None:
        """Report progress: ``current`` of ``total`` units done (``total`` ``None`` when
        unknown), with an optional short ``message`` (at most 1000 characters are kept).

        Callable from async and thread tasks; never blocks on Redis (see
        :mod:`blitzq.progress` for how updates are coalesced and stored). Updates after the
        run ended are ignored.

        Raises:
            ConfigurationError: ``current``/``total`` are not finite numbers, or ``message``
                is not a string.
        """
        reporter = self._reporter
        if reporter is not None:
            reporter.report(self.id, current, total, message)

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block a thread task up to ``timeout`` seconds (``None``: no limit) until it is
        cancelled, checking every 10 ms; return whether it was. Async tasks are cancelled
        directly and do not need this.

        Raises:
            ConfigurationError: ``timeout`` is not ``None`` or a finite number of seconds
                ``>= 0`` (``nan`` would otherwise wait forever).
        """
        timeout = _checks.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.cancelled:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def __repr__(self) -> str:
        return f"<TaskContext {self.task} id={self.id} attempt={self.attempt}>"


class Deferred(Protocol):
    """What the worker may set as the current task instead of a :class:`TaskContext`: the
    run itself (:class:`~blitzq.worker.execution.Job`), whose context is made on the first
    :func:`current_task` call, so that a run that never asks costs none."""

    def task_context(self) -> TaskContext:
        """The run's :class:`TaskContext`, the same object on every call."""
        ...


_current: contextvars.ContextVar[TaskContext | Deferred | None] = contextvars.ContextVar(
    "blitzq_current_task", default=None
)


def current_task() -> TaskContext | None:
    """The task running in this context, or ``None`` outside a task."""
    current = _current.get()
    if current is None or isinstance(current, TaskContext):
        return current
    return current.task_context()  # made on the first call of the run


def set_current(
    context: TaskContext | None,
) -> contextvars.Token[TaskContext | Deferred | None]:
    """Make ``context`` the current task (the worker's side of :func:`current_task`)."""
    return _current.set(context)


#: The context variable's own ``set``, without a Python frame of its own: the worker's hot
#: path sets the current task once per run, a :class:`TaskContext` or the run itself
#: (:class:`Deferred`: its context made on the first :func:`current_task` call).
enter_current: Callable[
    [TaskContext | Deferred | None], contextvars.Token[TaskContext | Deferred | None]
] = _current.set


def reset_current(token: contextvars.Token[TaskContext | Deferred | None]) -> None:
    """Undo :func:`set_current`."""
    _current.reset(token)
