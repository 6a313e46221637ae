"""Fast mode: the lists transport with the Redis state store (at-most-once).

See ``lists.py`` for the delivery (a popped message is gone from Redis: no ack, no lease,
no recovery) and ``store.py`` for the state (retries, results and dead letters work as in
reliable mode).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..transport import Transport
from .common import RedisBroker
from .connection import RedisConnection
from .lists import ListsTransport

__all__ = ["FastRedisBroker"]


class FastRedisBroker(RedisBroker):
    """At-most-once broker on Redis lists. See :class:`~.common.RedisBroker` for arguments."""

    transport_class: ClassVar[Callable[[RedisConnection], Transport]] = ListsTransport
    kind: ClassVar[str] = "l"
