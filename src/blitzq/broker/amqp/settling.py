"""Settling the RabbitMQ transport's deliveries: the completion's ack and the hand-back.

:func:`ack_held` acks what a worker completed: ``basic.ack`` of the held deliveries,
batched per consumer channel (``multiple=True``, see ``deliveries.py``; the message of a
pack, ``packs.py``, once its last task is acked or handed back), or, for a delivery
in the state store's custody (``custody.py``), the release of its entry. :func:`nack_held`
hands deliveries back unfinished: each is published again (confirmed), marked with its
deliveries so far minus one, then acked -- so a hand-back does not spend the delivery budget
as ``basic.nack`` on a quorum queue would. A crash in between leaves both copies
(at-least-once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from .channels import AmqpLink, settle
from .deliveries import Consumer, Held

if TYPE_CHECKING:
    from .custody import Custody

__all__ = ["Settling", "ack_held", "nack_held"]


class Settling(Protocol):
    """What settling reads and calls of the transport (:class:`~.transport.AmqpTransport`)."""

    link: AmqpLink
    held: dict[bytes, Held]
    custody: Custody | None

    async def publish_with(self, queue: str, messages: Sequence[bytes], deliveries: int) -> None:
        """Publish ``messages`` on ``queue`` as delivered ``deliveries`` times before."""


async def ack_held(transport: Settling, queue: str, tokens: Sequence[bytes]) -> None:
    """Ack the deliveries ``tokens`` of ``queue`` (see the module docstring); tokens no longer
    held are ignored. A delivery being handed to custody is marked ``"done"`` (the hand-over
    releases it when it is through).

    Raises:
        BrokerError: Redis could not be reached to release a custody entry.
    """
    released: list[bytes] = []
    by_consumer: dict[int, tuple[Consumer, list[int]]] = {}
    held_map, epoch = transport.held, transport.link.epoch
    for token in tokens:
        held = held_map.pop(token, None)
        if held is None:
            continue
        state = held.state
        if state == "held":
            message = held.message
            if held.epoch == epoch and (message.pack is None or message.pack.settled()):
                # else RabbitMQ put it back already, or other tasks of its pack are not done
                entry = by_consumer.get(id(message.consumer))
                if entry is None:
                    entry = by_consumer[id(message.consumer)] = (message.consumer, [])
                entry[1].append(message.tag)
        elif state == "handing":
            held.state = "done"  # the hand-over releases it when it is through
        elif state == "custody":
            released.append(token)
    for consumer, tags in by_consumer.values():
        await consumer.settle(tags)
    if released and transport.custody is not None:
        await transport.custody.release(queue, released)


async def nack_held(transport: Settling, queue: str, tokens: Sequence[bytes]) -> None:
    """Hand the deliveries ``tokens`` of ``queue`` back unfinished (see the module
    docstring); tokens no longer held, or being handed to custody, are skipped.

    Raises:
        BrokerError: a publish was not confirmed, or Redis could not be reached to release a
            custody entry.
    """
    for token in tokens:
        held = transport.held.get(token)
        if held is None or held.state in ("handing", "done"):
            continue
        await transport.publish_with(queue, [held.message.body], held.deliveries - 1)
        del transport.held[token]
        if held.state == "custody":
            if transport.custody is not None:
                await transport.custody.release(queue, [token])
        elif held.epoch == transport.link.epoch:
            await settle(held.message, True)
