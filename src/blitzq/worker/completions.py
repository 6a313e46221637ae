"""The completion of each way a run ends (:class:`Completions`): ack, record, retry, dead
letter, requeue, reschedule, for one worker. The records themselves come from the run
(:class:`.execution.Job`); :class:`.ending.Ending` runs each completion through the rest of
what the end of a run means (finishers, logs, progress, observer, middleware, flusher).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from .. import records
from ..broker import Completion, DeadLetterFields, Delivery
from ..context import NO_RESULT
from ..envelope_checks import value_size
from ..exceptions import ResultTooLarge, Retry, SerializationError, describe_error
from ..limits import DEAD_MESSAGE_SAMPLE, DEFAULT_MAX_RESULT_SIZE, clip_text
from ..serialization import dumps, encode_envelope
from .execution import Job, cause_of, format_traceback

#: The dead-letter reason of a message delivered too often.
EXCEEDED = "max deliveries exceeded"


class Completions:
    """Builds the completion of each way a run ends, for one worker.

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
                record = job.succeeded(self.worker_id, preview=True)
                return Completion(
                    d.queue,
                    d.token,
                    job.envelope.id,
                    record,
                    self.result_ttl,
                    nonce=job.envelope.nonce,
                )
            if d.token is None:
                return None
            return Completion(d.queue, d.token, job.envelope.id)
        try:
            typed = job.task.arguments
            if typed is not None and typed.returns is not None:
                value = typed.encode_result(value)
            if track_state:
                record = job.succeeded(self.worker_id, value, True)
            else:  # job.succeeded, inlined: once per task on the worker's hot path
                env = job.envelope
                record = records.succeeded(
                    env.id,
                    env.task,
                    d.queue,
                    job.attempt,
                    env.created_at,
                    job.started_at or None,
                    self.worker_id,
                    value,
                )
            if len(record) > self.max_result_size and track_state:  # drop the preview first
                record = job.succeeded(self.worker_id, value)
            if len(record) > self.max_result_size:  # the record's own fields are not counted
                size = value_size(dumps(value))
                if size > self.max_result_size:
                    raise ResultTooLarge(size, self.max_result_size)
        except SerializationError as exc:
            job.result = NO_RESULT  # finishers (workflows) must not pass the value on
            job.encode_error = exc
            return self.failure(job, exc, retry=False)
        done = Completion(d.queue, d.token, job.envelope.id, record, self.result_ttl)
        if job.envelope.nonce is not None:  # set apart: a keyword costs every completion
            done.nonce = job.envelope.nonce
        return done

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
                record = job.retrying(self.worker_id, *describe_error(cause))
            return Completion(
                d.queue,
                d.token,
                env.id,
                record,
                self.result_ttl,
                reschedule=data,
                delay=delay,
                nonce=env.nonce,
            )
        error_type, message = describe_error(cause)
        dead = None
        if task.dead_letter:
            dead = DeadLetterFields(
                d.payload, "failed", f"{error_type}: {message}", env.task, d.queue, time.time()
            )
        trace = format_traceback(cause)
        record = job.failed(self.worker_id, error_type, message, trace, dead is not None)
        return Completion(
            d.queue, d.token, env.id, record, self.result_ttl, dead_letter=dead, nonce=env.nonce
        )

    def rejected(
        self, delivery: Delivery, reason: str, error: str, task_id: str | None, task: str = ""
    ) -> Completion:
        """Completion dead-lettering a message that cannot run (malformed, unknown, too big,
        delivered too often: its record then is the one a recovery writes,
        ``error_type="MaxDeliveriesExceeded"``).

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
        if task_id is not None and reason == EXCEEDED:  # as a recovery writes it
            record = records.deliveries_exceeded(
                task_id, task, delivery.queue, delivery.deliveries, error, time.time()
            )
        elif task_id is not None:
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
        d = job.delivery
        record = job.running(self.worker_id)
        started = Completion(
            d.queue, None, job.envelope.id, record, self.running_ttl, fence=d.token
        )
        if job.envelope.nonce is not None:
            started.nonce = job.envelope.nonce
        return started

    def cancelled(self, job: Job) -> Completion:
        """Completion acking a cancelled task with a ``cancelled`` record (with its start
        time when its run had started)."""
        d = job.delivery
        record = job.cancelled(self.worker_id)
        return Completion(
            d.queue, d.token, job.envelope.id, record, self.result_ttl, nonce=job.envelope.nonce
        )

    @staticmethod
    def requeue(job: Job) -> Completion:
        """Completion putting an unfinished delivery back at the head of its queue."""
        d = job.delivery
        return Completion(d.queue, d.token, job.envelope.id, requeue=d.payload)


__all__ = ["Completions"]
