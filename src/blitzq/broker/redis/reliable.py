"""Reliable mode: the streams transport with the Redis state store (at-least-once).

See ``streams.py`` for the delivery (consumer groups, leases, recovery) and ``store.py`` for
the state; ``complete.lua`` acks a stream entry in the same script as the completion's
writes, fenced by its lease.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..transport import Transport
from .common import RedisBroker
from .connection import RedisConnection
from .lists import ListsTransport
from .streams import StreamsTransport

__all__ = ["ReliableRedisBroker"]


class ReliableRedisBroker(RedisBroker):
    """At-least-once broker on Redis Streams, with the lists of fast mode as its fast lane
    (:meth:`~blitzq.broker.Broker.add_fast_lane`: the tasks declared
    ``@queue.task(mode="fast")``). See :class:`~.common.RedisBroker` for arguments."""

    transport_class: ClassVar[Callable[[RedisConnection], Transport]] = StreamsTransport
    kind: ClassVar[str] = "s"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_fast_lane(ListsTransport(self.conn.with_kind("l")))
