"""Task fields on log records, and a log handler that never blocks the event loop.

- :class:`TaskContextFilter` adds ``task_id``, ``task``, ``queue``, ``attempt``,
  ``worker_id`` and (for a workflow step) ``workflow_id`` to every record emitted while a
  task runs (from :func:`~blitzq.current_task` and the worker id the worker sets for its
  runs), and nothing to other records. The CLI's formatters (:mod:`blitzq.logconfig`) print
  them as fields; an application that configures logging itself adds the filter to its
  handlers: ``handler.addFilter(TaskContextFilter())``.
  Process-pool tasks run in another interpreter and get no fields. When the application uses
  OpenTelemetry (``opentelemetry.trace`` imported) and a span is current (the task's
  ``process`` span of :mod:`blitzq.integrations.opentelemetry`, or one the task started),
  it adds ``trace_id`` and ``span_id`` too (:data:`TRACE_FIELDS`); without OpenTelemetry
  that costs one dict lookup per record inside a task.
- :class:`NonBlockingHandler` is a :class:`logging.handlers.QueueHandler` feeding a
  listener thread that writes to the real handlers: a slow stderr (a full pipe, a stalled
  terminal) holds that thread, never the worker's event loop. Its queue is bounded: when it
  is full, records below WARNING go first (WARNING and above keep a 10 % reserve), and every
  drop is counted (:func:`dropped_records`, the ``blitzq_log_records_dropped_total``
  metric). Closing it flushes the queue for at most ``drain_timeout`` seconds.

A filter on a handler, not on a logger: records of every logger reach the root's handlers,
and a handler's filter sees each of them in the thread and context that emitted it, which is
where the task's context variables are (the listener thread has none).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import logging.handlers
import math
import queue
import sys
import threading
from typing import Any

from .context import current_task
from .exceptions import ConfigurationError

__all__ = [
    "DEFAULT_LOG_DRAIN_TIMEOUT",
    "DEFAULT_LOG_QUEUE_SIZE",
    "TASK_FIELDS",
    "TRACE_FIELDS",
    "NonBlockingHandler",
    "TaskContextFilter",
    "current_worker_id",
    "dropped_records",
    "install_log_queue",
    "reset_worker_id",
    "set_worker_id",
]

#: The fields :class:`TaskContextFilter` adds to a record emitted inside a task
#: (``workflow_id`` only for a workflow step).
TASK_FIELDS = ("task_id", "task", "queue", "attempt", "worker_id", "workflow_id")
#: The fields it adds inside a task when an OpenTelemetry span is current: the trace id
#: (32 lowercase hex digits) and the span id (16), as W3C ``traceparent`` writes them.
TRACE_FIELDS = ("trace_id", "span_id")

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
    """Adds the running task's fields to each record (see :data:`TASK_FIELDS`), and the
    current OpenTelemetry span's ids (:data:`TRACE_FIELDS`) when the application imported
    ``opentelemetry.trace`` and a valid span is current; never drops a record. Outside a
    task it adds nothing. A field the record already has (from ``extra=``) is kept."""

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
            if context.workflow_id is not None:
                fields.setdefault("workflow_id", context.workflow_id)
            # Never imported here: without OpenTelemetry in use, one dict lookup.
            otel = sys.modules.get("opentelemetry.trace")
            if otel is not None:
                _add_trace_fields(otel, fields)
        return True


def _add_trace_fields(otel: Any, fields: dict[str, Any]) -> None:
    """Set ``trace_id``/``span_id`` from ``otel`` (the ``opentelemetry.trace`` module)'s
    current span, if valid; a broken or partial OpenTelemetry install adds nothing."""
    try:
        span_context = otel.get_current_span().get_span_context()
        if span_context.is_valid:
            fields.setdefault("trace_id", format(span_context.trace_id, "032x"))
            fields.setdefault("span_id", format(span_context.span_id, "016x"))
    except Exception:  # a log record is never lost to tracing
        return


#: Records a :class:`NonBlockingHandler` holds at most (``--log-queue-size``).
DEFAULT_LOG_QUEUE_SIZE = 10_000
#: Seconds a :class:`NonBlockingHandler`'s close waits for its queue to be written
#: (``--log-drain-timeout``).
DEFAULT_LOG_DRAIN_TIMEOUT = 5.0
#: Share of the queue kept for records of WARNING and above: below it, lesser records are
#: dropped first.
WARNING_RESERVE = 0.10

_dropped_lock = threading.Lock()
_dropped_total = 0


def dropped_records() -> int:
    """Log records every :class:`NonBlockingHandler` of this process dropped (a full queue,
    or a drain that ran out of time), since the process started: the
    ``blitzq_log_records_dropped_total`` metric."""
    return _dropped_total


def _count_dropped(n: int) -> None:
    global _dropped_total
    with _dropped_lock:
        _dropped_total += n


class NonBlockingHandler(logging.handlers.QueueHandler):
    """Hands records to a listener thread that writes them with ``targets``, through a bounded
    queue.

    Args:
        target: the handler that really writes (stderr, a file ...); its formatter formats.
        *more: further handlers the listener writes each record to (each at its own level).
        queue_size: records the queue holds at most (>= 10). When it is full, a record is
            dropped instead of blocking the thread that logs: below WARNING as soon as the
            queue has only its reserve left (:data:`WARNING_RESERVE`, 10 %), WARNING and
            above only when it is full. Drops are counted (:func:`dropped_records`).
        drain_timeout: seconds :meth:`close` waits for the listener to write what is queued
            (``0``: not at all); what it could not write counts as dropped.

    The record is prepared in the emitting thread: its message is merged with its arguments
    and an exception is rendered to ``exc_text`` (with ``target``'s formatter), so later
    changes to the arguments cannot alter it, and the listener writes it as it was.
    :meth:`close` (also run by :func:`logging.shutdown` at exit) stops the listener.

    Raises:
        ConfigurationError: ``queue_size`` under 10 or ``drain_timeout`` negative or not
            finite.
    """

    def __init__(
        self,
        target: logging.Handler,
        *more: logging.Handler,
        queue_size: int = DEFAULT_LOG_QUEUE_SIZE,
        drain_timeout: float = DEFAULT_LOG_DRAIN_TIMEOUT,
    ) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 10:
            raise ConfigurationError(f"log queue size must be an int >= 10, got {queue_size!r}")
        if not isinstance(drain_timeout, int | float) or not 0 <= drain_timeout < math.inf:
            raise ConfigurationError(
                f"log drain timeout must be seconds >= 0, got {drain_timeout!r}"
            )
        self.records: queue.SimpleQueue[Any] = queue.SimpleQueue()
        super().__init__(self.records)
        self.target = target
        self.targets = (target, *more)
        self.queue_size = queue_size
        self.lesser_limit = queue_size - max(1, int(queue_size * WARNING_RESERVE))
        self.drain_timeout = float(drain_timeout)
        self.dropped = 0
        self._thread = threading.Thread(
            target=self._write_queued, name="blitzq-log-listener", daemon=True
        )
        self._thread.start()
        self._running = True

    def emit(self, record: logging.LogRecord) -> None:
        """Queue ``record`` for the listener, or drop and count it when the queue is full
        (see the class docstring); never blocks."""
        held = self.records.qsize()
        if held >= self.queue_size or (
            record.levelno < logging.WARNING and held >= self.lesser_limit
        ):
            self.dropped += 1
            _count_dropped(1)
            return
        try:
            self.enqueue(self.prepare(record))
        except Exception:
            self.handleError(record)

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

    def _write_queued(self) -> None:
        """The listener thread: write each queued record with every target, until the end
        mark."""
        while True:
            record = self.records.get()
            if record is _END:
                return
            for target in self.targets:
                if record.levelno >= target.level:
                    target.handle(record)

    def close(self) -> None:
        """Stop the listener after it wrote what is queued, waiting at most
        ``drain_timeout`` seconds (what is left then is counted as dropped), then close the
        handlers."""
        if self._running:
            self._running = False
            self.records.put_nowait(_END)
            self._thread.join(self.drain_timeout)
            if self._thread.is_alive():
                left = max(0, self.records.qsize() - 1)
                self.dropped += left
                _count_dropped(left)
        for target in self.targets:
            target.close()
        super().close()


_END: Any = object()  # the listener's end mark
_QUEUED_MARK = "_blitzq_log_queue"


def install_log_queue(
    queue_size: int = DEFAULT_LOG_QUEUE_SIZE, drain_timeout: float = DEFAULT_LOG_DRAIN_TIMEOUT
) -> bool:
    """Move the root logger's handlers behind one :class:`NonBlockingHandler` (an embedded
    application's opt-in: ``Queue(..., log_queue=True)`` or ``BLITZQ_LOG_QUEUE=1``), so a slow
    handler writes in a listener thread instead of holding the event loop.

    The handlers keep their own levels, formatters and filters (a filter sees the record in
    the listener thread, without the task's context variables: add
    :class:`TaskContextFilter` to the returned queue handler instead, which this does). Done
    once per process; a later call changes nothing.

    Args:
        queue_size, drain_timeout: as :class:`NonBlockingHandler`'s.

    Returns ``True`` when it moved the handlers, ``False`` when there were none or they
    already were behind the queue.
    """
    root = logging.getLogger()
    handlers = [h for h in root.handlers if not getattr(h, _QUEUED_MARK, False)]
    if not handlers or len(handlers) != len(root.handlers):
        return False
    queued = NonBlockingHandler(*handlers, queue_size=queue_size, drain_timeout=drain_timeout)
    queued.addFilter(TaskContextFilter())
    setattr(queued, _QUEUED_MARK, True)
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(queued)
    return True
