"""One blocking read for all the idle queues of a worker (issue 25: idle is nearly free).

Each fetch loop (:mod:`.fetch`) takes what waits on its queue's levels without blocking; when
they are empty it does not block on its own connection, it joins :class:`SharedRead`: one
blocking command over every level of every queue waiting at that moment
(:meth:`~blitzq.broker.transport.Transport.block_first`, on the broker's one wakeable blocking
connection). When the read returns, each waiting loop gets the deliveries of its own queue
(maybe none) and goes round again; a loop whose last shared read brought nothing (or fewer
than the read takes from each level: ``Transport.block_count``) skips its non-blocking look
and joins the next read at once, so an idle worker sends one command per ``block_timeout``
whatever the number of its queues, and holds one blocking connection.

A queue that falls idle while a read is blocked (its loop was busy when the read started) wakes
that read (:meth:`~blitzq.broker.transport.Transport.unblock`: it ends taking nothing) so the
next read covers it at once; without a way to wake it, the queue waits for the read's end, at
most ``block_timeout``. The read starts a few turns of the event loop after the first loop
joins, so the loops that come back from one read join the next together. A stopping worker
wakes the read (:meth:`SharedRead.stop`) instead of waiting out its block.

Deliveries of a queue whose loop is gone (cancelled while it waited) are handed back
(``orphan``), never dropped.

A worker of one queue has no other loop to wait for: its loop sends the read itself, in its
own task (no task per read, and the deliveries reach the loop without a hand-over through a
future: a turn of the event loop less on the path of each task of an idle worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from ..broker import Broker, Delivery

#: Turns of the event loop a read waits for more loops to join before it blocks.
_JOIN_TURNS = 4


class SharedRead:
    """The one blocking read of a worker's idle fetch loops.

    Args:
        broker: the broker read from (its ``block_first`` and ``unblock``).
        levels: the physical queues (priority levels, most urgent first) of each base queue.
        timeout: seconds one read blocks (the worker's ``block_timeout``).
        orphan: called with a delivery whose loop stopped waiting (hand it back).
        healthy: the levels of a read without those set aside
            (:meth:`.bad_keys.BadKeys.healthy`); default: all of them.
    """

    def __init__(
        self,
        broker: Broker,
        levels: Mapping[str, Sequence[str]],
        timeout: float,
        orphan: Callable[[Delivery], None],
        healthy: Callable[[Sequence[str]], Sequence[str]] = lambda names: names,
    ) -> None:
        self._broker = broker
        self._levels = levels
        self._base = {name: q for q, names in levels.items() for name in names}
        self._timeout = timeout
        self._orphan = orphan
        self._healthy = healthy
        self._waiting: dict[str, asyncio.Future[list[Delivery]]] = {}
        #: Messages each waiting queue can start at once (its slots free, see :meth:`wait`).
        self._room: dict[str, int] = {}
        #: Entries per level the read that served each queue asked for (its last read).
        self.counts: dict[str, int] = {}
        #: The queues the read in flight covers (empty: none in flight).
        self._covered: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None
        self._waking: asyncio.Task[bool] | None = None
        self._stopping = False
        #: Blocking reads sent, and wake-ups asked (a queue joined a read in flight).
        self.reads = 0
        self.wakes = 0

    async def wait(self, queue: str, room: int = 1) -> list[Delivery]:
        """Block with the other idle queues; return the deliveries of ``queue`` that the
        read brought (none at its timeout, or when the read was woken). ``room``: messages
        the queue can start at once; a read asks each level for up to the transport's
        ``block_count`` only when every queue it covers has that much room (else one, so
        that nothing read is handed back for want of a slot), and :attr:`counts` tells the
        queue what its read asked.

        Raises:
            BrokerError: the read failed (every queue it covered gets the error).
        """
        if len(self._levels) == 1 and not self._covered and not self._stopping:
            return await self._read_alone(queue, room)
        fut: asyncio.Future[list[Delivery]] = asyncio.get_running_loop().create_future()
        self._waiting[queue] = fut
        self._room[queue] = room
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="blitzq-idle-read")
        elif self._covered and queue not in self._covered:
            self._wake()
        try:
            return await fut
        finally:
            if self._waiting.get(queue) is fut:
                del self._waiting[queue]

    def _count(self, queues: list[str], room: int) -> int:
        """Entries per level a read for ``queues`` asks (``room``: the least of theirs)."""
        count = self._broker.transport.block_count if room >= 2 else 1
        for q in queues:
            self.counts[q] = count
        return count

    async def _read_alone(self, queue: str, room: int) -> list[Delivery]:
        """The read of a worker whose only queue is ``queue``, sent from its loop's task."""
        names = self._healthy(self._levels[queue])
        count = self._count([queue], room)
        self._covered = frozenset((queue,))
        self.reads += 1
        try:
            if names:
                got = await self._broker.transport.block_first(names, self._timeout, count)
            else:  # every level set aside (.bad_keys): as a read that found nothing
                await asyncio.sleep(self._timeout)
                got = []
        finally:
            self._covered = frozenset()
        base = self._base
        mine = [d for d in got if base.get(d.queue) == queue]
        if len(mine) < len(got):  # not this queue's (never expected): back, never dropped
            for d in got:
                if base.get(d.queue) != queue:
                    self._orphan(d)
        return mine

    def stop(self) -> None:
        """The worker stops: start no more reads, and wake the one in flight."""
        self._stopping = True
        if self._covered:
            self._wake()

    def _wake(self) -> None:
        if self._waking is None or self._waking.done():
            self.wakes += 1
            self._waking = asyncio.create_task(
                self._broker.transport.unblock(), name="blitzq-unblock"
            )

    async def _run(self) -> None:
        while self._waiting:
            for _ in range(_JOIN_TURNS):
                if len(self._waiting) == len(self._levels):
                    break
                await asyncio.sleep(0)
            if self._stopping:
                self._settle(list(self._waiting), [])
                return
            queues = list(self._waiting)
            names = self._healthy([name for q in queues for name in self._levels[q]])
            count = self._count(queues, min(self._room.get(q, 1) for q in queues))
            self._covered = frozenset(queues)
            self.reads += 1
            try:
                if names:
                    got = await self._broker.transport.block_first(names, self._timeout, count)
                else:  # every level set aside (.bad_keys): as a read that found nothing
                    await asyncio.sleep(self._timeout)
                    got = []
            except asyncio.CancelledError:
                for q in queues:
                    fut = self._waiting.pop(q, None)
                    if fut is not None:
                        fut.cancel()
                raise
            except Exception as exc:
                self._covered = frozenset()
                for q in queues:
                    fut = self._waiting.pop(q, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)
                continue
            self._covered = frozenset()
            self._settle(queues, got)

    def _settle(self, queues: list[str], got: list[Delivery]) -> None:
        """Give each of ``queues`` its deliveries of ``got``; hand back those nobody waits
        for."""
        mine: dict[str, list[Delivery]] = {q: [] for q in queues}
        for d in got:
            base = self._base.get(d.queue)
            if base in mine:
                mine[base].append(d)
            else:
                self._orphan(d)
        for q, deliveries in mine.items():
            fut = self._waiting.pop(q, None)
            if fut is None or fut.done():
                for d in deliveries:
                    self._orphan(d)
            else:
                fut.set_result(deliveries)
