"""Whether another process's RabbitMQ connection is still open, for the queue counts
(``inspection.py``).

**Why.** A worker's registration carries what its transport holds unacked (``in_flight``),
and lives until it lapses (30 s or more) when the worker dies without unregistering. RabbitMQ
puts a dead connection's unacked messages back at once (the kernel closes a killed process's
socket; a frozen one is closed after two to three missed heartbeats), so counting them until
the registration lapses would count them twice: ready again, and still in flight.

**How.** Each transport that consumes declares a *mark* on its connection (:class:`Mark`): a
server-named (``amq.gen-…``), exclusive queue, which RabbitMQ deletes the moment that
connection closes -- the same moment it requeues the connection's unacked messages. The
transport writes the mark's name into its registration's ``in_flight`` (``alive``), and
:func:`open_marks` checks the marks of the registrations that hold something with a passive
declaration each: ``NOT_FOUND`` means the connection is gone (another connection is answered
``RESOURCE_LOCKED`` while it lives). A mark costs RabbitMQ one empty classic queue per
consuming connection; a check costs a channel (the refusal closes it) and one round trip,
the checks of one count run at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import aiormq

from .channels import FAILURES, AmqpLink, translate

__all__ = ["Mark", "open_marks"]

#: Marks checked at once.
CHECKS_AT_ONCE = 16


class Mark:
    """This transport's mark on its current connection (module docstring): made on the
    first consumer of each connection, gone with the connection."""

    __slots__ = ("epoch", "name")

    def __init__(self) -> None:
        self.name = ""
        self.epoch = 0

    def current(self, epoch: int) -> str:
        """The mark's queue name on the connection of ``epoch``; ``""`` when it has none."""
        return self.name if self.epoch == epoch else ""

    async def ensure(self, raw: Any, epoch: int) -> None:
        """Declare the mark on the connection of ``epoch`` through its channel ``raw`` (an
        aiormq channel) unless it has one.

        Raises:
            BrokerError: RabbitMQ refused the declaration or could not be reached.
        """
        if self.name and self.epoch == epoch:
            return
        try:
            ok = await raw.queue_declare("", exclusive=True, auto_delete=True)
        except FAILURES as exc:
            raise translate(exc, "declaring the connection's mark") from None
        self.name, self.epoch = str(ok.queue), epoch


async def open_marks(link: AmqpLink, names: Iterable[str]) -> set[str]:
    """Of the marks ``names``, those whose connection is still open (see the module
    docstring; a check that fails otherwise counts the mark open).

    Raises:
        BrokerError: RabbitMQ could not be reached.
    """
    wanted = sorted(set(names))
    if not wanted:
        return set()
    conn = await link.ensure()
    gate = asyncio.Semaphore(CHECKS_AT_ONCE)

    async def check(name: str) -> bool:
        async with gate:
            try:
                channel = await conn.channel(publisher_confirms=False)
                raw = await channel.get_underlay_channel()
            except FAILURES as exc:
                raise translate(exc, "opening a channel") from None
            try:
                await raw.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return False
            except aiormq.exceptions.ChannelClosed:  # RESOURCE_LOCKED: another's, open
                return True
            except FAILURES as exc:
                raise translate(exc, f"checking the mark {name!r}") from None
            await channel.close()  # answered: a mark of this connection (not refused)
            return True

    found = await asyncio.gather(*(check(name) for name in wanted))
    return {name for name, alive in zip(wanted, found, strict=True) if alive}
