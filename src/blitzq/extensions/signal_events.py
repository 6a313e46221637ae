"""The signals blitzq emits and the event each carries: plain data, shared by the middleware
hook that observes them (:meth:`blitzq.Middleware.on_signal`) and the table that emits them
(:mod:`blitzq.extensions.signals`, whose docstring says where each comes from)."""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Signal(enum.StrEnum):
    """The signals blitzq emits; see :mod:`blitzq.extensions.signals` for where each comes
    from."""

    TASK_ENQUEUED = "task_enqueued"
    TASK_RECEIVED = "task_received"
    TASK_REJECTED = "task_rejected"
    TASK_REVOKED = "task_revoked"
    TASK_STARTED = "task_started"
    TASK_SUCCEEDED = "task_succeeded"
    TASK_FAILED = "task_failed"
    TASK_RETRIED = "task_retried"
    TASK_DEAD_LETTERED = "task_dead_lettered"
    TASK_CANCELLED = "task_cancelled"
    TASK_EXPIRED = "task_expired"
    WORKER_STARTING = "worker_starting"
    WORKER_STARTED = "worker_started"
    WORKER_STOPPING = "worker_stopping"
    WORKER_STOPPED = "worker_stopped"
    WORKER_HEARTBEAT_LOST = "worker_heartbeat_lost"
    SCHEDULER_STARTED = "scheduler_started"
    SCHEDULER_STOPPED = "scheduler_stopped"
    SCHEDULER_DISPATCHED = "scheduler_dispatched"
    SCHEDULER_MISSED = "scheduler_missed"
    WORKFLOW_STARTED = "workflow_started"
    WORKFLOW_STEP_DONE = "workflow_step_done"
    WORKFLOW_COMPLETED = "workflow_completed"
    WORKFLOW_FAILED = "workflow_failed"


@dataclass(frozen=True, slots=True)
class SignalEvent:
    """What a signal handler, and a middleware's ``on_signal`` hook, receives.

    Attributes:
        signal: the signal emitted.
        task_id: the task's id (``None`` for worker, scheduler and workflow-level signals;
            a rejected message whose id cannot be read has none either).
        task: the task's name.
        queue: the physical queue of the message.
        attempt: 1-based attempt number of the run (``None`` where no run is involved).
        error: the exception of a failed, retried or dead-lettered run, when known.
        error_type: qualified type name of the error (also set when only the stored record
            knows it).
        error_message: the error's message.
        result: the return value of a succeeded run.
        delay: seconds until the retry of a ``TASK_RETRIED`` run.
        worker: id of the worker emitting it (``None`` on the producer and scheduler side).
        extra: further fields of the signal (``workflow_id``, ``reason``, ``occurrence``,
            ...: the table in ``docs/middleware-signals.md``).
        time: Unix time (seconds) the event was made.
    """

    signal: Signal
    task_id: str | None = None
    task: str | None = None
    queue: str | None = None
    attempt: int | None = None
    error: BaseException | None = None
    error_type: str | None = None
    error_message: str | None = None
    result: Any = None
    delay: float | None = None
    worker: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


#: A signal handler: a plain function or a coroutine function taking the event.
Handler = Callable[[SignalEvent], "Awaitable[None] | None"]


__all__ = ["Handler", "Signal", "SignalEvent"]
