"""The end of a run: its slot freed, its completion through the task's finishers to the
writer, and its typed :class:`~blitzq.extensions.middleware.Outcome` to the middleware and
signals.

The runner knows what happened to each run (returned, raised, timed out, cancelled, put
back); :func:`outcome_of` says it as a value, so the after-hooks never read the record back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .. import records
from ..broker import Completion
from ..exceptions import describe_error
from ..extensions.middleware import Outcome, OutcomeKind
from .eager import unwrap
from .execution import Job, cause_of
from .limiter import Slots
from .timeouts import forget, thread_returned
from .timeouts import timeout_error as _timeout_error

if TYPE_CHECKING:
    from .runner import Runner

logger = logging.getLogger("blitzq.worker")

#: Logger of each failed attempt's record (:func:`log_failure`): at the worker's
#: ``failure_log_level`` when the task failed for good, at its ``retry_log_level`` when it is
#: retried. Its own name, so that an alerting integration that reports the failure itself
#: (:mod:`blitzq.integrations.sentry`) can leave these records out.
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


def finish(
    runner: Runner, job: Job, result: Any, error: BaseException | None, retry: bool = True
) -> None:
    """Commit the outcome of a run that returned ``result`` or raised ``error``.

    ``retry=False`` fails it at once whatever the retry policy says (a bad call).
    """
    outcomes, track_state = runner.outcomes, runner.track_state
    if error is None:
        try:
            completion = outcomes.success(job, result, track_state)
        except Exception as exc:  # the encoder failed in an unexpected way (a bug)
            error, retry = exc, False
        else:
            typed = job.task.arguments
            if typed is not None and typed.returns is not None:
                result = typed.encode_result(result)  # finishers (workflows) pass it on plain
            job.result = result
            runner.processed += 1
            if runner.lifecycle.on:
                runner.lifecycle.event("succeeded", job.envelope, job.delivery.queue, job.attempt)
    if error is not None:
        try:
            completion = outcomes.failure(job, error, retry=retry, track_state=track_state)
        except Exception:  # a retry policy or encoder that raises: fail without retry
            logger.exception("could not build the retry of task %s", job.envelope.id)
            completion = outcomes.failure(job, error, False, track_state)
        runner.failed += 1
    commit(runner, job, completion, error)


def commit(
    runner: Runner,
    job: Job,
    completion: Completion | None,
    error: BaseException | None = None,
    cancelled: bool = False,
) -> None:
    """Hand a job's completion to the flusher, through the task's finishers if any, and its
    outcome to the middleware and signals when the queue has any.

    ``completion`` may be ``None`` (nothing to write: a fast-mode success without a
    record); finishers then get a bare one to add their operations to. ``cancelled``: the
    completion records a cancellation.
    """
    finishers = job.task.finishers
    if finishers:
        d = job.delivery
        bare = None
        if completion is None:
            completion = bare = Completion(d.queue, d.token, job.envelope.id)
        final = completion.reschedule is None and completion.requeue is None
        for finisher in finishers:
            completion = finisher(job, completion, final, error)
        if completion is bare and not bare.ops and bare.record is None and d.token is None:
            completion = None  # the finishers added nothing: still nothing to write
    failed = error if error is not None else job.encode_error
    if failed is not None and not cancelled:
        log_failure(runner, job, completion, failed)
    if runner.progress.active:  # the run's last progress update goes with its completion
        completion = runner.progress.finish(job, completion)
    extensions = runner.extensions
    if runner.observer is not None:  # metrics: counts the outcome the middleware get
        runner.observer.committed(job, completion, error, cancelled)
    if extensions.enabled:
        outcome = outcome_of(job, completion, error, cancelled)
        if outcome is not None:
            # After-hooks see the run's context as the task left it (a copy: a thread task
            # abandoned after its timeout may still be inside it).
            scope = job.scope if job.scope is not None else runner.base_context
            extensions.committed(job, outcome, scope.copy(), runner.worker_id)
    if completion is not None:
        runner.flusher.add(completion)


def workflow_id_of(job: Job) -> str | None:
    """The id of the workflow ``job`` is a step of, or ``None`` outside workflows."""
    flow = job.envelope.flow
    if isinstance(flow, dict):
        workflow = flow.get("w")
        if workflow:
            return str(workflow)
    return None


def log_failure(
    runner: Runner, job: Job, completion: Completion | None, error: BaseException
) -> None:
    """Log a failed attempt of ``job`` on :data:`OUTCOME_LOGGER`.

    A retry (``completion`` reschedules the task) is one line at the worker's
    ``retry_log_level`` (WARNING by default); a final failure (failed, dead-lettered, timed
    out on its last attempt) is at its ``failure_log_level`` (ERROR by default), with the
    traceback of the error (``exc_info``). Either record carries the fields ``task_id``,
    ``task``, ``queue`` (physical), ``worker_id``, ``attempt``, ``outcome`` (``retried``,
    ``failed`` or ``dead_lettered``), ``error_type``, ``error`` (the message, as stored in the
    record), ``workflow_id`` for a workflow step, and ``delay`` (seconds) for a retry. A run
    put back on its queue (``completion.requeue``) is not a failure and logs nothing.

    Args:
        runner: the worker's runner (its levels and id).
        job: the run that failed.
        completion: what is written for it.
        error: the run's exception (a :class:`~blitzq.Retry` is logged as its cause).
    """
    if completion is not None and completion.requeue is not None:
        return
    retried = completion is not None and completion.reschedule is not None
    level = runner.retry_log_level if retried else runner.failure_log_level
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
        "worker_id": runner.worker_id,
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


def run_ended(runner: Runner, job: Job, slots: Slots, handle: asyncio.Future[Any]) -> None:
    """The run really ended: free the slot and commit, unless already committed."""
    if runner.abandoned and job in runner.abandoned:
        thread_returned(runner, job)  # committed at the timeout; it kept its slot till now
        slots.release()
        forget(job)
        if not handle.cancelled():
            handle.exception()
        return
    runner.jobs.discard(job)
    if job.timer is not None:
        job.timer.cancel()
    if job.task.executor == "process" and (runner.killed_processes or runner.reaping):
        _release_once_reaped(runner, slots)
    else:
        slots.release()
    if job.finished:
        forget(job)
        if not handle.cancelled():
            handle.exception()  # retrieved, so asyncio does not log it as never retrieved
        return
    job.finished = True
    if job.timed_out and handle.cancelled():
        runner.failed += 1
        expired = _timeout_error(job)
        commit(runner, job, runner.outcomes.failure(job, expired), expired)
    elif job.context is not None and job.context.cancelled:
        if not handle.cancelled():
            handle.exception()  # retrieved: a killed process pool's error is expected here
        cancelled = runner.outcomes.cancelled(
            job.delivery, job.envelope, job.attempt, job.started_at or None
        )
        commit(runner, job, cancelled, cancelled=True)
    elif handle.cancelled():
        # Not cancelled by the worker (that marks the job first): the task cancelled
        # itself, which counts as a failure rather than a silent requeue loop.
        finish(runner, job, None, asyncio.CancelledError("the task was cancelled"))
    else:
        error = handle.exception()
        if error is None:
            finish(runner, job, handle.result(), None)
        else:
            finish(runner, job, None, unwrap(error))
    forget(job)


def _release_once_reaped(runner: Runner, slots: Slots) -> None:
    """Free a process run's slot once the pool processes killed (for it or a sibling
    in the same pool) have exited: joined in a thread, since a SIGKILLed process may
    still be exiting when its pool reports it broken."""
    if runner.killed_processes:
        killed, runner.killed_processes = runner.killed_processes, []

        def reap() -> None:
            for process in killed:
                process.join(10.0)

        runner.reaping = asyncio.ensure_future(asyncio.to_thread(reap))
    reaping = runner.reaping
    if reaping is None or reaping.done():
        runner.reaping = None
        slots.release()
    else:
        reaping.add_done_callback(lambda _: slots.release())
