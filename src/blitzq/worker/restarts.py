"""The supervisor's restart budget: how many restarts a worker slot may still make, and when.

A slot whose worker exits while no stop was asked is restarted after a backoff (0.25 s, 0.5 s,
1 s, … at most 5 s by default); after ``limit`` restarts within ``window`` seconds the slot
gives up (see :class:`~blitzq.worker.supervisor.Supervisor`).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RestartBudget:
    """How many restarts a slot may still make, and how long to wait before each.

    Args:
        limit: restarts allowed within ``window`` seconds.
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
