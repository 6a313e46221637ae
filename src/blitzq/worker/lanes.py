"""Parked lanes: the completions of a queue that the broker holds back for now.

On a Redis Cluster's spread layout each queue's part of a completion batch is applied on its
own (``broker/redis/spread.py``); a part whose slot is migrating, or whose node is failing
over, is held back (:class:`~blitzq.broker.values.HeldBack`) while the other queues' parts
are written. The flusher (:mod:`.flusher`) parks what was held back in that queue's *lane*:
the queue's later completions queue behind it, in order, the lane is retried on its own with
a backoff (:data:`LANE_FIRST_DELAY` doubling to :data:`LANE_MAX_DELAY`), the leases of its
deliveries keep being renewed (:meth:`Lanes.tokens`), and only that queue's fetch loop waits
(:meth:`Lanes.blocked`) until the lane is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from ..broker.values import Completion
from ..exceptions import BrokerError
from ..routing import base_queue

__all__ = ["LANE_FIRST_DELAY", "LANE_MAX_DELAY", "Lanes"]

logger = logging.getLogger("blitzq.worker")

#: Seconds before a parked lane's first retry; it doubles with each failed try.
LANE_FIRST_DELAY = 0.02
#: Longest pause in seconds between two tries of a parked lane.
LANE_MAX_DELAY = 2.0


class _Lane:
    """A parked lane's retry state: the next try (loop time), the pause after it, since
    when it waits, and the event its fetch loop waits for (set when it is written)."""

    __slots__ = ("at", "delay", "open", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.at = since
        self.delay = LANE_FIRST_DELAY
        self.open = asyncio.Event()


class Lanes:
    """The parked lanes of one flusher, by base queue (``routing.base_queue``)."""

    def __init__(self) -> None:
        #: Per parked lane: its completions, oldest first.
        self.parked: dict[str, list[Completion]] = {}
        self._lanes: dict[str, _Lane] = {}

    def __bool__(self) -> bool:
        return bool(self._lanes)

    def take(self, completion: Completion) -> bool:
        """Queue ``completion`` behind its queue's parked ones, if any; ``False`` when its
        queue has no parked lane (it goes to the flusher's main line)."""
        if not self.parked:
            return False
        parked = self.parked.get(base_queue(completion.queue))
        if parked is None:
            return False
        parked.append(completion)
        return True

    @property
    def size(self) -> int:
        """Completions parked in every lane."""
        return sum(map(len, self.parked.values()))

    def blocked(self, queue: str) -> asyncio.Event | None:
        """The event set once the parked completions of base queue ``queue`` are written,
        or ``None`` when none are parked."""
        lane = self._lanes.get(queue)
        return lane.open if lane is not None else None

    def tokens(self, queue: str) -> list[bytes]:
        """Delivery tokens of physical queue ``queue`` parked, not written yet."""
        parked = self.parked.get(base_queue(queue))
        if not parked:
            return []
        return [c.token for c in parked if c.queue == queue and c.token is not None]

    def park(
        self, held: Iterable[Completion], pending: list[Completion], error: BrokerError
    ) -> None:
        """Park ``held`` (completions the broker could not apply now) with their queues,
        and move the completions of those queues out of ``pending`` (the flusher's main
        line, changed in place) behind them, in order."""
        loop = asyncio.get_running_loop()
        names: set[str] = set()
        for c in held:
            name = base_queue(c.queue)
            names.add(name)
            self.parked.setdefault(name, []).append(c)
        kept = []
        for c in pending:
            name = base_queue(c.queue)
            if name in self.parked:
                self.parked[name].append(c)
            else:
                kept.append(c)
        pending[:] = kept
        for name in names:
            lane = self._lanes.get(name)
            if lane is None:
                lane = self._lanes[name] = _Lane(loop.time())
                lane.open.clear()
                logger.warning(
                    "completions of queue %s cannot be written now (%s): they are kept and "
                    "retried, their leases renewed meanwhile; fetching from %s paused until "
                    "they are written, the other queues go on",
                    name,
                    error,
                    name,
                )
            self._pause(lane)

    def due(self) -> list[str]:
        """The lanes whose next try is due now."""
        now = asyncio.get_running_loop().time()
        return [name for name, lane in self._lanes.items() if lane.at <= now]

    def wait_for(self) -> float:
        """Seconds until the next lane's try is due (0 when one is due)."""
        due_at = min(lane.at for lane in self._lanes.values())
        return max(0.0, due_at - asyncio.get_running_loop().time())

    def settled(self, name: str) -> None:
        """Lane ``name``'s try ended (some of it written or dropped): open the lane when
        nothing is parked any more, else try again at once."""
        if self.parked[name]:
            self._lanes[name].at = 0.0
            return
        lane = self._lanes.pop(name)
        del self.parked[name]
        lane.open.set()
        took = asyncio.get_running_loop().time() - lane.since
        logger.warning(
            "completions of queue %s written again after %.1f s: fetching resumed", name, took
        )

    def backoff(self, name: str, error: BrokerError) -> None:
        """Lane ``name``'s try failed (transient): the next one after its pause."""
        lane = self._lanes[name]
        logger.debug(
            "completions of queue %s still wait, retrying in %.2f s: %s", name, lane.delay, error
        )
        self._pause(lane)

    @staticmethod
    def _pause(lane: _Lane) -> None:
        lane.at = asyncio.get_running_loop().time() + lane.delay
        lane.delay = min(lane.delay * 2, LANE_MAX_DELAY)
