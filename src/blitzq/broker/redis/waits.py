"""The record waits in flight on one result listener, so that closing the broker ends them.

A wait (``RedisRecords.wait_for_record``) counts itself in while it runs and notes the
listener's generation when it starts. :meth:`InFlightWaits.end` (the listener's close) starts a
new generation, fails every registered waiter with :func:`closed_error`, and lets the waits
in a round trip finish it (at most :data:`CLOSE_GRACE` seconds) before the connections close:
each then sees the new generation and raises the same error, instead of reopening a
connection on the closed client or ending with a ``CancelledError`` nobody asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping

from ...exceptions import BrokerError

#: Seconds a close waits for the record waits in a round trip to see that it happened.
CLOSE_GRACE = 1.0


def closed_error() -> BrokerError:
    """What a wait in flight raises when its broker is closed (not transient: nothing
    retries it)."""
    return BrokerError("the queue's connections were closed while this wait ran", False)


def fail(*by_channel: Mapping[bytes, list[asyncio.Future[bytes]]]) -> None:
    """End each waiter of ``by_channel`` (waiters by channel) not yet done with
    :func:`closed_error`."""
    for fut in itertools.chain.from_iterable(w for m in by_channel for w in m.values()):
        if not fut.done():
            fut.set_exception(closed_error())
            fut.exception()  # retrieved here: a waiter nobody awaits logs nothing


class InFlightWaits:
    """Counts the record waits in flight and ends them at close (see the module docs)."""

    def __init__(self) -> None:
        self.generation = 0
        self._active = 0
        self._drained: asyncio.Event | None = None

    def begin(self) -> int:
        """Count a wait in; returns the generation it belongs to."""
        self._active += 1
        return self.generation

    def done(self) -> None:
        """Count a wait out (in its ``finally``)."""
        self._active -= 1
        if not self._active and self._drained is not None:
            self._drained.set()

    def check(self, generation: int) -> None:
        """Raise :func:`closed_error` if the broker was closed since ``generation`` began."""
        if generation != self.generation:
            raise closed_error()

    async def end(self, *by_channel: Mapping[bytes, list[asyncio.Future[bytes]]]) -> None:
        """Start a new generation, fail the listener's waiters (``by_channel``, see
        :func:`fail`), and wait up to :data:`CLOSE_GRACE` seconds for the waits in flight to
        leave."""
        self.generation += 1
        fail(*by_channel)
        if self._active:
            drained = self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_GRACE):
                    await drained.wait()
            self._drained = None
