"""Reliable mode: the streams transport with the Redis state store (at-least-once).

See ``streams.py`` for the delivery (consumer groups, leases, recovery) and ``store.py`` for
the state; ``complete.lua`` acks a stream entry in the same script as the completion's
writes, fenced by its lease (the transport's lease identity, handed to the store when it is
made: ``common.fused_broker``).
"""

from __future__ import annotations

from typing import Any

from ..facade import Broker
from .common import RedisBroker

__all__ = ["ReliableRedisBroker"]


def ReliableRedisBroker(url: str, namespace: str, **settings: Any) -> Broker:
    """The at-least-once broker on Redis Streams: :func:`~.common.RedisBroker` in mode
    ``"reliable"`` (see it for ``settings`` and the errors raised)."""
    return RedisBroker(url, namespace, mode="reliable", **settings)
