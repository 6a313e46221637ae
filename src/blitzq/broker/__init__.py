"""Brokers: the only layer that talks to Redis (a transport and a state store behind one facade).

Two seams: :class:`~blitzq.broker.transport.Transport` (publish, fetch, leases) and
:class:`~blitzq.broker.state.StateStore` (records, schedule, dead letters, feature state and
the atomic completion, whose effects are the typed values of :mod:`blitzq.broker.ops`).
:class:`Broker` is the one object the rest of blitzq calls: both seams together.
"""

from __future__ import annotations

import abc

from .state import Completion, DeadLetterFields, Scheduled, StateStore
from .transport import Delivery, Guarantee, Transport


class Broker(Transport, StateStore, abc.ABC):
    """What the queue, workers, scheduler and CLI call: a transport and a state store.

    The Redis brokers are both on one server (:mod:`blitzq.broker.redis`). A backend that
    delivers elsewhere (RabbitMQ) implements :class:`Transport` and composes the Redis
    :class:`StateStore`: its :meth:`~StateStore.complete` applies the state effects in the
    store, fenced by the lease the transport reports, then acks on the transport. Each backend
    passes the shared contract suite in ``tests/contract/`` unchanged.
    """


__all__ = [
    "Broker",
    "Completion",
    "DeadLetterFields",
    "Delivery",
    "Guarantee",
    "Scheduled",
    "StateStore",
    "Transport",
]
