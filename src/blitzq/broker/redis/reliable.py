"""Reliable mode: the streams transport with the Redis state store (at-least-once).

See ``streams.py`` for the delivery (consumer groups, leases, recovery) and ``store.py`` for
the state; ``complete.lua`` acks a stream entry in the same script as the completion's
writes, fenced by its lease (the transport's lease identity, handed to the store when it is
made: ``common.fused_broker``).
"""

from __future__ import annotations

from typing import Any

from ..facade import Broker
from .client import bad_url, make_client
from .cluster import is_cluster, split_layout
from .common import RedisBroker, fused_broker
from .connection import RedisConnection

__all__ = ["ReliableRedisBroker", "reliable_broker"]


def ReliableRedisBroker(url: str, namespace: str, **settings: Any) -> Broker:
    """The at-least-once broker on Redis Streams: :func:`~.common.RedisBroker` in mode
    ``"reliable"`` (see it for ``settings`` and the errors raised)."""
    return RedisBroker(url, namespace, mode="reliable", **settings)


def reliable_broker(url: str, namespace: str, **settings: Any) -> Broker:
    """Reliable mode's broker for ``url``: the spread layout on a Redis Cluster (or with
    ``?layout=spread``), the one-slot fused streams broker
    (:func:`ReliableRedisBroker`) on a single server (or with ``?layout=slot``).
    One client is made, and the broker owns it.

    Args:
        url: a broker URL (``client.make_client``); its ``layout`` option chooses.
        namespace: the namespace.
        settings: the dead-letter settings of :func:`~.spread.SpreadRedisBroker`.

    Raises:
        ConfigurationError: a bad option in ``url`` (``layout`` among them).
    """
    try:
        layout = split_layout(url)[1]
        client = make_client(url) if layout != "slot" else None
    except ValueError as exc:
        raise bad_url(url, exc) from None
    if client is None:
        return ReliableRedisBroker(url, namespace, **settings)
    spread = layout == "spread" or is_cluster(client)
    conn = RedisConnection(url, namespace, client=client, kind="l" if spread else "s", **settings)
    conn.owns_client = True
    if not spread:
        return fused_broker(conn)
    from .spread import spread_broker  # only on that layout (issue 29: an idle worker's memory)

    return spread_broker(conn)
