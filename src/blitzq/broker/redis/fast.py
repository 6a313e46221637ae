"""Fast mode: the lists transport with the Redis state store (at-most-once).

See ``lists.py`` for the delivery (a popped message is gone from Redis: no ack, no lease,
no recovery) and ``store.py`` for the state (retries, results and dead letters work as in
reliable mode).
"""

from __future__ import annotations

from typing import Any

from ..facade import Broker
from .common import RedisBroker

__all__ = ["FastRedisBroker"]


def FastRedisBroker(url: str, namespace: str, **settings: Any) -> Broker:
    """The at-most-once broker on Redis lists: :func:`~.common.RedisBroker` in mode
    ``"fast"`` (see it for ``settings`` and the errors raised)."""
    return RedisBroker(url, namespace, mode="fast", **settings)
