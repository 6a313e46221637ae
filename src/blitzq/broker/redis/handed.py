"""Handing a stream delivery to one other consumer: rolling deploys (``worker/unknown.py``).

A worker that does not know a message's task hands the delivery, still leased, to a live
worker that knows it (``hand_over.lua``: the entry moves to that consumer's pending list and
its handed set ``{ns}:handed:<queue>:<consumer>``, and the consumer is woken on the event
channel); that worker takes what it was handed (``take_handed.lua``) and runs it. A part of
:class:`~.streams.StreamsTransport`.
"""

from __future__ import annotations

from ..transport import Delivery
from .client import translate_errors
from .connection import LeaseIdentity, RedisPart
from .entries import entry_delivery
from .keys import GROUP


class HandOver(RedisPart):
    """The streams transport's hand-over of deliveries between consumers of its group."""

    lease: LeaseIdentity

    @property
    def consumer(self) -> str:
        """This process's consumer name in the groups (the transport's :attr:`lease`)."""
        return self.lease.consumer

    @translate_errors
    async def hand_over(self, queue: str, token: bytes, consumer: str, ttl: float) -> bool:
        """Move the entry to ``consumer``'s pending list and handed set, and wake it on the
        event channel (``hand_over.lua``, ownership-checked); see
        :meth:`~blitzq.broker.transport.Transport.hand_over`."""
        done = await self.scripts.call(
            "hand_over",
            keys=[self.keys.stream(queue), self.keys.handed(queue, consumer)],
            args=[GROUP, self.consumer, consumer, token, max(1, int(ttl)), self.keys.prefix],
        )
        return bool(done)

    @translate_errors
    async def take_handed(self, queue: str, count: int) -> list[Delivery]:
        """The entries handed to this consumer, their leases renewed (``take_handed.lua``);
        see :meth:`~blitzq.broker.transport.Transport.take_handed`."""
        if not self.consumer:
            return []
        rows = await self.scripts.call(
            "take_handed",
            keys=[self.keys.stream(queue), self.keys.handed(queue, self.consumer)],
            args=[GROUP, self.consumer, count],
        )
        return [entry_delivery(queue, rows[j], rows[j + 1]) for j in range(0, len(rows), 2)]
