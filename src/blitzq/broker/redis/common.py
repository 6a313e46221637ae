"""The Redis brokers: a Redis transport and the Redis state store on one connection.

:class:`RedisBroker` makes one :class:`~.connection.RedisConnection` and composes the mode's
transport (``streams.py`` or ``lists.py``) with the :class:`~.store.RedisStateStore` on it, in
the facade :class:`~blitzq.broker.Broker`; ``reliable.py`` and ``fast.py`` name the two
pairings. The same pairing by hand::

    conn = RedisConnection(url, namespace, kind="s")
    broker = Broker(StreamsTransport(conn), RedisStateStore(conn))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import redis.asyncio as aioredis

from ...limits import DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from ..facade import Broker
from ..transport import Transport
from .connection import DEFAULT_DEAD_LETTER_CAP, DeadLetterLimits, RedisConnection
from .store import RedisStateStore

__all__ = ["DEFAULT_DEAD_LETTER_CAP", "RedisBroker"]


class RedisBroker(DeadLetterLimits, Broker):
    """A Redis transport and the Redis state store sharing one connection.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        namespace: key namespace; every key is prefixed ``{namespace}:``.
        dead_letter_cap: dead letters kept before the oldest are dropped.
        client: an existing ``redis.asyncio.Redis`` to use instead of ``url`` (not closed by
            the broker).
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept before the oldest are
            dropped.
        listener_client: a client of the result listener's own (see
            :class:`~.connection.RedisConnection`), closed by the broker.

    Attributes:
        conn: the shared :class:`~.connection.RedisConnection`; ``url``, ``keys``, ``client``
            and ``kind`` are its own.

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value.
    """

    transport_class: ClassVar[Callable[[RedisConnection], Transport]]
    """Makes the mode's transport on the connection (``StreamsTransport``, ``ListsTransport``)."""
    kind: ClassVar[str]
    """``"s"`` (streams) or ``"l"`` (lists): the connection's kind for this mode."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
        client: aioredis.Redis | None = None,
        dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
        listener_client: aioredis.Redis | None = None,
    ) -> None:
        conn = RedisConnection(
            url,
            namespace,
            dead_letter_cap=dead_letter_cap,
            client=client,
            dead_letter_ttl=dead_letter_ttl,
            dead_letter_max_bytes=dead_letter_max_bytes,
            kind=self.kind,
            listener_client=listener_client,
        )
        super().__init__(type(self).transport_class(conn), RedisStateStore(conn))
        self.conn = conn
        self.url = conn.url
        self.keys = conn.keys
        self.client: Any = conn.client
        self._results = conn._results

    @property
    def pool_size(self) -> int | None:
        """Most connections this broker opens (``max_connections``), ``None`` when unknown."""
        return self.conn.pool_size

    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING (one PING: both halves share
        the connection)."""
        await self.conn.ping()

    async def close(self) -> None:
        """Close the shared connection once (see :meth:`.RedisConnection.close`)."""
        await self.conn.close()
