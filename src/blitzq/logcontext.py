"""Task fields on log records, and a log handler that never blocks the event loop.

- :class:`TaskContextFilter` adds ``task_id``, ``task``, ``queue``, ``attempt`` and
  ``worker_id`` to every record emitted while a task runs (from :func:`~blitzq.current_task`
  and the worker id the worker sets for its runs), and nothing to other records. The CLI's
  formatters (:mod:`blitzq.logconfig`) print them as fields; an application that configures
  logging itself adds the filter to its handlers: ``handler.addFilter(TaskContextFilter())``.
  Process-pool tasks run in another interpreter and get no fields.
- :class:`NonBlockingHandler` is a :class:`logging.handlers.QueueHandler` feeding a
  :class:`logging.handlers.QueueListener` thread that writes to the real handler: a slow
  stderr (a full pipe, a stalled terminal) holds that thread, never the worker's event loop.

A filter on a handler, not on a logger: records of every logger reach the root's handlers,
and a handler's filter sees each of them in the thread and context that emitted it, which is
where the task's context variables are (the listener thread has none).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import logging.handlers
import queue

from .context import current_task

__all__ = [
    "TASK_FIELDS",
    "NonBlockingHandler",
    "TaskContextFilter",
    "current_worker_id",
    "reset_worker_id",
    "set_worker_id",
]

#: The fields :class:`TaskContextFilter` adds to a record emitted inside a task.
TASK_FIELDS = ("task_id", "task", "queue", "attempt", "worker_id")

_worker_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "blitzq_worker_id", default=None
)


def current_worker_id() -> str | None:
    """Id of the worker whose run (or loop) this context belongs to, or ``None``."""
    return _worker_id.get()


def set_worker_id(worker_id: str) -> contextvars.Token[str | None]:
    """Make ``worker_id`` the current worker id (the worker calls it when it starts, so every
    run's context, copied from the worker's, has it)."""
    return _worker_id.set(worker_id)


def reset_worker_id(token: contextvars.Token[str | None]) -> None:
    """Undo :func:`set_worker_id`."""
    _worker_id.reset(token)


class TaskContextFilter(logging.Filter):
    """Adds the running task's fields to each record (see :data:`TASK_FIELDS`); never drops a
    record. Outside a task it adds nothing. A field the record already has (from ``extra=``)
    is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Set the task fields on ``record`` when a task is current; always ``True``."""
        context = current_task()
        if context is not None:
            fields = vars(record)
            fields.setdefault("task_id", context.id)
            fields.setdefault("task", context.task)
            fields.setdefault("queue", context.queue)
            fields.setdefault("attempt", context.attempt)
            fields.setdefault("worker_id", _worker_id.get())
        return True


class NonBlockingHandler(logging.handlers.QueueHandler):
    """Hands records to a listener thread that writes them with ``target``.

    Args:
        target: the handler that really writes (stderr, a file ...); its formatter formats.

    The record is prepared in the emitting thread: its message is merged with its arguments
    and an exception is rendered to ``exc_text`` (with ``target``'s formatter), so later
    changes to the arguments cannot alter it, and the listener writes it as it was.
    :meth:`close` (also run by :func:`logging.shutdown` at exit) stops the listener after it
    wrote every record queued.
    """

    def __init__(self, target: logging.Handler) -> None:
        super().__init__(queue.SimpleQueue())
        self.target = target
        self.listener = logging.handlers.QueueListener(
            self.queue, target, respect_handler_level=True
        )
        self.listener.start()
        self._running = True

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """A copy of ``record`` with its message merged and its exception rendered."""
        record = copy.copy(record)
        record.msg = record.message = record.getMessage()
        record.args = None
        if record.exc_info:
            if not record.exc_text:
                formatter = self.target.formatter or logging.Formatter()
                record.exc_text = formatter.formatException(record.exc_info)
            record.exc_info = None
        return record

    def close(self) -> None:
        """Stop the listener (it writes what is queued first), then close both handlers."""
        if self._running:  # QueueListener.stop() fails when called twice
            self._running = False
            self.listener.stop()
        self.target.close()
        super().close()
