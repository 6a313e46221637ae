"""Sentry error reporting of tasks that failed for good (needs ``sentry-sdk>=2``).

::

    import sentry_sdk
    from blitzq.integrations.sentry import SentryMiddleware

    sentry_sdk.init(dsn="https://...@sentry.example/1")
    queue.add_middleware(SentryMiddleware())   # in the worker's process (``--configure``)

Each task that fails for good, and only then, becomes one Sentry event, from the
:meth:`~blitzq.extensions.middleware.Middleware.on_failure` hook: its retries are spent, its
error is not retried (the retry policy, ``retry=False``), or its last attempt timed out; a
dead-lettered task too. An attempt that is retried reports nothing, so a task that fails once
and then succeeds never reaches Sentry; nor does a cancellation or a run put back on its queue
at shutdown. The event carries:

- the exception (a :class:`~blitzq.Retry` raised past the last attempt: its cause) with its
  traceback, marked unhandled (mechanism ``blitzq``); a timeout is a
  :class:`~blitzq.TaskTimeout`;
- the tags ``blitzq.task``, ``blitzq.queue`` (the physical queue), ``blitzq.task_id``,
  ``blitzq.attempt``, ``blitzq.outcome`` (``failed`` or ``dead_lettered``) and, for a message
  with a correlation id (every workflow step: its workflow's id), ``blitzq.correlation_id``;
  the transaction name is the task's name;
- a ``blitzq`` context with the same values, ``max_attempts`` and the worker's id;
- the ``trace`` context: the OpenTelemetry span current in the run when there is one (the
  ``process <queue>`` span of :mod:`blitzq.integrations.opentelemetry`: the event and the
  span share their trace and span ids), else the W3C ``traceparent`` header the message
  carries (the event joins the producer's trace, as a child of its span), else Sentry's own.

The worker also logs the failure (at ERROR, logger
:data:`~blitzq.worker.ending.OUTCOME_LOGGER`), and Sentry's logging integration, on by
default, would turn that record into a second event: the middleware asks it to leave that one
logger alone (``sentry_sdk.integrations.logging.ignore_logger``, process-wide, as Sentry's
Celery and RQ integrations do for theirs), unless ``ignore_outcome_logger=False``. The
worker's other records (a message dead-lettered without running, a completion that could not
be written) still reach Sentry through its logging integration.

Events are made in the after-hooks, which run after the completion was handed to the writer,
in a copy of the run's context; Sentry sends them from its own thread.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..context import TaskContext
from ..extensions.middleware import FailureKind, Middleware
from ..logcontext import current_worker_id
from ..worker.ending import OUTCOME_LOGGER
from ..worker.execution import cause_of

try:
    import sentry_sdk
    from sentry_sdk.integrations.logging import ignore_logger
    from sentry_sdk.utils import event_from_exception
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "blitzq.integrations.sentry needs sentry-sdk 2: pip install 'sentry-sdk>=2' (or "
        "install blitzq from its checkout with the extra: pip install -e '.[sentry]')"
    ) from exc

try:
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - OpenTelemetry is optional
    otel_trace = None  # type: ignore[assignment]

#: ``mechanism.type`` of the events.
MECHANISM = "blitzq"

__all__ = ["MECHANISM", "SentryMiddleware", "trace_context"]


class SentryMiddleware(Middleware):
    """Reports each task that failed for good to Sentry (see the module docstring).

    Register it on the Queue the worker runs (``queue.add_middleware(SentryMiddleware())``,
    or in a ``blitzq worker --configure`` callable) after ``sentry_sdk.init``; with no
    Sentry client active it does nothing.

    Args:
        ignore_outcome_logger: tell Sentry's logging integration to skip the worker's
            records of failed attempts (logger ``blitzq.worker.outcomes``), which would
            report each final failure a second time; a process-wide setting of sentry-sdk.
    """

    def __init__(self, *, ignore_outcome_logger: bool = True) -> None:
        if not isinstance(ignore_outcome_logger, bool):
            raise TypeError(
                f"ignore_outcome_logger must be True or False, got {ignore_outcome_logger!r}"
            )
        if ignore_outcome_logger:
            ignore_logger(OUTCOME_LOGGER)

    async def on_failure(self, context: TaskContext, exc: BaseException, kind: FailureKind) -> None:
        """Capture ``exc`` (its cause for a :class:`~blitzq.Retry`) as one Sentry event with
        the task's tags and trace context."""
        client = sentry_sdk.get_client()
        if not client.is_active():
            return
        error = cause_of(exc)
        with sentry_sdk.isolation_scope() as scope:
            scope.set_transaction_name(context.task, source="task")
            details: dict[str, Any] = {
                "task": context.task,
                "queue": context.queue,
                "task_id": context.id,
                "attempt": context.attempt,
                "outcome": kind,
            }
            if context.correlation_id is not None:
                details["correlation_id"] = context.correlation_id
            for key, value in details.items():
                scope.set_tag(f"blitzq.{key}", str(value))
            details["max_attempts"] = context.max_attempts
            worker_id = current_worker_id()
            if worker_id is not None:
                details["worker_id"] = worker_id
            scope.set_context("blitzq", details)
            trace = trace_context(context)
            if trace is not None:
                scope.set_context("trace", trace)
            event, hint = event_from_exception(
                error,
                client_options=client.options,
                mechanism={"type": MECHANISM, "handled": False},
            )
            sentry_sdk.capture_event(event, hint=hint)


def trace_context(context: TaskContext) -> dict[str, str] | None:
    """The Sentry ``trace`` context of a run: the current OpenTelemetry span's trace and
    span ids (32 and 16 hex digits) when a valid span is current; else, from the W3C
    ``traceparent`` header of the run's message, its trace id and, as ``parent_span_id``, its
    span id (with a fresh ``span_id``); else ``None``.

    Args:
        context: the run's :class:`~blitzq.TaskContext` (its ``headers`` are read).
    """
    if otel_trace is not None:
        span_context = otel_trace.get_current_span().get_span_context()
        if span_context.is_valid:
            return {
                "trace_id": format(span_context.trace_id, "032x"),
                "span_id": format(span_context.span_id, "016x"),
            }
    parsed = _traceparent((context.headers or {}).get("traceparent"))
    if parsed is None:
        return None
    trace_id, parent_id = parsed
    return {"trace_id": trace_id, "parent_span_id": parent_id, "span_id": uuid.uuid4().hex[16:]}


def _traceparent(value: Any) -> tuple[str, str] | None:
    """``(trace id, span id)`` of a W3C ``traceparent`` value (``00-<32 hex>-<16 hex>-<2
    hex>``), or ``None`` for anything else (all-zero ids included)."""
    if not isinstance(value, str):
        return None
    parts = value.strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    trace_id, span_id = parts[1], parts[2]
    if len(trace_id) != 32 or len(span_id) != 16:
        return None
    try:
        if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
            return None
    except ValueError:
        return None
    return trace_id, span_id
