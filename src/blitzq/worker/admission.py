"""Admitting a delivery before it runs: decoding and checking its times and numbers
(dead-lettering what cannot run: :func:`~blitzq.envelope_checks.envelope_fault`), cancel
marks and the task's start checks (rate limits, expiry, locks, unique keys: the built-in
middleware in :mod:`blitzq.extensions`).

:class:`Admission` is the first stage of a delivery's path (the fetch loop calls
:meth:`Admission.start`). The common case (no start check, no mark) runs the task at once
(:meth:`.runner.Runner.run`). Otherwise the start is awaited in a task the runner tracks
(leased like a running task, handed back at shutdown). A delivery that must wait (a rate
limit, a lock) goes back on the schedule and frees its slot; one that cannot run ends in
:mod:`.ending`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..broker import Broker, Completion, Delivery
from ..broker.transport import MalformedDelivery, backstop_note, delivery_backstop
from ..dependencies import refuse_given
from ..envelope_checks import envelope_fault, options_fault, usable_id
from ..exceptions import ConfigurationError, SerializationError
from ..extensions.expiry import check_expiry, max_age_of, start_checks
from ..serialization import Envelope, decode_envelope, decode_envelope_raw, envelope_head
from ..task import Task
from .deferral import check_failed, take_deferrals
from .execution import Job
from .limiter import Slots
from .solo import Solo

#: A task call's positional and keyword arguments.
Call = tuple[list[Any], dict[str, Any]]

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..dependencies import Resources
    from ..extensions.registry import Extensions
    from .deferral import OutageBackoff
    from .ending import Ending
    from .flusher import Flusher
    from .lifecycle import Lifecycle

logger = logging.getLogger("blitzq.worker")


class _AdmittingWorker(Protocol):
    @property
    def outage_backoff(self) -> OutageBackoff: ...

    @property
    def resources(self) -> Resources: ...


class _Unknown(Protocol):
    def take(self, d: Delivery, env: Envelope, slots: Slots) -> None: ...


class AdmittingRunner(Protocol):
    """What admission sees of the runner (a :class:`~.runner.Runner`, which owns it): the
    worker's settings it reads on every delivery, the stages it hands a delivery to (the
    run, the unknown tasks, the ending), and the start counter of ``max_tasks_per_child``."""

    @property
    def worker(self) -> _AdmittingWorker: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def ending(self) -> Ending: ...

    @property
    def extensions(self) -> Extensions: ...

    @property
    def worker_id(self) -> str: ...

    @property
    def lifecycle(self) -> Lifecycle: ...

    @property
    def unknown(self) -> _Unknown: ...

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]: ...

    @property
    def max_message_size(self) -> int: ...

    @property
    def max_deliveries(self) -> int: ...

    @property
    def start_limit(self) -> int: ...

    @property
    def started(self) -> int: ...

    @property
    def jobs(self) -> set[Job]: ...

    @property
    def result_ttl(self) -> int: ...

    @property
    def visibility_timeout(self) -> float: ...

    @property
    def flusher(self) -> Flusher: ...

    @property
    def starting(self) -> dict[asyncio.Task[None], Delivery]: ...

    def run(self, job: Job, slots: Slots, hooked: bool = False) -> None: ...

    def hold_start(self, pending: asyncio.Task[None], d: Delivery) -> None: ...

    def give_back(self, d: Delivery, slots: Slots, job: Job | None = None) -> None: ...


class Admission:
    """Admits the deliveries of one worker's runner (module docstring).

    Args:
        runner: the worker's runner (it runs what is admitted).

    Attributes:
        revoked: cancel marks this worker knows, task id -> expiry (Unix seconds); the
            runner's ``revoked`` is this dict.
        marks: the broker's cancel marks being read for this fetch batch, if any.
        solo: the gate that runs suspects (redelivered tasks) alone (:mod:`.solo`).
    """

    def __init__(self, runner: AdmittingRunner) -> None:
        self.runner = runner
        self.ending = runner.ending
        # Read on every delivery: kept here, so the hot path reads one object.
        self.max_message_size = runner.max_message_size
        self.max_deliveries = runner.max_deliveries
        self.lifecycle = runner.lifecycle
        self.extensions = runner.extensions
        self.worker_id = runner.worker_id
        self.tasks = runner.tasks
        self.start_limit = runner.start_limit
        self._run = runner.run
        self.revoked: dict[str, float] = {}
        self.marks: asyncio.Future[dict[str, float]] | None = None
        #: A read of the marks every start waits for (:meth:`reread_marks`), else ``None``.
        self.fresh_marks: asyncio.Future[dict[str, float]] | None = None
        self.solo = Solo(runner, self, runner.max_deliveries)
        self.solo_from = self.solo.solo_from
        # A count past it is dead-lettered on receipt (suspects are bounded by the gate).
        self.backstop = delivery_backstop(self.max_deliveries)

    def start(self, d: Delivery, slots: Slots) -> None:
        """Begin one delivery that holds one slot of ``slots``."""
        if self.start_limit and self.runner.started >= self.start_limit:
            self.runner.give_back(d, slots)  # max-tasks-per-child reached: never started here
            return
        if len(d.payload) > self.max_message_size:
            ident, name = envelope_head(d.payload) or (None, "")
            self.reject(d, "message too large", f"{len(d.payload)} bytes", slots, ident, name)
            return
        try:
            try:  # decode_envelope_unchecked, inlined: once per delivery
                env = decode_envelope_raw(d.payload)
                if not env.enqueued_at:  # left off: the first enqueue's time
                    env.enqueued_at = env.created_at
            except Exception:  # decoded again for the error decode_envelope makes of it
                env = decode_envelope(d.payload)
        except SerializationError as exc:
            # When its id can be read, it is dead-lettered under it with a final record, so
            # a waiter on its result learns its fate instead of waiting forever.
            ident, name = envelope_head(d.payload) or (None, "")
            error = str(exc).removeprefix("malformed message: ")
            if isinstance(d, MalformedDelivery):  # no message at all: say what the entry holds
                error = d.fault
            self.reject(d, "malformed message", error, slots, ident, name)
            return
        fault = envelope_fault(env, time.time())  # a field enqueue would have refused
        task = self.tasks.get(env.task)
        if fault is None and env.options is not None and task is not None:
            fault = options_fault(env.options, task.call_controls)
        if fault is not None:
            self.reject(d, "malformed message", fault, slots, env.id, env.task)
            return
        if d.deliveries != 1 and self.over_delivered(d, env, slots):
            return
        if self.lifecycle.on:
            self.lifecycle.event("received", env, d.queue, env.attempt + d.deliveries - 1)
        if self.extensions.received:  # TASK_RECEIVED has a handler
            attempt = env.attempt + d.deliveries - 1
            self.extensions.received_event(env, d.queue, attempt, self.worker_id)
        if task is None:  # a rolling deploy: deferred for a worker that knows it, then rejected
            self.runner.unknown.take(d, env, slots)
            return
        if self.revoked and env.id in self.revoked:
            self.skip_cancelled(Job(d, env, task), slots)
            return
        if self.fresh_marks is not None:
            self.start_after_marks(Job(d, env, task), slots, self.fresh_marks)
            return
        if d.deliveries >= self.solo_from:  # a suspect: it runs alone (.solo)
            self.solo.take(d, env, task, slots)
            return
        # admit(), inlined: this is once per delivery on the worker's hot path.
        # A call with per-call options (or the old max_age field) may need checks of its own.
        calls = env.options is not None or env.max_age is not None
        if (task.checks or calls) and start_checks(task, env):
            checked = asyncio.ensure_future(self.start_checked(d, env, task, slots))
            self.runner.hold_start(checked, d)
            return
        if self.solo.closed:  # a suspect waits for its turn or runs alone
            self.solo.park(functools.partial(self.run, Job(d, env, task), slots), d, slots)
            return
        self._run(Job(d, env, task), slots)

    def run(self, job: Job, slots: Slots) -> None:
        """Run ``job`` (admitted, holding one slot of ``slots``) now, or once the suspect
        that runs alone has ended (:mod:`.solo`)."""
        solo = self.solo
        if solo.closed and job.delivery is not solo.current:
            solo.park(functools.partial(self.run, job, slots), job.delivery, slots)
            return
        self._run(job, slots)

    def reject(
        self,
        d: Delivery,
        reason: str,
        error: str,
        slots: Slots,
        task_id: str | None = None,
        task: str = "",
    ) -> None:
        """Dead-letter a message that cannot run (malformed, unknown task, too large;
        :meth:`.ending.Ending.rejected`) and free its slot of ``slots``. A ``task_id`` that
        breaks the rule of ids (an empty one) is not used: no record is written under it."""
        if task_id is not None and not usable_id(task_id):
            task_id = None
        self.ending.rejected(d, reason, error, task_id, task)
        slots.release()

    def over_delivered(self, d: Delivery, env: Envelope, slots: Slots) -> bool:
        """Dead-letter a redelivery (``deliveries`` not 1) whose count the transport read is
        unusable and return ``True``: 0 (a planted count that is no int >= 1: ``malformed
        message``), past the backstop (:func:`~blitzq.broker.transport.delivery_backstop`),
        or any redelivery under ``max_deliveries=1`` (``max deliveries exceeded``, as a
        recovery dead-letters it). ``False``: it may run (alone, see :mod:`.solo`)."""
        if d.deliveries < 1:
            error = "delivery count (stream field 'd', RabbitMQ headers) is not an int >= 1"
            self.reject(d, "malformed message", error, slots, env.id, env.task)
            return True
        if self.solo.budget and d.deliveries <= self.backstop:
            return False
        error = (
            f"delivery count is {d.deliveries}, more than max_deliveries={self.max_deliveries}"
            if not self.solo.budget
            else f"delivery count is {d.deliveries}, past "
            f"{backstop_note(self.backstop, self.max_deliveries)}"
        )
        self.reject(d, "max deliveries exceeded", error, slots, env.id, env.task)
        return True

    def admit(self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots) -> None:
        """Start checks when the task has any (rate limits, expiry, locks, unique), then run
        it."""
        if start_checks(task, env):
            checked = asyncio.ensure_future(self.start_checked(d, env, task, slots))
            self.runner.hold_start(checked, d)
            return
        self.run(Job(d, env, task), slots)

    async def start_checked(
        self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots
    ) -> None:
        """The task's start checks, in order; run, or end this delivery as the first check
        that answers tells.

        Each check is bounded by the worker's ``start_check_timeout``. A check that cannot
        reach the broker defers the task with backoff, one that gets an error reply fails the
        attempt (:mod:`.deferral`).
        """
        runner = self.runner
        job = Job(d, env, task)
        try:
            completion: Completion | None = None
            checks = start_checks(task, env)
            deferrals = take_deferrals(job) if env.deferrals else 0
            timeout = runner.worker.outage_backoff.timeout
            for check in checks:
                try:
                    async with asyncio.timeout(timeout):
                        completion = await check(runner, job)
                except Exception as exc:  # an outage, an error reply, a bug in a check
                    check_failed(self.ending, runner.worker.outage_backoff, job, exc, deferrals)
                    slots.release()
                    return
                if completion is not None:
                    break
            if completion is None:
                self.run(job, slots)
                return
        except Exception:  # a bug must not leak the slot; the lease recovers the message
            logger.exception("could not start task %s", env.id)
            slots.release()
            return
        expired = check is check_expiry and completion.reschedule is None
        self.ending.unstarted(d.queue, env.task, completion, "expired" if expired else "")
        if expired and self.extensions.signals:
            self.extensions.expired_event(job, max_age_of(job), self.worker_id)
        slots.release()

    def arguments(self, job: Job, slots: Slots) -> Call | None:
        """The arguments to call ``job``'s task with: rich annotated values converted (see
        :mod:`blitzq.arguments`), and a sync task's call checked against its signature before
        a thread or process is used on it.

        Returns:
            ``(args, kwargs)``, or ``None`` when the call cannot be made: the attempt then
            failed at once, without retries (the same message would not fit again), and its
            slot is released.
        """
        env, task = job.envelope, job.task
        try:
            typed = task.arguments
            call = typed.decode(env.args, env.kwargs) if typed else (env.args, env.kwargs)
            if task.injected:  # the worker's resources (blitzq.dependencies)
                # A message passing one (queue.send by name) is refused, never silently replaced.
                refuse_given(task.name, task.injected, task.signature, call[0], call[1])
                resolved = self.runner.worker.resources.resolve(task.injected, job.task_context())
                call = (call[0], {**call[1], **resolved})
            if task.executor != "async":
                task.signature.bind(*call[0], **call[1])
        except (TypeError, SerializationError, ConfigurationError) as exc:
            self.ending.finish(job, None, exc, retry=False)
            slots.release()
            return None
        return call

    def skip_cancelled(self, job: Job, slots: Slots) -> None:
        """The id has a cancel mark here: confirm it in the broker, then skip the task.

        A task enqueued again under the same explicit id clears the mark in the broker
        (``reset_tasks``) before it is published, while this worker's copy of the marks may
        be older: the broker's answer decides. Marks read by one fetch batch share one read.
        """
        if self.marks is None:
            self.marks = asyncio.ensure_future(self.runner.broker.revoked())
            asyncio.get_running_loop().call_soon(self._forget_marks)
        skip = asyncio.ensure_future(self._skip_if_marked(job, slots, self.marks))
        self.runner.hold_start(skip, job.delivery)

    def _forget_marks(self) -> None:
        self.marks = None

    def reread_marks(self) -> None:
        """A running task was cancelled here, so its slot frees; the task fetched next may
        be one cancelled with it whose event this worker has not read yet (a workflow's
        steps are all marked before any is announced: ``Results.cancel_together``). Until
        one read of the marks, begun now, has answered, every start waits for it
        (:meth:`start_after_marks`); its marks join :attr:`revoked`."""
        if self.fresh_marks is not None:
            return
        marks = asyncio.ensure_future(self.runner.broker.revoked())
        self.fresh_marks = marks
        marks.add_done_callback(self._fresh_marks_read)

    def _fresh_marks_read(self, marks: asyncio.Future[dict[str, float]]) -> None:
        self.fresh_marks = None
        if not marks.cancelled() and marks.exception() is None:
            self.revoked.update(marks.result())

    def start_after_marks(
        self, job: Job, slots: Slots, marks: asyncio.Future[dict[str, float]]
    ) -> None:
        """Start ``job`` once ``marks`` (:meth:`reread_marks`) answered, or skip it as
        cancelled when they hold its id."""
        skip = asyncio.ensure_future(self._skip_if_marked(job, slots, marks, unread=False))
        self.runner.hold_start(skip, job.delivery)

    async def _skip_if_marked(
        self,
        job: Job,
        slots: Slots,
        marks: asyncio.Future[dict[str, float]],
        unread: bool = True,
    ) -> None:
        """Skip ``job`` as cancelled when ``marks`` hold its id, else start it; ``unread``:
        what an unanswered read means (this worker's copy had the mark, or had none)."""
        env = job.envelope
        try:
            marked = env.id in await asyncio.shield(marks)
        except Exception as exc:  # the broker unreachable: trust this worker's copy
            logger.warning("could not confirm the cancel mark of %s: %s", env.id, exc)
            marked = unread
        if not marked:
            self.revoked.pop(env.id, None)
            try:
                if job.delivery.deliveries >= self.solo_from:  # a suspect: it runs alone
                    self.solo.take(job.delivery, env, job.task, slots)
                else:
                    self.admit(job.delivery, env, job.task, slots)
            except Exception:  # as in the fetch loop: the lease recovers the message
                logger.exception("could not start task %s", env.id)
                slots.release()
            return
        self.ending.commit(job, self.ending.completions.cancelled(job), cancelled=True)
        slots.release()


__all__ = ["Admission", "Call"]
