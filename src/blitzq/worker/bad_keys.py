"""Priority levels set aside because their key holds another type (``WRONGTYPE``).

A queue's levels (``<q>:high``, ``<q>``, ``<q>:low``) are read together: one script call,
one blocking read over every idle queue's levels (:mod:`.idle`). A key of the wrong type
(``SET {ns}:s:<q>:low oops`` by hand, another program sharing the namespace) makes that one
command fail for all of them. The fetch loop then asks the transport, level by level, which
key is bad (:meth:`~blitzq.broker.transport.Transport.prepare_consumer` refuses such a key with
a :class:`~blitzq.BrokerError` naming it and its type), sets those levels aside and keeps
fetching the healthy ones. The worker logs one ERROR naming the key (at most once a minute per
key) and tries the level again every :data:`RECHECK` seconds, so it recovers by itself once
the key is deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final, Protocol

from ..broker.transport import Transport
from ..exceptions import BrokerError

logger = logging.getLogger("blitzq.worker")

#: Seconds a level stays set aside before its fetch is tried again.
RECHECK: Final = 30.0

#: Seconds between two ERROR logs about one key.
LOG_EVERY: Final = 60.0


def wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` (a failed fetch) is a server's ``WRONGTYPE`` reply."""
    return isinstance(exc, BrokerError) and "WRONGTYPE" in str(exc)


class _Preparing(Protocol):
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None: ...


async def prepare_levels(broker: _Preparing, queues: Sequence[str], consumer: str) -> None:
    """``broker.prepare_consumer(queues, consumer)`` (a broker, or its fast lane), at a
    worker's start; when a level's key holds another type, every other level is prepared
    and the worker starts: its fetch loop names the key and sets the level aside.

    Raises:
        BrokerError: the broker could not be reached, or refused for another reason.
    """
    try:
        await broker.prepare_consumer(queues, consumer)
    except BrokerError as exc:
        if not wrong_type(exc):
            raise
        for queue in queues:
            try:
                await broker.prepare_consumer([queue], consumer)
            except BrokerError as one:
                if not wrong_type(one):
                    raise


class BadKeys:
    """The levels of one transport set aside (module docstring).

    Args:
        transport: the transport whose keys are checked (the broker's, or its fast lane).
        consumer: this worker's consumer name (what ``prepare_consumer`` is given).
        lane: how the log names the transport (``""``, or ``" (fast lane)"``).

    Attributes:
        found: each level set aside, by physical queue name, with the error naming its key.
    """

    def __init__(self, transport: Transport, consumer: str, lane: str = "") -> None:
        self.transport = transport
        self.consumer = consumer
        self.lane = lane
        self.found: dict[str, str] = {}
        self._until: dict[str, float] = {}
        self._logged: dict[str, float] = {}

    def healthy(self, names: Sequence[str]) -> Sequence[str]:
        """``names`` without the levels set aside (a level whose :data:`RECHECK` passed is
        tried again)."""
        if not self._until:
            return names
        now = time.monotonic()
        for name in [n for n, until in self._until.items() if until <= now]:
            del self._until[name]
        return [n for n in names if n not in self._until]

    async def sort_out(self, names: Sequence[str]) -> bool:
        """After a ``WRONGTYPE`` fetch over ``names``: check each level's key and set aside
        those of the wrong type. Returns whether any was found (else the error was not a
        level's: the caller backs off as after any failed fetch).

        Raises:
            BrokerError: a check failed for another reason (the server is unreachable).
        """
        found = False
        for name in names:
            try:
                await self.transport.prepare_consumer([name], self.consumer)
            except BrokerError as exc:
                if exc.transient:
                    raise
                found = True
                self._set_aside(name, str(exc))
            else:
                self.found.pop(name, None)
        return found

    def _set_aside(self, name: str, error: str) -> None:
        now = time.monotonic()
        self._until[name] = now + RECHECK
        self.found[name] = error
        if now - self._logged.get(name, -LOG_EVERY) >= LOG_EVERY:
            self._logged[name] = now
            logger.error(
                "queue level %s%s is not fetched: %s; the other levels go on, and it is "
                "tried again every %g s",
                name,
                self.lane,
                error,
                RECHECK,
                extra={"queue": name, "error": error},
            )


__all__ = ["LOG_EVERY", "RECHECK", "BadKeys", "prepare_levels", "wrong_type"]
