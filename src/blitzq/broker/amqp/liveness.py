"""Whether another process's RabbitMQ connection is still open, for the queue counts
(``inspection.py``).

**Why.** A worker's registration carries what its transport holds unacked (``in_flight``),
and lives until it lapses (30 s or more) when the worker dies without unregistering. RabbitMQ
puts a dead connection's unacked messages back at once (the kernel closes a killed process's
socket; a frozen one is closed after two to three missed heartbeats), so counting them until
the registration lapses would count them twice: ready again, and still in flight.

**How.** Each transport that consumes declares a *mark* on its connection (:class:`Mark`): a
server-named (``amq.gen-…``), exclusive queue, which RabbitMQ deletes the moment that
connection closes -- the same moment it requeues the connection's unacked messages -- and
which keeps no message (``x-max-length: 0``). The transport writes the mark's name into its
registration's ``in_flight`` (``alive``), and :func:`open_marks` checks the marks of the
registrations that hold something by publishing an empty message to each, ``mandatory`` with
publisher confirms: a mark that is gone returns it (``NO_ROUTE``), one that lives takes it
and drops it at once. Nothing is refused, so no channel closes and RabbitMQ logs no error (a
passive declaration of another connection's exclusive queue is refused ``RESOURCE_LOCKED``
even while it lives). A mark costs RabbitMQ one empty classic queue per consuming
connection; a check costs one confirmed publish, the checks of one count sent at once on a
channel of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import aiormq

from ...exceptions import BrokerError
from .channels import FAILURES, AmqpLink, translate
from .closing import describe

__all__ = ["Mark", "open_marks"]

logger = logging.getLogger("blitzq.broker.amqp")

#: Arguments of a mark: it keeps no message (a check's message is dropped as it arrives).
_KEEP_NONE: dict[str, Any] = {"x-max-length": 0}
#: Seconds the checks of one count may take (then the count fails).
TIMEOUT = 10.0


class Mark:
    """This transport's mark on its current connection (module docstring): made on the
    first consumer of each connection, gone with the connection."""

    __slots__ = ("epoch", "name", "refused")

    def __init__(self) -> None:
        self.name = ""
        self.epoch = 0
        self.refused = False  # a declaration was refused (logged once)

    def current(self, epoch: int) -> str:
        """The mark's queue name on the connection of ``epoch``; ``""`` when it has none."""
        return self.name if self.epoch == epoch else ""

    async def ensure(self, link: AmqpLink) -> None:
        """Declare the mark on ``link``'s current connection unless it has one (tried once
        per connection), on a channel of its own: a refusal (a user whose permissions do
        not cover server-named queues) closes only that channel and is logged once; the
        worker's deliveries then count until its registration lapses, as without marks."""
        epoch = link.epoch
        if self.epoch == epoch:
            return
        self.name, self.epoch = "", epoch
        try:
            channel = await (await link.ensure()).channel(publisher_confirms=False)
            raw = await channel.get_underlay_channel()
            ok = await raw.queue_declare("", exclusive=True, auto_delete=True, arguments=_KEEP_NONE)
            await channel.close()
        except FAILURES as exc:
            if not self.refused:
                logger.warning(
                    "could not declare this connection's mark queue (%s): queue stats count "
                    "what this worker holds until its registration lapses should it die",
                    describe(exc),
                )
            self.refused = True
            return
        self.name = str(ok.queue)


async def open_marks(link: AmqpLink, names: Iterable[str]) -> set[str]:
    """Of the marks ``names``, those whose connection is still open (see the module
    docstring; a check answered otherwise than by an ack or a return counts the mark open).

    Raises:
        BrokerError: RabbitMQ could not be reached.
    """
    wanted = sorted(set(names))
    if not wanted:
        return set()
    conn = await link.ensure()
    try:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        raw = await channel.get_underlay_channel()
    except FAILURES as exc:
        raise translate(exc, "opening a channel") from None

    async def check(name: str) -> bool:
        try:
            await raw.basic_publish(b"", routing_key=name, mandatory=True)
        except aiormq.exceptions.DeliveryError as exc:  # a return: gone; a nack: unknown
            return not isinstance(exc.frame, aiormq.spec.Basic.Return)
        except FAILURES as exc:
            raise translate(exc, f"checking the mark {name!r}") from None
        return True

    try:
        found = await asyncio.wait_for(asyncio.gather(*(check(n) for n in wanted)), TIMEOUT)
    except TimeoutError:
        raise BrokerError("RabbitMQ: checking the workers' connections timed out") from None
    finally:
        with contextlib.suppress(*FAILURES):
            await channel.close()
    return {name for name, alive in zip(wanted, found, strict=True) if alive}
