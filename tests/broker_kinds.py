"""Which composition a broker is: the named brokers are factory functions returning one
:class:`~blitzq.broker.Broker` class, so tests tell them apart by their parts."""

from __future__ import annotations

from typing import Any

from blitzq.broker import Broker
from blitzq.broker.pairing import Fused
from blitzq.broker.redis.spread import SpreadStreamsTransport
from blitzq.broker.redis.streams import StreamsTransport


def is_amqp(broker: Any) -> bool:
    """Whether ``broker`` is an ``AmqpBroker`` (RabbitMQ transport, Redis state store)."""
    from blitzq.broker.amqp import AmqpTransport

    return isinstance(broker, Broker) and isinstance(broker.transport, AmqpTransport)


def is_spread(broker: Any) -> bool:
    """Whether ``broker`` is a ``SpreadRedisBroker`` (reliable mode, spread layout)."""
    return isinstance(broker, Broker) and isinstance(broker.transport, SpreadStreamsTransport)


def is_reliable_redis(broker: Any) -> bool:
    """Whether ``broker`` is a ``ReliableRedisBroker``: streams and the store fused on one
    connection (one slot)."""
    return (
        isinstance(broker, Broker)
        and isinstance(broker.pairing, Fused)
        and isinstance(broker.transport, StreamsTransport)
    )
