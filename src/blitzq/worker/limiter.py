"""Concurrency limiter: a counter of free slots that fetch loops reserve before fetching."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Limiter:
    """A bounded pool of slots.

    Args:
        capacity: slots in all (>= 1).
    """

    __slots__ = ("_event", "_waiting", "capacity", "free")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._event = asyncio.Event()
        self._event.set()
        # Coroutines parked on ``_event``: a release sets it only when one is (a release
        # per task, and ``Event.set`` is a Python call).
        self._waiting = 0

    @property
    def in_use(self) -> int:
        """Slots taken."""
        return self.capacity - self.free

    async def wait_free(self) -> None:
        """Return once at least one slot is free."""
        while self.free <= 0:
            await self._park()

    def take(self, wanted: int) -> int:
        """Take up to ``wanted`` free slots without waiting; return how many were taken."""
        n = min(wanted, self.free)
        if n > 0:
            self.free -= n
        return n

    async def _park(self) -> None:
        """Wait for the next release (or :meth:`resize`, :meth:`wake`)."""
        self._event.clear()
        self._waiting += 1
        try:
            await self._event.wait()
        finally:
            self._waiting -= 1

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots."""
        self.free += n
        if self._waiting and self.free > 0:
            self._event.set()

    async def drained(self, kept: Callable[[], int] | None = None) -> None:
        """Return once every slot is free (nothing running).

        Args:
            kept: with it, return once no more than ``kept()`` slots are taken: the slots
                of runs that are not waited for (threads abandoned at their hard timeout,
                which may never return). Asked again at every release and :meth:`wake`.
        """
        while self.in_use > (kept() if kept is not None else 0):
            await self._park()

    def resize(self, capacity: int) -> None:
        """Hold ``capacity`` slots in all from now on (>= 1). Shrinking takes no running
        slot back: fewer are handed out until enough runs end."""
        self.free += capacity - self.capacity
        self.capacity = capacity
        if self.free > 0:
            self._event.set()

    def wake(self) -> None:
        """Make the waiters check again: what :meth:`drained` waits for changed without a
        release (a run was abandoned, keeping its slot)."""
        self._event.set()


class Slots:
    """Reserve slots from a queue's limiter and the global one together."""

    __slots__ = ("global_limiter", "queue_limiter")

    def __init__(self, global_limiter: Limiter, queue_limiter: Limiter | None) -> None:
        self.global_limiter = global_limiter
        self.queue_limiter = queue_limiter

    async def reserve(self, wanted: int) -> int:
        """Wait until a slot is free in both limiters, then take up to ``wanted`` in both."""
        g, q = self.global_limiter, self.queue_limiter
        while True:
            if q is not None:
                await q.wait_free()
            await g.wait_free()
            if q is None:
                n = g.take(wanted)
                if n:
                    return n
                continue
            n = min(wanted, q.free, g.free)
            if n > 0:
                q.take(n)
                g.take(n)
                return n

    def take(self, wanted: int) -> int:
        """Take up to ``wanted`` slots free in both limiters now, without waiting; return how
        many were taken (0 when either is full)."""
        g, q = self.global_limiter, self.queue_limiter
        n = min(wanted, g.free) if q is None else min(wanted, g.free, q.free)
        if n <= 0:
            return 0
        if q is not None:
            q.take(n)
        g.take(n)
        return n

    def grant(self, wanted: int, queue_held: int) -> int:
        """Turn messages that arrived during a blocking fetch into held slots, without waiting.

        The blocking fetch holds ``queue_held`` slots of the queue's limiter only (no global
        ones). This takes up to ``wanted`` global slots, and queue slots beyond
        ``queue_held``, from what is free right now, and gives back the queue slots it does
        not use.

        Args:
            wanted: messages that arrived.
            queue_held: queue-only slots the fetch holds.

        Returns:
            How many messages now hold a slot in both limiters (0 to ``wanted``); the caller
            hands the others back.
        """
        q, g = self.queue_limiter, self.global_limiter
        n = min(wanted, g.free)
        if q is not None:
            n = min(n, queue_held + q.free)
            if n > queue_held:
                q.take(n - queue_held)
            elif n < queue_held:
                q.release(queue_held - n)
        g.take(n)
        return n

    def room(self, queue_held: int) -> int:
        """Messages a blocking fetch holding ``queue_held`` queue-only slots could start
        now (what :meth:`grant` would give)."""
        q, g = self.queue_limiter, self.global_limiter
        return g.free if q is None else min(g.free, queue_held + q.free)

    def release_queue(self, n: int = 1) -> None:
        """Give back ``n`` slots to the queue's limiter only (the global ones were returned)."""
        if self.queue_limiter is not None:
            self.queue_limiter.release(n)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots to both limiters."""
        if n <= 0:
            return
        if self.queue_limiter is not None:
            self.queue_limiter.release(n)
        g = self.global_limiter
        if type(g) is not Limiter:  # a subclass's own release (the eager mode's)
            g.release(n)
            return
        g.free += n  # Limiter.release, inlined: once per task
        if g._waiting and g.free > 0:
            g._event.set()
