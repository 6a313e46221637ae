"""What the RabbitMQ transport holds in memory: its deliveries and its consumers.

:class:`Held` is one delivery received and not yet acked (or in the state store's custody,
``custody.py``); :class:`Consumer` is one queue's consumer, its channel and the buffer of
messages RabbitMQ pushed to it that no fetch has taken yet.
"""

from __future__ import annotations

import asyncio
import collections
import time

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue


class Held:
    """A delivery this process holds: received, not yet acked.

    Attributes:
        queue: physical queue.
        message: the aio-pika message (acked through its own channel).
        since: ``time.monotonic()`` when it was received.
        beat: ``time.monotonic()`` of its last heartbeat (or its receipt).
        deliveries: its delivery count (:attr:`Delivery.deliveries`).
        epoch: the connection it came on (:attr:`.channels.AmqpLink.epoch`): once that
            connection is gone RabbitMQ has put the message back, and it is no longer held.
        state: ``"held"`` (unacked on RabbitMQ), ``"handing"`` (being handed to custody),
            ``"custody"`` (acked on RabbitMQ, kept by the state store) or ``"done"`` (acked
            while it was being handed over).
    """

    __slots__ = ("beat", "deliveries", "epoch", "message", "queue", "since", "state")

    def __init__(
        self, queue: str, message: AbstractIncomingMessage, deliveries: int, epoch: int
    ) -> None:
        self.queue = queue
        self.epoch = epoch
        self.message = message
        self.since = self.beat = time.monotonic()
        self.deliveries = deliveries
        self.state = "held"


class Consumer:
    """One queue's consumer: its channel, tag and buffer of received messages (with when
    each arrived, by delivery tag)."""

    __slots__ = ("amqp_queue", "arrived", "buffer", "channel", "epoch", "tag")

    def __init__(self, channel: AbstractChannel, amqp_queue: AbstractQueue, epoch: int) -> None:
        self.channel = channel
        self.amqp_queue = amqp_queue
        self.epoch = epoch
        self.tag = ""
        self.buffer: collections.deque[AbstractIncomingMessage] = collections.deque()
        self.arrived: dict[int, float] = {}

    def stale(self, age: float) -> list[AbstractIncomingMessage]:
        """Remove and return the buffered messages that arrived over ``age`` seconds ago
        (no fetch took them: the worker's slots are all busy)."""
        now = time.monotonic()
        arrived = self.arrived
        old = [m for m in self.buffer if now - arrived.setdefault(by_tag(m), now) > age]
        if old:
            keep = [m for m in self.buffer if now - arrived[by_tag(m)] <= age]
            self.buffer.clear()
            self.buffer.extend(keep)
            for m in old:
                arrived.pop(by_tag(m), None)
        return old

    async def take(self, room: int, top_up: bool) -> list[AbstractIncomingMessage]:
        """Up to ``room`` messages in queue order: the buffer's, then (``top_up``) what a
        ``basic.get`` brings and flushes into the buffer, repeated while it finds messages
        and ``room`` is not filled.

        Deliveries and gets of one channel share its delivery-tag sequence, and what RabbitMQ
        dispatched to the consumer before it answered a get arrives first: sorting by tag
        after the gets (and a loop turn for the consumer's callbacks) keeps FIFO order; what
        does not fit goes back to the front of the buffer.

        Raises:
            aiormq.exceptions.AMQPError: the get failed (the caller translates it).
        """
        buffer = self.buffer
        taken: list[AbstractIncomingMessage] = []
        while buffer and len(taken) < room:
            taken.append(buffer.popleft())
        if top_up and len(taken) < room:
            got: list[AbstractIncomingMessage] = []
            while True:  # usually one get: it flushes what was dispatched to the consumer
                message = await self.amqp_queue.get(no_ack=False, fail=False)
                for _ in range(3):  # the consumer's callbacks of frames read before the answer
                    await asyncio.sleep(0)
                if message is None:
                    break
                got.append(message)
                if len(taken) + len(got) + len(buffer) >= room:
                    break
            got += buffer
            buffer.clear()
            got.sort(key=by_tag)
            free = room - len(taken)
            taken += got[:free]
            buffer.extend(got[free:])
        for message in taken:
            self.arrived.pop(by_tag(message), None)
        return taken


def by_tag(message: AbstractIncomingMessage) -> int:
    """Sort key of the messages of one channel: their delivery tag (the order RabbitMQ
    delivered them in, gets and consumer deliveries alike)."""
    return message.delivery_tag or 0
