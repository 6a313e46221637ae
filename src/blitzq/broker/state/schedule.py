"""The schedule role of the state seam: the schedule, its promotion on the store's clock, and
periodic claims. Used by producers (delays, ETAs), workers and the scheduler.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence

from ..values import Scheduled

__all__ = ["ScheduleState"]


class ScheduleState(abc.ABC):
    """The schedule, its promotion and periodic claims (module docstring)."""

    @abc.abstractmethod
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule (keyed by task id: a later one replaces an earlier).

        Each item's due time is decided on the broker's clock (Redis ``TIME``): ``now +
        delay`` for a relative delay, or its absolute ``eta`` compared with that clock.
        """

    @abc.abstractmethod
    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """Move up to ``limit`` messages that are due by the broker's clock to their queues.

        ``ahead`` (seconds, default 0): also move those due within that many seconds of the
        broker's clock. Only the eager test mode (:mod:`blitzq.testing`) passes it, to run
        delays and retries in virtual time; workers and schedulers never do.

        Returns:
            ``(moved, next_eta, now)``: how many moved, the earliest due time still waiting
            (Unix seconds on the broker's clock, ``None`` when none waits), and the broker's
            clock when it looked. Sleep ``next_eta - now`` seconds, never ``next_eta -
            time.time()``: the caller's clock may differ from the broker's.
        """

    @abc.abstractmethod
    async def scheduled_count(self) -> int:
        """Number of messages on the schedule."""

    @abc.abstractmethod
    async def scheduled_entry(self, task_id: str) -> tuple[float, str, bytes] | None:
        """Where ``task_id`` waits on the schedule: ``(due, queue, message)`` -- the due time
        (Unix seconds, the broker's clock), the physical queue it will be published to, and
        the encoded message -- or ``None`` when it is not on the schedule."""

    async def scheduled_for(self, queues: Sequence[str], purge: bool = False) -> int:
        """Count the messages on the schedule bound for the physical ``queues`` (delays,
        ETAs, retry backoffs), or, with ``purge``, take them off it, freeing the unique key
        of each (a ``cancel`` of each, without the cancelled records). Reads the whole
        schedule (the queue of an entry is in its data), page by page.

        Returns:
            How many there are, or how many were taken off.

        Raises:
            BrokerError: the broker could not be reached.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list the schedule by queue")

    async def server_time(self) -> float:
        """The broker's clock (Unix seconds): what decides when anything is due.

        Redis ``TIME`` for the Redis brokers; this process's ``time.time()`` for in-process
        brokers (where producers, workers and schedulers share the process's clock).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return time.time()

    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str, until: float | None = None
    ) -> bool:
        """Dispatch one occurrence of the periodic task ``name``, at most once.

        Atomically, on the broker's clock: refuse an ``occurrence`` (Unix seconds) later than
        that clock (not due yet), or when that clock has reached ``until`` (Unix seconds;
        ``None``: no limit), the moment the occurrence stops being the one to dispatch (a
        newer one came due); otherwise, when the stored last occurrence of ``name`` is
        missing or older, store ``occurrence`` and publish ``message`` to ``queue``. However
        many schedulers race, one of them wins. A stored occurrence later than the broker's
        clock means that clock was stepped back since it was claimed: an older occurrence is
        then accepted, so a periodic task does not stop for the length of the step.

        Returns:
            ``True`` when this call dispatched the occurrence.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support periodic tasks")

    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """The last dispatched occurrence (Unix seconds) of each name that has one."""
        raise NotImplementedError(f"{type(self).__name__} does not support periodic tasks")
