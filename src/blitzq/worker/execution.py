"""One run (:class:`Job`) and the completions it can end with (:class:`Outcomes`).

The values of the per-task path, kept apart from the code that moves them (admission,
runner, outcomes) so that the path is easy to read and profile: a :class:`Job` is a decoded
delivery and its task; :class:`Outcomes` builds the completion of each way a run ends (ack,
record, retry, dead letter, requeue).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
import traceback as tb
from typing import Any

import msgspec

from .. import records
from ..broker import Completion, DeadLetterFields, Delivery
from ..context import NO_RESULT, TaskContext
from ..envelope_checks import value_size
from ..exceptions import (
    NoRetry,
    ResultTooLarge,
    Retry,
    SerializationError,
    TaskTimeout,
    describe_error,
)
from ..limits import DEAD_MESSAGE_SAMPLE, DEFAULT_MAX_RESULT_SIZE, clip_text
from ..serialization import Envelope, dumps, encode_envelope
from ..task import Task

#: Most characters of a formatted traceback kept in a record (its end is kept), and of any
#: one part of it (a frame, an exception's message line).
MAX_TRACEBACK_CHARS = 8000
_MAX_TRACEBACK_PART = 2000


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
        self.attempt = envelope.attempt + delivery.deliveries - 1
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


class Outcomes:
    """Builds completions for one worker.

    Args:
        worker_id: recorded in task records.
        store_results: the Queue's default for storing return values.
        result_ttl: seconds records live.
        max_message_size: bytes, for re-encoding retries.
        max_result_size: bytes; a return value over it (encoded, see
            :func:`~blitzq.envelope_checks.value_size`) fails the task with
            :class:`~blitzq.exceptions.ResultTooLarge`.
    """

    def __init__(
        self,
        worker_id: str,
        store_results: bool,
        result_ttl: int,
        max_message_size: int,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
    ) -> None:
        self.worker_id = worker_id
        self.store_results = store_results
        self.result_ttl = result_ttl
        self.max_message_size = max_message_size
        self.max_result_size = max_result_size
        #: Seconds a ``running`` record lives (the worker's maintenance keeps it while the
        #: run goes on: :func:`~.maintenance.running_record_ttl`).
        self.running_ttl = result_ttl

    def success(self, job: Job, value: Any, track_state: bool = False) -> Completion | None:
        """Completion of a run that returned ``value``; ``None`` when nothing is to be done.

        A value that is not plain data turns the run into a failure (SerializationError),
        and so does a return value over ``max_result_size`` (ResultTooLarge, not retried:
        the same call would return as much again); the limit counts the encoded value
        (:func:`~blitzq.envelope_checks.value_size`), not the record's own fields.
        With ``track_state`` a ``succeeded`` record (without the value, when results are not
        stored) replaces the ``running`` one, with the arguments' preview unless that alone
        would take it over ``max_result_size``.
        """
        d = job.delivery
        store = job.task.store_result
        if store is None:
            store = self.store_results
        if not store:
            if track_state:
                env = job.envelope
                record = records.succeeded(
                    env.id, env.task, d.queue, job.attempt, env.created_at,
                    job.started_at or None, self.worker_id, call=(env.args, env.kwargs),
                )  # fmt: skip
                return Completion(d.queue, d.token, job.envelope.id, record, self.result_ttl)
            if d.token is None:
                return None
            return Completion(d.queue, d.token, job.envelope.id)
        env = job.envelope
        try:
            typed = job.task.arguments
            if typed is not None and typed.returns is not None:
                value = typed.encode_result(value)
            record = records.succeeded(
                env.id, env.task, d.queue, job.attempt, env.created_at,
                job.started_at or None, self.worker_id, value,
                call=(env.args, env.kwargs) if track_state else None,
            )  # fmt: skip
            if len(record) > self.max_result_size and track_state:  # drop the preview first
                record = records.succeeded(
                    env.id, env.task, d.queue, job.attempt, env.created_at,
                    job.started_at or None, self.worker_id, value,
                )  # fmt: skip
            if len(record) > self.max_result_size:  # the record's own fields are not counted
                size = value_size(dumps(value))
                if size > self.max_result_size:
                    raise ResultTooLarge(size, self.max_result_size)
        except SerializationError as exc:
            job.result = NO_RESULT  # finishers (workflows) must not pass the value on
            job.encode_error = exc
            return self.failure(job, exc, retry=False)
        return Completion(d.queue, d.token, job.envelope.id, record, self.result_ttl)

    def reschedule(self, job: Job, delay: float, reserved: bool | None = None) -> Completion:
        """Completion putting ``job`` back on the schedule for ``delay`` seconds, unstarted
        (the attempt unchanged).

        Args:
            job: the delivery to put back.
            delay: seconds.
            reserved: keep (``None``), set or clear the rate-limit reservation.
        """
        env, d = job.envelope, job.delivery
        again = msgspec.structs.replace(
            env, enqueued_at=time.time(), reserved=env.reserved if reserved is None else reserved
        )
        data = encode_envelope(again, max(self.max_message_size, len(d.payload) * 2))
        return Completion(d.queue, d.token, env.id, reschedule=data, delay=delay)

    def failure(
        self, job: Job, exc: BaseException, retry: bool = True, track_state: bool = False
    ) -> Completion:
        """Completion of a run that raised ``exc``: a retry, a failure or a dead letter.

        With ``track_state`` a retry also writes a ``retrying`` record.
        """
        task, env, d = job.task, job.envelope, job.delivery
        policy = task.retry_policy
        cause = cause_of(exc)
        wants_retry = retry if isinstance(exc, Retry) else retry and policy.should_retry(exc)
        if wants_retry and job.attempt < task.max_attempts:
            delay = (
                exc.delay
                if isinstance(exc, Retry) and exc.delay is not None
                else policy.delay(job.attempt)
            )
            now = time.time()
            # replace() keeps every other field (workflow metadata, …) on the retry.
            again = msgspec.structs.replace(
                env, attempt=job.attempt + 1, enqueued_at=now, reserved=False
            )
            data = encode_envelope(again, max(self.max_message_size, len(d.payload) * 2))
            record = None
            if track_state:
                error_type, message = describe_error(cause)
                record = records.retrying(
                    env.id, env.task, d.queue, job.attempt, env.created_at,
                    job.started_at or None, self.worker_id, error_type, message,
                    (env.args, env.kwargs),
                )  # fmt: skip
            return Completion(
                d.queue, d.token, env.id, record, self.result_ttl, reschedule=data, delay=delay
            )
        error_type, message = describe_error(cause)
        trace = format_traceback(cause)
        dead = None
        if task.dead_letter:
            dead = DeadLetterFields(
                d.payload, "failed", f"{error_type}: {message}", env.task, d.queue, time.time()
            )
        record = records.failed(
            env.id, env.task, d.queue, job.attempt, env.created_at, job.started_at or None,
            self.worker_id, error_type, message, trace, dead_lettered=dead is not None,
            call=(env.args, env.kwargs),
        )  # fmt: skip
        return Completion(d.queue, d.token, env.id, record, self.result_ttl, dead_letter=dead)

    def timeout(self, job: Job, seconds: float) -> Completion:
        """Completion of a run that passed its timeout (retried like any failure)."""
        error = TaskTimeout(f"task {job.envelope.task} ran longer than {seconds} s")
        return self.failure(job, error)

    def rejected(
        self, delivery: Delivery, reason: str, error: str, task_id: str | None, task: str = ""
    ) -> Completion:
        """Completion dead-lettering a message that cannot run (malformed, unknown, too big).

        A message over ``max_message_size`` keeps only its first bytes in the dead letter.
        """
        ident = task_id or (delivery.token or b"").decode() or f"unknown-{time.time_ns()}"
        payload = delivery.payload
        if len(payload) > self.max_message_size:
            error = f"{error}; only the first {DEAD_MESSAGE_SAMPLE} bytes are kept"
            payload = payload[:DEAD_MESSAGE_SAMPLE]
        error = clip_text(error)
        dead = DeadLetterFields(payload, reason, error, task, delivery.queue, time.time())
        record = None
        if task_id is not None:
            record = records.rejected(
                task_id, task, delivery.queue, delivery.deliveries, reason, error, self.worker_id
            )
        return Completion(
            delivery.queue, delivery.token, ident, record, self.result_ttl, dead_letter=dead
        )

    def progress(self, job: Job, state: str = "running") -> Completion:
        """Completion that only writes the ``running`` record (``state`` must be
        ``"running"``, the one non-final state a worker writes); nothing is acked, but it
        is fenced by the delivery (not written once its lease is lost).

        Raises:
            ValueError: ``state`` is not ``"running"``.
        """
        if state != "running":
            raise ValueError(f"a worker writes no {state!r} record before the run ends")
        d, env = job.delivery, job.envelope
        record = records.running(
            env.id, env.task, d.queue, job.attempt, env.created_at, job.started_at or None,
            self.worker_id, (env.args, env.kwargs),
        )  # fmt: skip
        return Completion(d.queue, None, job.envelope.id, record, self.running_ttl, fence=d.token)

    def cancelled(
        self, d: Delivery, env: Envelope, attempt: int, started_at: float | None = None
    ) -> Completion:
        """Completion acking a cancelled task with a ``cancelled`` record; ``started_at``
        (Unix seconds): when its run started, for a running task cancelled."""
        record = records.cancelled(
            env.id, env.task, d.queue, attempt, env.created_at, self.worker_id,
            (env.args, env.kwargs), started_at,
        )  # fmt: skip
        return Completion(d.queue, d.token, env.id, record, self.result_ttl)

    @staticmethod
    def requeue(job: Job) -> Completion:
        """Completion putting an unfinished delivery back at the head of its queue."""
        d = job.delivery
        return Completion(d.queue, d.token, job.envelope.id, requeue=d.payload)
