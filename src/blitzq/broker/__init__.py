"""Brokers: the only layer that talks to Redis (a transport and a state store behind one facade).

Two seams: :class:`~blitzq.broker.transport.Transport` (publish, fetch, leases) and
:class:`~blitzq.broker.state.StateStore` (records, schedule, dead letters, feature state and
the atomic completion, whose effects are the typed values of :mod:`blitzq.broker.effects`).
:class:`Broker` (``facade.py``) is the one object the rest of blitzq calls: one transport and
one state store, composed (``Broker(transport, state)``) and delegated to explicitly, never
subclassed (the named brokers are factory functions returning one); for a
store that does not ack its transport, :mod:`blitzq.broker.outbox` (``Outbox``, ``Relay``)
carries what the store writes into queues to the transport.
"""

from __future__ import annotations

from .facade import Broker
from .outbox import Outbox, Relay
from .state import Completion, DeadLetterFields, Scheduled, StateStore
from .transport import Delivery, Guarantee, Transport

__all__ = [
    "Broker",
    "Completion",
    "DeadLetterFields",
    "Delivery",
    "Guarantee",
    "Outbox",
    "Relay",
    "Scheduled",
    "StateStore",
    "Transport",
]
