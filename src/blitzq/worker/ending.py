"""What happens when a task ends: the one place that answers it.

A run ends one of a few ways (it returned, raised, timed out, was cancelled, was put back
unstarted, or its message could not run at all); :class:`Ending` turns each into what the
worker does about it, in this order:

1. the **completion**: :class:`~.completions.Completions` builds it (ack, record, retry,
   dead letter, requeue, reschedule; the records themselves come from the run,
   :class:`.execution.Job`);
2. the task's **finishers** (workflows, locks, unique keys) add their operations to it;
3. a failed attempt is **logged** on :data:`OUTCOME_LOGGER` (:meth:`Ending.log_failure`);
4. the run's newest **progress** update joins the completion (:mod:`.progress`);
5. the **observer** (metrics, the eager mode's keeper) counts it (:mod:`.tally`);
6. the run's typed :class:`~blitzq.extensions.middleware.Outcome` goes to the
   **middleware** and signals (:func:`outcome_of`), so the after-hooks never read the record
   back;
7. the completion goes to the **flusher**, written with the next group commit.

The runner knows how each run ended (:meth:`.runner.Runner.run_ended` frees its slot first);
everything after that is here.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import records
from ..broker import Completion, Delivery
from ..exceptions import describe_error
from ..extensions.flow_signals import workflow_end
from ..extensions.middleware import Outcome, OutcomeKind
from ..workflow.steps import finish_step
from .completions import Completions
from .eager_start import unwrap
from .execution import Job, cause_of

if TYPE_CHECKING:
    from ..extensions.registry import Extensions
    from .flusher import Flusher
    from .lifecycle import Lifecycle
    from .progress import ProgressReporter

logger = logging.getLogger("blitzq.worker")

#: The finishers of a task that has only the one every task gets (the workflow's), which
#: leaves a message outside workflows as it is: :meth:`Ending.commit` then calls none.
STEPS_ONLY = [finish_step]


class RunObserver(Protocol):
    """What the ending tells a run observer (:class:`~.tally.RunTally`: the metrics, the eager
    mode's keeper): each run's completion handed to the writer, and each delivery that ended
    before it ran. Declared here so that the tally, which asks :func:`outcome_kind`, is
    imported by no one below it."""

    def committed(
        self, job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
    ) -> None: ...

    def ended(
        self, queue: str, task: str, outcome: str, completion: Completion | None = None
    ) -> None: ...


class TimeoutLookup(Protocol):
    """What the ending asks the runner's timers (:class:`~.timeouts.Timeouts`) of a run that
    passed a timeout."""

    def error(self, job: Job) -> BaseException: ...

    def soft_expired(self, job: Job) -> bool: ...


#: Logger of each failed attempt's record (:meth:`Ending.log_failure`): at the worker's
#: ``failure_log_level`` when the task failed for good, at its ``retry_log_level`` when it is
#: retried. Its own name, so that an alerting integration that reports the failure itself
#: (:mod:`blitzq.integrations.sentry`) can leave these records out. The name is public (docs,
#: users' logging set-ups): it stays ``blitzq.worker.outcomes``.
OUTCOME_LOGGER = "blitzq.worker.outcomes"
outcome_logger = logging.getLogger(OUTCOME_LOGGER)


def outcome_of(
    job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
) -> Outcome | None:
    """What ``completion`` means for ``job``; ``None`` for nothing to report (a reschedule
    that did not start the task).

    Args:
        job: the run.
        completion: what is written for it (``None``: nothing to write, a success).
        error: the run's exception, or ``None``.
        cancelled: the completion records a cancellation.
    """
    if completion is None:
        return Outcome("succeeded" if error is None else "failed", error)
    if completion.requeue is not None:
        return Outcome("requeued")
    if completion.reschedule is not None:
        if error is None and not job.timed_out:
            return None
        error_type = message = None
        if completion.record is not None and error is not None:
            error_type, message = describe_error(cause_of(error))
        return Outcome("retried", error, error_type, message, max(0.0, completion.delay))
    if cancelled:
        return Outcome("cancelled", None, records.CANCELLED_TYPE, records.CANCELLED_MESSAGE)
    failed = error if error is not None else job.encode_error
    if completion.dead_letter is None and failed is None:
        return Outcome("succeeded")
    kind: OutcomeKind = "dead_lettered" if completion.dead_letter is not None else "failed"
    error_type = message = None
    if completion.record is not None and failed is not None:
        error_type, message = describe_error(cause_of(failed))
    return Outcome(kind, failed, error_type, message)


def outcome_kind(
    job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
) -> OutcomeKind | None:
    """``outcome_of(...).kind`` (``None`` likewise), without building the
    :class:`~blitzq.extensions.middleware.Outcome` for the common success (the metrics' path)."""
    plain = completion is None or (
        completion.requeue is None
        and completion.reschedule is None
        and completion.dead_letter is None
    )
    if plain and error is None and not cancelled and job.encode_error is None:
        return "succeeded"
    outcome = outcome_of(job, completion, error, cancelled)
    return outcome.kind if outcome is not None else None


def workflow_id_of(job: Job) -> str | None:
    """The id of the workflow ``job`` is a step of, or ``None`` outside workflows."""
    flow = job.envelope.flow
    if isinstance(flow, dict):
        workflow = flow.get("w")
        if workflow:
            return str(workflow)
    return None


class Ending:
    """The end of every delivery of one worker (module docstring: the steps, in order).

    Made once per runner; its attributes are the runner's (the runner keeps them in step
    when a test harness replaces the flusher, the observer or the base context).

    Args:
        completions: builds the completions.
        flusher: where completions go.
        progress: the worker's progress writer.
        extensions: the queue's middleware and signal handlers.
        lifecycle: the task lifecycle records (``succeeded``).
        worker_id: the worker's id (log fields, after-hooks).
        track_state: whether runs write ``running``/``retrying`` records.
        failure_log_level: level of the record of a task that failed for good.
        retry_log_level: level of the record of a failed attempt that is retried.
        base_context: the context after-hooks copy when the run has none of its own.
        timeouts: the runner's timers (:class:`.timeouts.Timeouts`): the error a timed-out
            run is recorded with, and whether the timeout it passed is its soft one.

    Attributes:
        processed: runs that succeeded (and whose result could be stored).
        failed: runs that failed, those whose result could not be stored, and messages that
            could not run.
        unwritten_runs: ``[succeeded, failed]``: those of :attr:`processed` and
            :attr:`failed` that no completion write counted (nothing was written, such as a
            fast-mode success without a result, or the store cannot count them with their
            writes: :meth:`~blitzq.broker.state.StateStore.counts`); the worker's
            registrations add these to the namespace's counters.
        observer: the run observer (metrics, the eager mode's keeper), or ``None``.
    """

    def __init__(
        self,
        completions: Completions,
        flusher: Flusher,
        progress: ProgressReporter,
        extensions: Extensions,
        lifecycle: Lifecycle,
        worker_id: str,
        track_state: bool,
        failure_log_level: int,
        retry_log_level: int,
        base_context: contextvars.Context,
        timeouts: TimeoutLookup,
    ) -> None:
        self.completions = completions
        self.flusher = flusher
        self.progress = progress
        self.extensions = extensions
        self.lifecycle = lifecycle
        self.worker_id = worker_id
        self.track_state = track_state
        self.failure_log_level = failure_log_level
        self.retry_log_level = retry_log_level
        self.base_context = base_context
        self.observer: RunObserver | None = None
        self.timeouts = timeouts
        self.processed = 0
        self.failed = 0
        flusher.on_stale = self.refused
        self.unwritten_runs = [0, 0]
        #: The last look at each commit, which may add to its completion: the note of the
        #: task's end (:mod:`.recent`) and the series' latencies (:mod:`.series`); the
        #: worker sets it (by default the completion as it is).
        self.tap: Callable[..., Completion | None] = lambda job, c, error, cancelled: c
        #: Called once, when the completion of the first run committed here was applied (the
        #: mark of a supervised worker that made progress: :func:`.heartbeat.progress_mark`),
        #: or ``None``.
        self.first_run: Callable[[], None] | None = None

    def ended(self, job: Job, handle: asyncio.Future[Any]) -> None:
        """The run's call ended (its slot already freed): commit what it came to, unless a
        completion was already committed for it (a hard timeout, a cancel, a shutdown).

        Args:
            job: the run.
            handle: its finished task or future.
        """
        if job.finished:
            if not handle.cancelled():
                handle.exception()  # retrieved, so asyncio does not log it as never retrieved
            return
        job.finished = True
        if job.timed_out and (handle.cancelled() or not self.timeouts.soft_expired(job)):
            if not handle.cancelled():  # a hard timeout's cancellation caught and not re-raised
                self._ignored_cancel(job, handle)
            self.timed_out(job)
        elif job.context is not None and job.context.cancelled:
            if not handle.cancelled():
                handle.exception()  # retrieved: a killed process pool's error is expected here
            self.commit(job, self.completions.cancelled(job), cancelled=True)
        elif handle.cancelled():
            # Not cancelled by the worker (that marks the job first): the task cancelled
            # itself, which counts as a failure rather than a silent requeue loop.
            self.finish(job, None, asyncio.CancelledError("the task was cancelled"))
        else:
            error = handle.exception()
            if error is None:
                self.finish(job, handle.result(), None)
            else:
                self.finish(job, None, unwrap(error))

    @staticmethod
    def _ignored_cancel(job: Job, handle: asyncio.Future[Any]) -> None:
        """Warn of an async run that went on after its hard timeout cancelled it (it caught
        ``CancelledError``), then returned or raised: it is recorded as a timeout all the
        same, what it came to is dropped."""
        error = handle.exception()
        logger.warning(
            "task %s %s caught the cancellation of its hard timeout and %s: recorded as a "
            "TaskTimeout all the same (an async task must let CancelledError propagate)",
            job.envelope.task,
            job.envelope.id,
            "returned" if error is None else f"raised {type(error).__name__}",
        )

    def finish(
        self, job: Job, result: Any, error: BaseException | None, retry: bool = True
    ) -> None:
        """Commit the outcome of a run that returned ``result`` or raised ``error``.

        ``retry=False`` fails it at once whatever the retry policy says (a bad call).
        """
        completions, track_state = self.completions, self.track_state
        if error is None:
            try:
                completion = completions.success(job, result, track_state)
            except Exception as exc:  # the encoder failed in an unexpected way (a bug)
                error, retry = exc, False
            else:
                typed = job.task.arguments
                if typed is not None and typed.returns is not None:
                    result = typed.encode_result(result)  # finishers (workflows) pass it on
                job.result = result
                if job.encode_error is not None:  # dead-lettered: its result cannot be stored
                    self.failed += 1
                else:
                    self.processed += 1
                    if self.lifecycle.on:
                        env = job.envelope
                        self.lifecycle.event("succeeded", env, job.delivery.queue, job.attempt)
        if error is not None:
            try:
                completion = completions.failure(job, error, retry, track_state)
            except Exception:  # a retry policy or encoder that raises: fail without retry
                logger.exception("could not build the retry of task %s", job.envelope.id)
                completion = completions.failure(job, error, False, track_state)
            self.failed += 1
        # A result that could not be stored (job.encode_error) is written as a failure.
        ok = error is None and job.encode_error is None
        self.commit(job, completion, error, tally=1 if ok else 2)

    def timed_out(self, job: Job) -> None:
        """Commit the failure of a run that passed its timeout (soft or hard: the error is
        :meth:`.timeouts.Timeouts.error`'s)."""
        error = self.timeouts.error(job)
        self.failed += 1
        self.commit(job, self.completions.failure(job, error), error, tally=2)

    def commit(
        self,
        job: Job,
        completion: Completion | None,
        error: BaseException | None = None,
        cancelled: bool = False,
        tally: int = 0,
    ) -> None:
        """Hand a job's completion to the flusher, through the task's finishers if any, and its
        outcome to the observer, the middleware and signals (module docstring, steps 2-7).

        ``completion`` may be ``None`` (nothing to write: a fast-mode success without a
        record); finishers then get a bare one to add their operations to. ``cancelled``: the
        completion records a cancellation. ``tally``: the run it ends, counted once
        (:meth:`count_run`): ``1`` succeeded, ``2`` failed, ``0`` none.
        """
        finishers = job.task.finishers
        # The workflow finisher alone passes a message outside workflows through untouched.
        if finishers and (
            completion is None or job.envelope.flow is not None or finishers != STEPS_ONLY
        ):
            completion = self._through_finishers(job, completion, error)
        failed = error if error is not None else job.encode_error
        if failed is not None and not cancelled:
            self.log_failure(job, completion, failed)
        if self.progress.active:  # the run's last progress update goes with its completion
            completion = self.progress.finish(job, completion)
        if self.observer is not None:  # metrics: counts the outcome the middleware get
            self.observer.committed(job, completion, error, cancelled)
        extensions = self.extensions
        if extensions.enabled:
            outcome = outcome_of(job, completion, error, cancelled)
            if outcome is not None:
                # After-hooks see the run's context as the task left it (a copy: a thread task
                # abandoned after its timeout may still be inside it).
                scope = job.scope if job.scope is not None else self.base_context
                step = extensions.workflow_signals and job.envelope.flow is not None
                end = workflow_end(completion) if step else None  # may it end the workflow?
                extensions.committed(job, outcome, scope.copy(), self.worker_id, end)
        completion = self.tap(job, completion, error, cancelled)
        if tally:
            self.count_run(completion, tally)
        if completion is not None:
            self.flusher.add(completion)
        if self.first_run is not None:
            self._watch_first(completion)

    def refused(self, stale: list[Completion]) -> None:
        """The broker refused ``stale`` (their leases were lost; another delivery of each
        message runs or ran it): their runs leave :attr:`processed` and :attr:`failed`, so
        the worker's counts agree with the namespace's and the metrics, which never count
        them."""
        for completion in stale:
            if completion.run == 1:
                self.processed -= 1
            elif completion.run == 2:
                self.failed -= 1

    @property
    def unwritten(self) -> tuple[int, int]:
        """:attr:`unwritten_runs` as a pair ``(succeeded, failed)``."""
        return self.unwritten_runs[0], self.unwritten_runs[1]

    def count_run(self, completion: Completion | None, tally: int) -> None:
        """Count the run ``completion`` ends (``tally``: ``1`` it succeeded, ``2`` it failed)
        in the namespace's counters: with its completion's writes when the store counts it
        there (:attr:`~blitzq.broker.values.Completion.tally`), else in
        :attr:`unwritten_runs` (the registrations add it)."""
        if completion is not None:
            completion.run = tally  # taken back from processed / failed if refused as stale
        if completion is not None and self.flusher.broker.state.counts(completion):
            completion.tally = tally
        else:
            self.unwritten_runs[tally - 1] += 1

    def _watch_first(self, completion: Completion | None) -> None:
        """Call :attr:`first_run` once ``completion`` is applied (at once when there is
        nothing to write); until it is called, each commit watches its own completion (one
        refused as stale or replaced is followed by the next)."""
        if completion is None:  # nothing to write (a fast-mode success): the run ended
            self._first_done()
        else:
            self.flusher.call_when_applied(completion, self._first_done)

    def _first_done(self) -> None:
        mark, self.first_run = self.first_run, None
        if mark is not None:
            mark()

    def _through_finishers(
        self, job: Job, completion: Completion | None, error: BaseException | None
    ) -> Completion | None:
        """``completion`` as the task's finishers leave it (``None`` stays ``None`` when
        they add nothing)."""
        d = job.delivery
        bare = None
        if completion is None:
            completion = bare = Completion(d.queue, d.token, job.envelope.id)
        final = completion.reschedule is None and completion.requeue is None
        for finisher in job.task.finishers:
            completion = finisher(job, completion, final, error)
        if completion is bare and not bare.ops and bare.record is None and d.token is None:
            return None  # the finishers added nothing: still nothing to write
        return completion

    def handed_back(self, job: Job) -> None:
        """Put ``job``'s delivery, whose start checks ran but which never started, back on
        its queue untouched: through the task's finishers (a lock place or unique key taken
        by a check is given back), with no outcome (it did not run)."""
        completion = self._through_finishers(job, self.completions.requeue(job), None)
        if completion is not None:
            self.flusher.add(completion)

    def unstarted(self, queue: str, task: str, completion: Completion, kind: str = "") -> None:
        """A delivery that ends before it runs (a start check's answer, an expired or
        rejected message): counted by the observer under ``kind`` when given (once the
        broker applied it), then handed to the flusher."""
        if kind and self.observer is not None:
            self.observer.ended(queue, task, kind, completion)
        self.flusher.add(completion)

    def rejected(
        self, d: Delivery, reason: str, error: str, task_id: str | None = None, task: str = ""
    ) -> None:
        """Dead-letter a message that cannot run (malformed, unknown task, too large), logged
        at the worker's ``failure_log_level`` with its fields (``queue``, ``reason``, ``error``,
        ``task_id``, ``task`` when known); ``TASK_REJECTED``. The caller frees its slot."""
        fields = {"queue": d.queue, "worker_id": self.worker_id, "outcome": "rejected"}
        if task_id is not None:
            fields["task_id"] = task_id
        if task:
            fields["task"] = task
        fields.update(reason=reason, error=error)
        logger.log(
            self.failure_log_level,
            "dead-lettering message from %s: %s (%s)",
            d.queue,
            reason,
            error,
            extra=fields,
        )
        completion = self.completions.rejected(d, reason, error, task_id, task)
        self.count_run(completion, 2)
        self.unstarted(d.queue, task, completion, "rejected")
        self.failed += 1
        if self.extensions.signals:
            self.extensions.rejected_event(d, reason, error, task_id, task, self.worker_id)

    def log_failure(self, job: Job, completion: Completion | None, error: BaseException) -> None:
        """Log a failed attempt of ``job`` on :data:`OUTCOME_LOGGER`.

        A retry (``completion`` reschedules the task) is one line at the worker's
        ``retry_log_level`` (WARNING by default); a final failure (failed, dead-lettered,
        timed out on its last attempt) is at its ``failure_log_level`` (ERROR by default),
        with the traceback of the error (``exc_info``). Either record carries the fields
        ``task_id``, ``task``, ``queue`` (physical), ``worker_id``, ``attempt``, ``outcome``
        (``retried``, ``failed`` or ``dead_lettered``), ``error_type``, ``error`` (the
        message, as stored in the record), ``workflow_id`` for a workflow step, and ``delay``
        (seconds) for a retry. A run put back on its queue (``completion.requeue``) is not a
        failure and logs nothing.

        Args:
            job: the run that failed.
            completion: what is written for it.
            error: the run's exception (a :class:`~blitzq.Retry` is logged as its cause).
        """
        if completion is not None and completion.requeue is not None:
            return
        retried = completion is not None and completion.reschedule is not None
        level = self.retry_log_level if retried else self.failure_log_level
        if not outcome_logger.isEnabledFor(level):
            return
        env = job.envelope
        cause = cause_of(error)
        error_type, message = describe_error(cause)
        if retried:
            kind = "retried"
        elif completion is not None and completion.dead_letter is not None:
            kind = "dead_lettered"
        else:
            kind = "failed"
        fields: dict[str, Any] = {
            "task_id": env.id,
            "task": env.task,
            "queue": job.delivery.queue,
            "worker_id": self.worker_id,
            "attempt": job.attempt,
            "outcome": kind,
            "error_type": error_type,
            "error": message,
        }
        workflow = workflow_id_of(job)
        if workflow is not None:
            fields["workflow_id"] = workflow
        if retried:
            assert completion is not None
            fields["delay"] = round(max(0.0, completion.delay), 3)
            outcome_logger.log(
                level,
                "task %s %s attempt %d failed, retry in %.3g s: %s: %s",
                env.task,
                env.id,
                job.attempt,
                fields["delay"],
                error_type,
                message,
                extra=fields,
            )
            return
        ending = "dead-lettered" if kind == "dead_lettered" else "failed for good"
        outcome_logger.log(
            level,
            "task %s %s %s on attempt %d: %s: %s",
            env.task,
            env.id,
            ending,
            job.attempt,
            error_type,
            message,
            exc_info=(type(cause), cause, cause.__traceback__),
            extra=fields,
        )


__all__ = [
    "OUTCOME_LOGGER",
    "Ending",
    "RunObserver",
    "outcome_kind",
    "outcome_of",
    "workflow_id_of",
]
