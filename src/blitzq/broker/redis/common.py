"""The Redis brokers: a Redis transport and the Redis state store on one connection.

:func:`fused_broker` composes the mode's transport on a :class:`~.connection.RedisConnection`
(``streams.py`` for kind ``"s"``, ``lists.py`` for ``"l"``) with the
:class:`~.store.RedisStateStore` on the same connection, handed the transport's lease
identity, in the facade :class:`~blitzq.broker.Broker` with the ``Fused`` pairing;
:func:`RedisBroker` makes the connection first. ``reliable.py`` and ``fast.py`` name the two
modes. The same composition by hand::

    conn = RedisConnection(url, namespace, kind="s")
    transport = StreamsTransport(conn)
    state = RedisStateStore(conn, lease=transport.lease)
    broker = Broker(transport, state, dead_letter_limits=RedisDeadLetterLimits(conn))
"""

from __future__ import annotations

from typing import Literal

import redis.asyncio as aioredis

from ...exceptions import ConfigurationError
from ...limits import DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from ..facade import Broker
from ..pairing import Fused
from ..transport import Transport
from .carrying import carrier_for
from .connection import DEFAULT_DEAD_LETTER_CAP, RedisConnection, RedisDeadLetterLimits
from .lists import ListsTransport
from .store import RedisStateStore
from .streams import StreamsTransport

__all__ = ["DEFAULT_DEAD_LETTER_CAP", "RedisBroker", "fused_broker"]


def fused_broker(conn: RedisConnection) -> Broker:
    """The Redis transport of ``conn``'s kind and the Redis state store on ``conn``, fused
    (``complete.lua`` acks and fences the transport's deliveries with the writes).

    Args:
        conn: the connection both halves share (kind ``"s"``: streams, ``"l"``: lists).

    Returns:
        ``Broker(transport, RedisStateStore(conn, lease=...), Fused(...))`` with the
        connection's dead-letter bounds as its ``dead_letter_limits``; with streams, the
        lists on a kind-``"l"`` view of ``conn`` as its fast lane
        (:meth:`~blitzq.broker.Broker.add_fast_lane`: tasks declared ``mode="fast"``).
    """
    transport: Transport
    if conn.kind == "s":
        streams = StreamsTransport(conn)
        transport, state = streams, RedisStateStore(conn, lease=streams.lease)
    else:
        transport, state = ListsTransport(conn), RedisStateStore(conn)
    broker = Broker(transport, state, Fused(state), dead_letter_limits=RedisDeadLetterLimits(conn))
    if conn.kind == "s":  # the lists as the fast lane of tasks declared mode="fast"
        broker.add_fast_lane(ListsTransport(conn.with_kind("l")))
    else:  # completions carried by the pops (carrying.py), where one connection can
        carrier = carrier_for(transport, state)
        broker.carry = carrier.fetch_first if carrier is not None else None
    return broker


def RedisBroker(
    url: str,
    namespace: str,
    *,
    mode: Literal["reliable", "fast"] = "reliable",
    dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
    client: aioredis.Redis | None = None,
    dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
    dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
    listener_client: aioredis.Redis | None = None,
) -> Broker:
    """A Redis transport and the Redis state store sharing one new connection
    (:func:`fused_broker`).

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        namespace: key namespace; every key is prefixed ``{namespace}:``.
        mode: ``"reliable"`` (streams, at-least-once) or ``"fast"`` (lists, at-most-once).
        dead_letter_cap: dead letters kept before the oldest are dropped.
        client: an existing ``redis.asyncio.Redis`` to use instead of ``url`` (not closed by
            the broker).
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept before the oldest are
            dropped.
        listener_client: a client of the result listener's own (see
            :class:`~.connection.RedisConnection`), closed by the broker.

    Returns:
        A :class:`~blitzq.broker.Broker`; its ``state.conn`` is the shared connection.

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value, or an
            unknown ``mode``.
    """
    if mode not in ("reliable", "fast"):
        raise ConfigurationError(f"mode must be 'reliable' or 'fast', not {mode!r}")
    conn = RedisConnection(
        url,
        namespace,
        dead_letter_cap=dead_letter_cap,
        client=client,
        dead_letter_ttl=dead_letter_ttl,
        dead_letter_max_bytes=dead_letter_max_bytes,
        kind="s" if mode == "reliable" else "l",
        listener_client=listener_client,
    )
    return fused_broker(conn)
