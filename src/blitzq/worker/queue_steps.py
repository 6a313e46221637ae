"""The per-queue steps of a maintenance round (lease renewal, recovery), each on its own.

A queue whose step fails for a while (its Redis Cluster slot migrating, its node failing
over) must hold up neither the other queues' lease renewals nor their recoveries, or their
leases lapse meanwhile and their running tasks are taken over and run twice. Each step is
therefore awaited alone (:meth:`QueueSteps.alone`): a transient failure is logged once per
step and queue until it succeeds again, and the next round tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from ..exceptions import BrokerError

__all__ = ["QueueSteps"]

logger = logging.getLogger("blitzq.worker")


class QueueSteps:
    """Awaits a maintenance round's per-queue steps one by one, logging their transient
    failures once per condition."""

    __slots__ = ("_failing",)

    def __init__(self) -> None:
        #: (step, queue) whose last try failed transiently.
        self._failing: set[tuple[str, str]] = set()

    async def alone(self, what: str, queue: str, step: Awaitable[object]) -> None:
        """Await ``step`` (``what`` for physical queue ``queue``: "leases" for their
        renewal, "recovery"). A transient :class:`~blitzq.BrokerError` is logged at WARNING
        the first time (at DEBUG when the lost connection was reported already, and for each
        further failure) and swallowed: the next round tries again; the first success after
        it is logged at INFO.

        Raises:
            BrokerError: a failure that is not transient (the server refused the step).
        """
        key = (what, queue)
        try:
            await step
        except BrokerError as exc:
            if not exc.transient:
                raise
            if key in self._failing:
                logger.debug("maintenance: %s on %s failed again: %s", what, queue, exc)
                return
            self._failing.add(key)
            level = logging.DEBUG if exc.reported else logging.WARNING
            logger.log(
                level, "maintenance: %s on %s failed, retried each round: %s", what, queue, exc
            )
            return
        if key in self._failing:
            self._failing.discard(key)
            logger.info("maintenance: %s on %s works again", what, queue)
