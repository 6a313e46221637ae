"""Publishing on the RabbitMQ transport: a batch of messages to one queue, confirmed.

:func:`publish_confirmed` publishes the messages persistent and ``mandatory`` on the link's
publisher-confirm channel, :data:`PUBLISH_WINDOW` at a time in flight
(:func:`.batches.publish_batch`), and returns once RabbitMQ confirmed every one. A message
returned because its queue is gone (deleted meanwhile) is published again after the queue is
declared again, and one RabbitMQ nacked (it did not take it) once more after
:data:`NACK_PAUSE`; a second ``basic.nack``, a return of another kind, a lost channel or no
confirm in :data:`CONFIRM_TIMEOUT` seconds raises :class:`~blitzq.exceptions.BrokerError`: a
publish is never lost silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import aiormq

from ...exceptions import BrokerError
from .batches import nacked, publish_batch, returned
from .channels import DELIVERIES, FAILURES, AmqpLink, unconfirmed

__all__ = ["BACKSTOPS", "CONFIRM_TIMEOUT", "PUBLISH_WINDOW", "marked", "publish_confirmed"]

logger = logging.getLogger("blitzq.broker.amqp")

#: Seconds a published message may wait for RabbitMQ's confirm (then the publish fails).
CONFIRM_TIMEOUT = 30.0
#: Messages of one publish in flight at once (awaiting their confirms).
PUBLISH_WINDOW = 1000
#: Seconds before the messages RabbitMQ nacked are published once more (a nack means it
#: did not take them: a quorum queue declared again after a deletion has no leader for a
#: moment); a second nack fails the publish.
NACK_PAUSE = 0.2
#: Header carrying how many times RabbitMQ's ``x-delivery-limit`` dead-lettered a task
#: and the dead-letter drain published it again (``custody.py``).
BACKSTOPS = "x-blitzq-backstops"


def marked(deliveries: int, backstops: int = 0) -> dict[str, Any] | None:
    """The AMQP headers of a message published again: delivered ``deliveries`` times before
    (:data:`.channels.DELIVERIES`), and dead-lettered ``backstops`` times by RabbitMQ's
    delivery limit (:data:`BACKSTOPS`); ``None`` when both are 0."""
    headers = {DELIVERIES: deliveries} if deliveries else {}
    if backstops:
        headers[BACKSTOPS] = backstops
    return headers or None


async def publish_confirmed(
    link: AmqpLink, queue: str, messages: Sequence[bytes], headers: dict[str, Any] | None
) -> None:
    """Publish ``messages`` (bodies) to the physical queue ``queue`` with the AMQP
    ``headers`` (``None``: none), and wait for RabbitMQ's confirms.

    Args:
        link: the transport's connection (declares the queue, gives the publisher channel).
        queue: physical queue (its RabbitMQ queue is ``link.name(queue)``).
        messages: the message bodies, published in this order.
        headers: AMQP headers of every message.

    Raises:
        BrokerError: a message was not confirmed (nacked, returned, channel lost, or no
            confirm in :data:`CONFIRM_TIMEOUT` s; then its outcome is unknown, as it says).
        ConfigurationError: the queue exists with other arguments.
    """
    if not messages:
        return
    await link.declare(queue)
    channel = await link.publisher()
    name = link.name(queue)
    try:
        raw = await channel.get_underlay_channel()
        for start in range(0, len(messages), PUBLISH_WINDOW):
            window = messages[start : start + PUBLISH_WINDOW]
            results = await publish_batch(raw, name, window, headers, CONFIRM_TIMEOUT)
            back = [body for body, r in zip(window, results, strict=True) if returned(r)]
            if back:  # the queue was deleted: declare it again, publish those again
                logger.warning("queue %s is gone; declaring it again", name)
                link.forget(queue)
                await link.declare(queue)
                results = [r for r in results if not returned(r)]
                results += await publish_batch(raw, name, back, headers, CONFIRM_TIMEOUT)
            again = [body for body, r in zip(window, results, strict=True) if nacked(r)]
            if again and not back:  # nacked: once more, after a pause
                logger.warning(
                    "RabbitMQ nacked %d message(s) to %s; publishing them once more",
                    len(again),
                    name,
                )
                await asyncio.sleep(NACK_PAUSE)
                results = [r for r in results if not nacked(r)]
                results += await publish_batch(raw, name, again, headers, CONFIRM_TIMEOUT)
            for result in results:
                if isinstance(result, BaseException):
                    raise unconfirmed(result, f"publishing to {name!r}") from None
                if not isinstance(result, aiormq.spec.Basic.Ack):  # returned: not routed
                    raise BrokerError(f"RabbitMQ did not queue a message to {name!r}: {result}")
    except FAILURES as exc:
        if isinstance(exc, BrokerError):
            raise
        raise unconfirmed(exc, f"publishing to {name!r}") from None
