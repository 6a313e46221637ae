"""The supervisor's restart budget: how many restarts a worker slot may still make, and when.

A slot whose worker exits while no stop was asked is restarted after a backoff (0.25 s, 0.5 s,
1 s, … at most 5 s by default); after ``limit`` restarts within ``window`` seconds the slot
gives up (see :class:`~blitzq.worker.supervisor.Supervisor`).

Only the deaths of workers that made no progress count, as supervisord's ``startsecs`` and
``startretries`` count only the starts that never reached ``RUNNING``: a worker that got a task
done (the completion of one of its runs was applied, :func:`~blitzq.worker.heartbeat.progress_mark`)
was no crash loop, so its death is restarted after the shortest delay, is not counted, and
clears what was counted (:meth:`RestartBudget.progressed`). The budget thus stops a worker that
cannot start or cannot get one task done (a bad configuration, an import that fails, a broker
that refuses it), not one that a task kills now and then (a *poison* task, dead-lettered after
``max_deliveries``).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RestartBudget:
    """How many restarts a slot may still make, and how long to wait before each.

    :meth:`next_delay` counts a restart after the death of a worker that made no progress;
    :meth:`progressed` answers the death of one that did (not counted, and the count starts
    over).

    Args:
        limit: restarts (of workers that made no progress) allowed within ``window`` seconds,
            counted since the last worker that made progress.
        window: the sliding window in seconds.
        base_delay: seconds before the first restart of a window; doubles with each restart.
        max_delay: the longest delay in seconds.
        clock: monotonic time source (seconds).
    """

    def __init__(
        self,
        limit: int = 5,
        window: float = 60.0,
        base_delay: float = 0.25,
        max_delay: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._clock = clock
        self._times: list[float] = []

    def next_delay(self) -> float | None:
        """Record one restart; return the seconds to wait first, or ``None`` when spent."""
        now = self._clock()
        self._times = [t for t in self._times if now - t < self.window]
        if len(self._times) >= self.limit:
            return None
        self._times.append(now)
        return min(self.base_delay * 2.0 ** (len(self._times) - 1), self.max_delay)

    def progressed(self) -> float:
        """A restart after a worker that made progress: not counted, and the restarts counted
        so far are forgotten (the next count and backoff start over); return the seconds to
        wait first, ``base_delay``."""
        self._times.clear()
        return self.base_delay
