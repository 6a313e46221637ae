"""Task lifecycle events on the ``blitzq.task`` logger: received, started, succeeded.

A worker logs each delivery it takes (``received``), each run it starts (``started``) and each
run that succeeded (``succeeded``) at its ``lifecycle_log_level`` (DEBUG by default: off under
the CLI's INFO; ``--log-lifecycle-level info`` shows them). Failures have their own records
(:meth:`.ending.Ending.log_failure`). Each record carries ``event``, ``task_id``, ``task``,
``queue``, ``worker_id``, ``attempt`` and, for a workflow step, ``workflow_id``.

Whether the logger takes that level is read once, when the worker starts (one attribute test
per event on the hot path); a logging set-up changed afterwards applies at the next start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..serialization import Envelope

#: The logger of the lifecycle events.
task_logger = logging.getLogger("blitzq.task")


class Lifecycle:
    """The lifecycle events of one worker.

    Args:
        level: the level of the records (a number, :mod:`logging`'s).
        worker_id: the worker's id, in every record.

    Attributes:
        on: whether ``blitzq.task`` takes records of ``level`` (read when made).
    """

    __slots__ = ("level", "on", "worker_id")

    def __init__(self, level: int, worker_id: str) -> None:
        self.level = level
        self.worker_id = worker_id
        self.on = task_logger.isEnabledFor(level)

    def event(self, event: str, env: Envelope, queue: str, attempt: int) -> None:
        """Log ``event`` (``received``, ``started``, ``succeeded``) of the message ``env``
        taken from the physical ``queue``, on its ``attempt``."""
        fields: dict[str, Any] = {
            "event": event,
            "task_id": env.id,
            "task": env.task,
            "queue": queue,
            "worker_id": self.worker_id,
            "attempt": attempt,
        }
        flow = env.flow
        if isinstance(flow, dict) and flow.get("w"):
            fields["workflow_id"] = str(flow["w"])
        message = "task %s %s %s (attempt %d)"
        task_logger.log(self.level, message, env.task, env.id, event, attempt, extra=fields)


__all__ = ["Lifecycle", "task_logger"]
