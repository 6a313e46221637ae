"""``max_age``: a task that waited too long before it could start is expired, not run.

``@queue.task(max_age=seconds)`` or per call ``task.options(max_age=seconds)``: a start check
compares the time since the task was first enqueued (the message's ``created_at``; retries
and lock or rate-limit waits keep it) with ``max_age``. An older task gets a record in the
final state ``expired`` (``result()`` raises :class:`~blitzq.TaskExpired`) and, unless the
task has ``dead_letter=False``, a dead letter with reason ``"expired"``. It never runs and no
attempt is spent. The check runs when a worker takes the task, so a task expires when a
worker reaches it, not on the second its age passes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from .. import records
from ..broker import Completion, DeadLetterFields
from ..options import Option, positive_seconds
from .middleware import Middleware
from .ratelimit import RateCheck

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..options import TaskOptions
    from ..serialization import Envelope
    from ..task import StartCheck as TaskCheck
    from ..task import Task
    from ..worker.execution import Job
    from .middleware import WorkerContext


class Expiry(Middleware):
    """Built-in middleware of the ``max_age`` option: seconds a call may wait before it
    starts (``None``: no limit)."""

    task_options: ClassVar[Mapping[str, Option]] = {
        "max_age": Option(None, positive_seconds),
    }
    #: ``task.options(max_age=...)``: carried in the message's ``options`` field.
    call_options: ClassVar[Mapping[str, Option]] = {
        "max_age": Option(None, positive_seconds),
    }

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Add the expiry start check to a task with a ``max_age``."""
        if options.get("max_age") is not None:
            task.checks.append(check_expiry)


def call_max_age(envelope: Envelope) -> float | None:
    """The per-call ``max_age`` a message carries (in its ``options``, or in the field of a
    message enqueued before them), in seconds, or ``None``."""
    options = envelope.options
    given = options.get("max_age") if options else None
    return given if isinstance(given, int | float) and given > 0 else envelope.max_age


def max_age_of(job: Job) -> float | None:
    """The call's ``max_age`` (per-call option first, then the task's), in seconds."""
    return call_max_age(job.envelope) or job.task.controls.get("max_age")


def expired_completion(worker: WorkerContext, job: Job, age: float, max_age: float) -> Completion:
    """Completion acking ``job`` with an ``expired`` record and, if wanted, a dead letter."""
    env, d = job.envelope, job.delivery
    now = time.time()
    error = f"waited {age:.3f} s before it could start, over its max_age of {max_age} s"
    record = records.expired(
        env.id,
        env.task,
        d.queue,
        max(0, job.attempt - 1),
        env.created_at,
        now,
        worker.worker_id,
        error,
        (env.args, env.kwargs),
    )
    dead = (
        DeadLetterFields(d.payload, "expired", error, env.task, d.queue, now)
        if job.task.dead_letter
        else None
    )
    return Completion(
        d.queue, d.token, env.id, record, worker.result_ttl, dead_letter=dead, nonce=env.nonce
    )


async def check_expiry(worker: WorkerContext, job: Job) -> Completion | None:
    """Start check: ``None`` to start, or the expired completion (finishers applied)."""
    max_age = max_age_of(job)
    created = job.envelope.created_at
    if not max_age or not created:
        return None
    age = time.time() - created
    if age <= max_age:
        return None
    completion = expired_completion(worker, job, age, max_age)
    for finisher in job.task.finishers:  # a final state: free unique keys and the like
        completion = finisher(job, completion, True, None)
    return completion


def start_checks(task: Task[Any, Any], envelope: Envelope) -> list[TaskCheck]:
    """The start checks of one delivery: the task's own, plus the expiry check when the call
    carries its own ``max_age`` (``task.options(max_age=...)``; see :func:`checks_with_expiry`).

    Args:
        task: the registered task.
        envelope: the delivery's decoded message.
    """
    return task.checks if call_max_age(envelope) is None else checks_with_expiry(task)


def checks_with_expiry(task: Task[Any, Any]) -> list[TaskCheck]:
    """The task's start checks with the expiry check added (for a per-call ``max_age``):
    where :class:`Expiry` puts it, after the rate-limit check and before the others."""
    checks = task.checks
    if check_expiry in checks:
        return checks
    lead = 1 if checks and isinstance(checks[0], RateCheck) else 0
    return [*checks[:lead], check_expiry, *checks[lead:]]
