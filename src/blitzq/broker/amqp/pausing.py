"""A paused queue on RabbitMQ: its consumer cancelled, what it received handed back.

RabbitMQ pushes each consumer up to its prefetch of messages ahead of any fetch; they wait in
the consumer's buffer (``deliveries.py``), unacked, and no other consumer can have them. A
worker whose queue is paused (``blitzq queue pause``) fetches nothing from it, so without
more they would stay there for the whole pause: ``queue stats`` would count them nowhere as
waiting, and no other worker could take them.

:func:`stop_consuming` is what a pause (:meth:`~.transport.AmqpTransport.pause`) and the
transport's close do with a queue's consumer: ``basic.cancel`` (RabbitMQ pushes nothing
more; the deliveries it dispatched before the ``cancel-ok`` were read first, into the
buffer), then :func:`hand_back` of the whole buffer. The channel stays open, so the
deliveries already fetched (tasks still running) are acked on it as usual, and a resume
consumes on it again (:meth:`~.transport.AmqpTransport._consumer`). :func:`hand_back`
publishes each message again, confirmed and marked with its deliveries so far, then acks it:
a ``basic.nack`` with requeue, or the channel closing with them, would spend a delivery of
each on a quorum queue (``x-delivery-count``). The state store's custody hands back a busy
worker's stale prefetch the same way (``custody.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from .channels import DELIVERIES, FAILURES, header_int, settle, translate
from .deliveries import Consumer, Received

__all__ = ["Republishing", "hand_back", "stop_consuming"]


class Republishing(Protocol):
    """What handing back needs of the transport (:class:`~.transport.AmqpTransport`)."""

    async def publish_with(self, queue: str, messages: Sequence[bytes], deliveries: int) -> None:
        """Publish ``messages`` on ``queue`` as delivered ``deliveries`` times before."""


async def hand_back(transport: Republishing, queue: str, messages: Sequence[Received]) -> None:
    """Put ``messages`` (received from ``queue``'s consumer, never fetched) back on
    ``queue``: each published again (confirmed), with the deliveries it had, then acked.

    Args:
        transport: publishes them (:meth:`~.transport.AmqpTransport.publish_with`).
        queue: their physical queue.
        messages: the messages, in the order they were received.

    Raises:
        BrokerError: a publish was not confirmed (that message and those after it stay
            unacked on their channel: RabbitMQ redelivers them when it closes).
    """
    for message in messages:
        before = header_int(message.headers, "x-delivery-count")
        before += header_int(message.headers, DELIVERIES)
        await transport.publish_with(queue, [message.body], before)
        await settle(message, True)


async def stop_consuming(transport: Republishing, queue: str, consumer: Consumer) -> int:
    """Cancel ``consumer`` (once: a stopped one is not cancelled again) and hand back what it
    received that no fetch took; return how many. A consumer whose channel is gone holds
    nothing (RabbitMQ put its messages back): its buffer is dropped.

    Raises:
        BrokerError: RabbitMQ refused the cancel or a publish, or could not be reached.
    """
    if not consumer.open:
        consumer.buffer.clear()
        return 0
    if not consumer.stopped:
        consumer.stopped = True
        try:
            await consumer.raw.basic_cancel(consumer.tag)
        except FAILURES as exc:
            raise translate(exc, f"cancelling the consumer of {consumer.name!r}") from None
        for _ in range(3):  # the callbacks of the frames read before the cancel-ok
            await asyncio.sleep(0)
    buffered = list(consumer.buffer)
    consumer.buffer.clear()
    for message in buffered:
        consumer.arrived.pop(message.tag, None)
    await hand_back(transport, queue, buffered)
    if buffered:  # a round trip: the acks (sent unanswered) are applied before a close
        try:
            await consumer.confirm()
        except FAILURES as exc:
            raise translate(exc, f"handing back the messages of {consumer.name!r}") from None
    return len(buffered)
