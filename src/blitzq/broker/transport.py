"""The transport seam: how messages travel from producers to workers and are leased.

A transport moves opaque ``bytes``: publish to a queue, fetch (one queue or several by
priority), and -- where it has leases -- renew them (heartbeat), take back deliveries whose
lease lapsed (recover) and tidy consumers. That is what Redis Streams (consumer groups, XACK,
XAUTOCLAIM), Redis lists (LPOP, no leases) and RabbitMQ (basic.publish/consume, unacked
redelivery) each do natively. Everything else -- records, results, the schedule, dead letters,
workflow/unique/lock/rate/progress state and the atomic completion -- is the other seam,
:class:`~blitzq.broker.state.StateStore`.

The Redis brokers implement both seams on one server (so a completion acks and writes state in
one script). A RabbitMQ transport pairs with the Redis state store: the facade
:class:`~blitzq.broker.Broker` then applies a completion's state effects in the store and acks
the delivery on the transport. Every method is a coroutine that raises
:class:`~blitzq.exceptions.BrokerError` when the server cannot be reached.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from typing import NamedTuple


class Guarantee(enum.StrEnum):
    """What a broker promises about delivery."""

    AT_LEAST_ONCE = "at-least-once"
    """Every published message is run to completion at least once, across worker crashes."""
    AT_MOST_ONCE = "at-most-once"
    """A message taken by a worker that then crashes is lost; never delivered twice."""
    EPHEMERAL = "ephemeral"
    """Messages live in one process's memory and vanish with it."""


class Delivery(NamedTuple):
    """One message handed to a worker by :meth:`Transport.fetch`.

    Attributes:
        queue: physical queue name.
        token: transport-specific delivery token needed to ack (a stream entry id, a
            RabbitMQ delivery tag), or ``None`` when nothing is acked (a list).
        payload: the encoded message.
        deliveries: how many times this message has been delivered, this one included.
    """

    queue: str
    token: bytes | None
    payload: bytes
    deliveries: int


class Transport(abc.ABC):
    """Delivery of messages: publish, fetch, leases. See the module docstring."""

    guarantee: Guarantee
    supports_recovery: bool = False
    """Whether abandoned deliveries can be recovered (leases, heartbeat, recover)."""

    @abc.abstractmethod
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """Append encoded messages to the tail of ``queue`` in one round-trip."""

    @abc.abstractmethod
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Create whatever a consumer named ``consumer`` needs to fetch from ``queues``
        (a consumer group, a queue declaration) and remember the queues (see
        :meth:`~blitzq.broker.state.StateStore.remember_queues`)."""

    @abc.abstractmethod
    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """Take up to ``count`` messages from ``queue``.

        Returns at once when messages are waiting; otherwise blocks up to ``timeout`` seconds
        (0 = do not block) for the first one.
        """

    @abc.abstractmethod
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float
    ) -> list[Delivery]:
        """Take up to ``count`` messages from ``queues`` in the order given (priority levels).

        Earlier queues are drained first. When all are empty, blocks up to ``timeout`` seconds
        on all of them at once (0 = do not block) and returns what arrives first (a few
        messages at most, possibly from more than one queue).
        """

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Renew the leases of deliveries this consumer still owns; return how many it renewed.

        A lease another consumer has taken over is never taken back. Without leases: 0.
        """
        return 0

    async def recover(
        self, queue: str, min_idle: float, count: int, max_deliveries: int, record_ttl: int = 86400
    ) -> tuple[int, int]:
        """Put deliveries idle longer than ``min_idle`` seconds back on ``queue``.

        Those delivered ``max_deliveries`` times already are dead-lettered instead, with a
        record (state ``dead_lettered``) kept ``record_ttl`` seconds.

        Returns:
            ``(requeued, dead_lettered)`` counts; ``(0, 0)`` without leases.
        """
        return (0, 0)

    async def prune_consumers(self, queue: str, idle: float) -> int:
        """Forget consumers of ``queue`` idle over ``idle`` seconds that hold nothing (so a
        consumer group does not grow by one per worker process ever started).

        Returns:
            How many were removed; 0 for a transport with nothing to prune (the default).
        """
        return 0

    @abc.abstractmethod
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per queue: ``{"waiting": n, "in_flight": n}`` (in_flight is 0 without leases)."""

    @abc.abstractmethod
    async def purge_queue(self, queue: str) -> int:
        """Delete waiting messages of ``queue``; return how many."""

    async def ping(self) -> None:
        """Check that the server answers; raise BrokerError otherwise."""
        return

    async def close(self) -> None:
        """Release connections. The transport may be used again afterwards (it reconnects)."""
        return
