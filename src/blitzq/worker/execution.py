"""One run (:class:`Job`): a decoded delivery, its task, and the records it writes.

The value of the per-task path, kept apart from the code that moves it (admission, runner,
ending) so that the path is easy to read and profile. A :class:`Job` builds its own records
(:meth:`Job.running`, :meth:`Job.succeeded`, ...): the fields every record of a run shares
(id, task, queue, attempt, enqueue and start times) are read from the run in one place.
:func:`format_traceback` and :func:`cause_of` say how a failed run's error is stored.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import traceback as tb
from typing import Any

import msgspec

from .. import records
from ..broker import Delivery
from ..context import NO_RESULT, TaskContext
from ..exceptions import NoRetry, Retry
from ..serialization import Envelope
from ..task import Task

#: Most characters of a formatted traceback kept in a record (its end is kept), and of any
#: one part of it (a frame, an exception's message line).
MAX_TRACEBACK_CHARS = 8000
_MAX_TRACEBACK_PART = 2000

#: Held while a run's :class:`~blitzq.TaskContext` is made on demand (:meth:`Job.task_context`):
#: a thread the task started (``asyncio.to_thread``) and the worker's loop (a cancel) may ask
#: at once, and both must get the same object.
_MAKING = threading.Lock()


def format_traceback(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` (chained exceptions included), as stored in records.

    Never raises (an exception whose ``__str__`` or ``__repr__`` raises is described by the
    standard library's placeholders); each part is cut to 2000 characters and the whole to
    its last :data:`MAX_TRACEBACK_CHARS` characters, so a huge message cannot crowd out the
    frames.
    """
    try:
        parts = tb.TracebackException(type(exc), exc, exc.__traceback__).format()
        text = "".join(
            part if len(part) <= _MAX_TRACEBACK_PART else part[:_MAX_TRACEBACK_PART] + "...\n"
            for part in parts
        )
    except BaseException as failed:  # describing an error must never raise
        return f"<traceback unavailable: {type(failed).__name__}>"
    return text[-MAX_TRACEBACK_CHARS:]


def cause_of(exc: BaseException) -> BaseException:
    """The error a failed run is recorded under: the cause of a :class:`~blitzq.Retry`, the
    explicit cause (``raise ... from``) of a :class:`~blitzq.NoRetry`, else ``exc`` itself."""
    if isinstance(exc, Retry):
        return _task_cause(exc) or exc.__context__ or exc
    if isinstance(exc, NoRetry):
        return _task_cause(exc) or exc
    return exc


def _task_cause(exc: BaseException) -> BaseException | None:
    """``exc.__cause__`` as the task set it: the traceback text a process pool chains onto
    an exception it sends back (``concurrent.futures.process._RemoteTraceback``) is none."""
    cause = exc.__cause__
    kind = type(cause)
    if kind.__name__ == "_RemoteTraceback" and kind.__module__ == "concurrent.futures.process":
        return None
    return cause


class Job:
    """One delivery being run.

    Attributes:
        delivery: what the broker handed over.
        envelope: the decoded message.
        task: the registered task.
        attempt: this run's attempt number (retries and crash redeliveries counted).
        started_at: Unix time (seconds) the run started.
        handle: the asyncio task or future running it, when it did not finish at once.
        timed_out: the run passed its timeout.
        finished: a completion was already produced for this delivery.
        result: the return value of a successful run, else :data:`NO_RESULT`.
        scope: the run's own :class:`contextvars.Context` (a copy of the worker's base
            context, with the before-execute middleware's changes), once it started.
        encode_error: the error that storing the return value raised (it failed the run),
            else ``None``.
        pool_call: a thread task's call in the thread pool (cancelled at the hard timeout
            when it has not started), else ``None``.
        context: the run's :class:`~blitzq.TaskContext` once made (:meth:`task_context`),
            else ``None``.
        reporter: where the run's progress updates go (the worker's progress writer) while
            it runs, else ``None``; given to its context when made.
    """

    __slots__ = (
        "attempt",
        "context",
        "delivery",
        "encode_error",
        "envelope",
        "finished",
        "handle",
        "pool_call",
        "reporter",
        "result",
        "scope",
        "started_at",
        "task",
        "timed_out",
        "timer",
    )

    def __init__(self, delivery: Delivery, envelope: Envelope, task: Task[Any, Any]) -> None:
        self.delivery = delivery
        self.envelope = envelope
        self.task = task
        attempt = envelope.attempt + delivery.deliveries - 1
        # A delivery that may never have run counts no attempt past the last (a redelivery
        # only: fast mode's deliveries are 4-tuples made without the field).
        if attempt > envelope.attempt and attempt > task.max_attempts and delivery.unsure:
            attempt -= 1
        self.attempt = attempt
        self.started_at = 0.0
        self.handle: Any = None
        self.timer: Any = None
        self.timed_out = False
        self.finished = False
        self.context: TaskContext | None = None
        self.scope: contextvars.Context | None = None
        #: The return value once the run succeeded (finishers read it), else NO_RESULT.
        self.result: Any = NO_RESULT
        self.encode_error: BaseException | None = None
        self.pool_call: concurrent.futures.Future[Any] | None = None
        self.reporter: Any = None

    def task_context(self) -> TaskContext:
        """The run's :class:`~blitzq.TaskContext` (what :func:`~blitzq.current_task` returns
        inside it), made on the first call, the same object on every later one.

        An async run without middleware gets none until something asks: its task code
        calling ``current_task()``, a cancel (which sets its ``cancelled``), the worker's
        resources. The context made sees everything set before (the cancel is set on it).
        """
        context = self.context
        if context is None:
            with _MAKING:  # a thread of the run and the worker's loop may ask at once
                context = self.context
                if context is None:
                    env = self.envelope
                    context = TaskContext(
                        env.id,
                        env.task,
                        self.delivery.queue,
                        self.attempt,
                        self.task.retries + 1,  # task.max_attempts, without the property
                        env.correlation_id,
                        env.headers,
                        flow=env.flow,
                        options=env.options,
                    )
                    context._reporter = self.reporter
                    self.context = context
        return context

    # ------------------------------------------------------- the run's records
    # Each builds one record of this run (:mod:`blitzq.records`) from the fields all of them
    # share (:meth:`shared`); ``worker`` is the id of the worker writing it
    # (:class:`.completions.Completions` wraps them in completions).

    def shared(self, worker: str) -> tuple[str, str, str, int, float, float | None, str]:
        """The fields every record of this run starts with, in the builders' order: the
        task's id, name, physical queue, this attempt, the first enqueue time, the start time
        (``None`` before the run started; Unix seconds) and ``worker``."""
        env = self.envelope
        return (
            env.id,
            env.task,
            self.delivery.queue,
            self.attempt,
            env.created_at,
            self.started_at or None,
            worker,
        )

    def running(self, worker: str) -> bytes:
        """The ``running`` record (with the arguments' preview)."""
        env = self.envelope
        return records.running(*self.shared(worker), (env.args, env.kwargs))

    def succeeded(self, worker: str, value: Any = msgspec.UNSET, preview: bool = False) -> bytes:
        """The ``succeeded`` record: with ``value`` when given (results stored), with the
        arguments' preview when ``preview``.

        Raises:
            SerializationError: ``value`` is not plain data.
        """
        env = self.envelope
        call = (env.args, env.kwargs) if preview else None
        return records.succeeded(*self.shared(worker), value, call=call)

    def retrying(self, worker: str, error_type: str, message: str) -> bytes:
        """The ``retrying`` record of this failed attempt (with the arguments' preview)."""
        env = self.envelope
        return records.retrying(*self.shared(worker), error_type, message, (env.args, env.kwargs))

    def failed(
        self, worker: str, error_type: str, message: str, trace: str, dead_lettered: bool
    ) -> bytes:
        """The final ``failed`` (or ``dead_lettered``) record, with the formatted ``trace``."""
        env = self.envelope
        return records.failed(
            *self.shared(worker),
            error_type,
            message,
            trace,
            dead_lettered=dead_lettered,
            call=(env.args, env.kwargs),
        )

    def cancelled(self, worker: str) -> bytes:
        """The ``cancelled`` record (``started_at`` only when the run had started)."""
        task_id, task, queue, attempt, enqueued_at, started_at, _ = self.shared(worker)
        env = self.envelope
        return records.cancelled(
            task_id, task, queue, attempt, enqueued_at, worker, (env.args, env.kwargs), started_at
        )
