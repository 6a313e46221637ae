"""A real foreign pairing without RabbitMQ: the Redis state store on one namespace and a
streams transport on another connection and namespace.

The store never sees the transport's keys (nor the transport the store's), exactly as with a
RabbitMQ transport: ``state.acks(transport)`` is ``False``, so the facade acks on the
transport after each commit and relays the store's outbox to it (:mod:`blitzq.broker.outbox`).
Used by the contract suite (``BROKER_KINDS`` kind ``foreign``) and
``tests/integration/test_outbox_relay.py``.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from blitzq.broker import Broker
from blitzq.broker.redis.connection import DeadLetterLimits, RedisConnection
from blitzq.broker.redis.store import RedisStateStore
from blitzq.broker.redis.streams import StreamsTransport

#: Suffix of the transport's namespace (the store's namespace + this).
TRANSPORT_SUFFIX = "-transport"


class ForeignPairing(DeadLetterLimits, Broker):
    """``Broker(StreamsTransport on <namespace>-transport, RedisStateStore on <namespace>)``.

    The dead-letter settings the contract suite sets on a broker go to the store's
    connection (``conn``, :class:`DeadLetterLimits`). Its ``kind`` is ``"s"``: a store in
    outbox mode records a dead letter's origin as ``"s"`` (``DeadLetter.mode`` "reliable":
    the transports an outbox serves are at-least-once), as for any foreign pairing.

    Args:
        url: the Redis URL of both halves.
        namespace: the store's namespace; the transport's is ``namespace + TRANSPORT_SUFFIX``.
    """

    kind = "s"

    def __init__(self, url: str, namespace: str, **settings: Any) -> None:
        self.store_conn = self.conn = RedisConnection(url, namespace, kind="l", **settings)
        self.transport_conn = RedisConnection(url, namespace + TRANSPORT_SUFFIX, kind="s")
        super().__init__(StreamsTransport(self.transport_conn), RedisStateStore(self.store_conn))
        self.keys = self.store_conn.keys


async def delete_namespace(url: str, namespace: str) -> None:
    """Delete every key of ``namespace`` (the transport's, which the test fixtures do not
    know about)."""
    async with aioredis.Redis.from_url(url) as client:
        keys = [key async for key in client.scan_iter(match="{" + namespace + "}:*")]
        if keys:
            await client.delete(*keys)
