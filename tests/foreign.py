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
from blitzq.broker.redis.connection import RedisConnection, RedisDeadLetterLimits
from blitzq.broker.redis.store import RedisStateStore
from blitzq.broker.redis.streams import StreamsTransport

#: Suffix of the transport's namespace (the store's namespace + this).
TRANSPORT_SUFFIX = "-transport"


def ForeignPairing(url: str, namespace: str, **settings: Any) -> Broker:
    """``Broker(StreamsTransport on <namespace>-transport, RedisStateStore on <namespace>)``.

    The store is made with its outbox (it does not ack the transport's deliveries); the
    dead-letter settings the contract suite sets on ``broker.dead_letter_limits`` go to the
    store's connection (``broker.state.conn``). A store with an outbox records a dead
    letter's origin as ``"s"`` (``DeadLetter.mode`` "reliable": the transports an outbox
    serves are at-least-once), as for any foreign pairing.

    Args:
        url: the Redis URL of both halves.
        namespace: the store's namespace; the transport's is ``namespace + TRANSPORT_SUFFIX``.
    """
    store_conn = RedisConnection(url, namespace, kind="l", **settings)
    transport_conn = RedisConnection(url, namespace + TRANSPORT_SUFFIX, kind="s")
    return Broker(
        StreamsTransport(transport_conn),
        RedisStateStore(store_conn, outbox=True),
        dead_letter_limits=RedisDeadLetterLimits(store_conn),
    )


async def delete_namespace(url: str, namespace: str) -> None:
    """Delete every key of ``namespace`` (the transport's, which the test fixtures do not
    know about)."""
    async with aioredis.Redis.from_url(url) as client:
        keys = [key async for key in client.scan_iter(match="{" + namespace + "}:*")]
        if keys:
            await client.delete(*keys)
