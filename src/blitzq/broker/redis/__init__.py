"""Redis / Valkey brokers: reliable (streams) and fast (lists), plus the embedded server.

Each broker is a :class:`~blitzq.broker.Broker` of a Redis transport (:class:`StreamsTransport`
or :class:`ListsTransport`) and the :class:`RedisStateStore`, sharing one
:class:`RedisConnection`, made by the factory functions :func:`ReliableRedisBroker`,
:func:`FastRedisBroker` and :func:`RedisBroker`; a transport of another backend pairs with
the same store (made with its outbox).
"""

from .common import RedisBroker
from .connection import RedisConnection
from .fast import FastRedisBroker
from .lists import ListsTransport
from .reliable import ReliableRedisBroker
from .store import RedisStateStore
from .streams import StreamsTransport

__all__ = [
    "FastRedisBroker",
    "ListsTransport",
    "RedisBroker",
    "RedisConnection",
    "RedisStateStore",
    "ReliableRedisBroker",
    "StreamsTransport",
]
