"""The process-wide switches of the test mode (set by :mod:`blitzq.testing`, never by an app).

While ``blitzq.testing.eager()`` (the ``blitzq_eager`` pytest fixture) is active, every
:class:`~blitzq.Queue` of the process that has no ready ``broker=`` uses the in-process memory
backend (``memory://``, a namespace per Queue and per activation) instead of its URL, and each
enqueue runs what it published in this process before it returns. Outside it these are
``None`` and cost one global read per enqueue.

Attributes:
    generation: bumped at each switch; a Queue drops the brokers it made under another one.
    forced_url: ``f(queue) -> URL`` while active (``None`` otherwise).
    after_enqueue: awaited with the Queue after each enqueue, replay or workflow start while
        active (``None`` otherwise): for enqueues and workflow starts through each Queue's
        built-in middleware :class:`TestModeDrain` (its ``after_publish`` and
        ``after_apply``), for a replay of a dead letter (no middleware hook sees one) by the
        replay itself.
    failure: ``f(task_id) -> exception`` while active: the exception a failed task raised
        in this process (``None`` when there is none, or when the mode does not propagate
        errors), which ``result()`` raises instead of :class:`~blitzq.TaskFailed`.
    cancelled: called with the Queue and the task id after each ``cancel`` while active (a
        worker learns of it from the broker's event channel; the eager mode has none).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..context import current_task
from ..extensions.middleware import Middleware

if TYPE_CHECKING:
    from ..extensions.middleware import Outgoing, OutgoingWorkflow
    from ..seams import QueueSettings

generation = 0
forced_url: Callable[[Any], str] | None = None
after_enqueue: Callable[[Any], Awaitable[None]] | None = None
failure: Callable[[str], BaseException | None] | None = None
cancelled: Callable[[Any, str], None] | None = None


def switch(
    url: Callable[[Any], str] | None,
    hook: Callable[[Any], Awaitable[None]] | None,
    errors: Callable[[str], BaseException | None] | None = None,
    cancel: Callable[[Any, str], None] | None = None,
) -> None:
    """Turn the test mode on (``url`` and ``hook`` given) or off (all ``None``).

    Args:
        url: the broker URL of each Queue while on.
        hook: awaited with the Queue after each enqueue while on.
        errors: the exception a failed task raised, by task id (see :data:`failure`).
        cancel: told of each cancellation (see :data:`cancelled`).
    """
    global generation, forced_url, after_enqueue, failure, cancelled
    generation += 1
    forced_url, after_enqueue, failure, cancelled = url, hook, errors, cancel


def task_error(task_id: str) -> Exception | None:
    """The exception the failed task ``task_id`` raised in this process, while the eager mode
    is on and propagates errors (an :class:`Exception`: a ``SystemExit`` or a cancellation is
    not raised in the caller); ``None`` otherwise. ``result()`` and a workflow's ``get()``
    raise it instead of :class:`~blitzq.TaskFailed`.

    Only for the test's own code: inside a running task (a task waiting for another's result)
    it is ``None``, so the task sees :class:`~blitzq.TaskFailed` as it would in production.
    """
    if failure is None or current_task() is not None:
        return None
    error = failure(task_id)
    return error if isinstance(error, Exception) else None


class TestModeDrain(Middleware):
    """The test mode's hook as a built-in middleware of one Queue (the registry's
    :attr:`~blitzq.extensions.registry.Extensions.test_mode`): while the mode is on, what a
    batch or a workflow start published runs before the call returns.

    Args:
        queue: the Queue (what :data:`after_enqueue` is awaited with).
    """

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    @property
    def active(self) -> bool:
        """Whether the test mode is on (an enqueue then needs the batch hooks)."""
        return after_enqueue is not None

    async def after_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Await :data:`after_enqueue` with the Queue, while the mode is on."""
        if after_enqueue is not None:
            await after_enqueue(self.queue)

    async def after_apply(self, workflow: OutgoingWorkflow) -> None:
        """Await :data:`after_enqueue` with the Queue, while the mode is on."""
        if after_enqueue is not None:
            await after_enqueue(self.queue)
