"""How a broker joins a completion's state writes with the ack of its delivery: the pairing.

A :class:`Pairing` is chosen once, when the facade :class:`~blitzq.broker.Broker` is composed,
and gives it :attr:`Pairing.complete` (the facade's own ``complete``, a bound method one call
deep) and :attr:`Pairing.relay`:

- :class:`Fused`: the state store acks the transport's deliveries in the same atomic step as
  its writes (:meth:`StateStore.acks`: the Redis state store with a Redis transport on its
  connection, ``complete.lua`` XACKs and fences). ``complete`` is the store's own.
- :class:`CommitThenAck`: any other pair (RabbitMQ with the Redis state store, a transport on
  another connection). The store applies the completions, then the transport acks the
  deliveries whose completion was applied: at-least-once. With RabbitMQ the store fences
  them on the takes of redelivered messages (:attr:`Transport.fenced_by_takes`). The store
  was made with an outbox (:attr:`StateStore.outbox`) and :attr:`relay` carries what it
  writes into queues to the transport.
- hold-then-commit-then-ack (``redis/spread.py``'s ``SpreadPairing``): as
  :class:`CommitThenAck`, after the transport has kept the deliveries this consumer still
  holds (and renewed their leases): the others are refused whole, as fencing does.

:func:`pairing_for` chooses between the first two; a backend that needs the third passes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from .effects import ChordMember, Publish, WorkflowStep
from .outbox import Outbox, Relay
from .state import StateStore
from .transport import Transport
from .values import Completion

__all__ = ["CommitThenAck", "Fused", "Pairing", "pairing_for"]

#: Applies a batch of completions; returns the stale ones (see :meth:`StateStore.complete`).
CompleteFn = Callable[[Sequence[Completion]], Awaitable[list[Completion]]]


class Pairing:
    """A transport and a state store joined for completion (see the module docstring).

    Attributes:
        complete: applies a batch of completions and acks their deliveries; returns the
            stale completions (not applied).
        relay: the :class:`~blitzq.broker.outbox.Relay` from the store's outbox to the
            transport, or ``None`` (the store writes into the transport's queues itself).
        fences: whether a completion of a delivery this consumer no longer holds is
            refused (stale), as :meth:`StateStore.complete` describes.
    """

    complete: CompleteFn
    relay: Relay | None = None
    fences: bool = False


class Fused(Pairing):
    """The store acks the transport's deliveries itself: ``complete`` is the store's
    :meth:`~StateStore.complete`, or its :meth:`~StateStore.complete_durably` when the store
    is :attr:`~StateStore.replicated` (its ack is part of the commit, so the commit must
    survive the failover the store is set up for: on ``redis+sentinel://`` it waits for the
    replicas that exist).

    Args:
        state: a state store whose :meth:`~StateStore.acks` is ``True`` for the transport.
    """

    fences = True

    def __init__(self, state: StateStore) -> None:
        self.complete = state.complete_durably if state.replicated else state.complete


class CommitThenAck(Pairing):
    """Commit the completions in the store, then ack their deliveries on the transport.

    Args:
        transport: the transport whose deliveries are acked (or handed back, see
            :meth:`commit_then_ack`).
        state: the store, made with the outbox (:attr:`StateStore.outbox`) that the relay
            carries to the transport (``None``: it writes nothing into queues).
    """

    def __init__(self, transport: Transport, state: StateStore) -> None:
        self.transport = transport
        self.state = state
        outbox = state.outbox
        self.relay = None if outbox is None else self.make_relay(outbox)
        self.complete = self.commit_then_ack

    def make_relay(self, outbox: Outbox) -> Relay:
        """The relay from ``outbox`` to the transport (a :class:`Relay`)."""
        return Relay(outbox, self.transport)

    async def commit_then_ack(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply ``completions`` in the store, then ack the applied ones on the transport.

        A completion that only requeues its delivery (a worker handing back a message it did
        not start) is given to :meth:`Transport.nack` when the transport
        :attr:`~Transport.hands_back`; the store applies the rest, then the deliveries of the
        completions it applied are acked on the transport (per queue, in one call each). A
        crash between the two leaves the deliveries unacked: the transport delivers them
        again and the store's writes are applied again (at-least-once). Returns the
        completions the store refused as stale.
        """
        if self.transport.hands_back:
            completions = await self._hand_back(completions)
        # The tokens are the transport's, not the store's: the store sees none, so it never
        # acks or fences on them (a Redis store on a streams connection would otherwise read
        # a foreign delivery tag as a lost stream lease and drop the whole completion). They
        # are taken off the completions for the commit and put back after it (a copy of
        # each completion cost more than the rest of the pairing). A transport whose
        # redeliveries are noted as takes (:attr:`Transport.fenced_by_takes`, RabbitMQ)
        # gives the delivery's token as the fence the store checks against them.
        marks = [(c.token, c.fence) for c in completions]
        takes = self.transport.fenced_by_takes
        try:
            for c in completions:
                fence = (c.token or c.fence) if takes else None
                c.token, c.fence = None, fence
            # Durable before the ack: a commit a failover loses must not be acknowledged.
            stale = await self.state.complete_durably(completions)
        finally:
            for c, (token, fence) in zip(completions, marks, strict=True):
                c.token, c.fence = token, fence
        dropped = {id(c) for c in stale}
        tokens: dict[str, list[bytes]] = {}
        refused: list[Completion] = []
        for c in completions:
            if id(c) in dropped:
                refused.append(c)
            elif c.token is not None:
                tokens.setdefault(c.queue, []).append(c.token)
        for queue, acked in tokens.items():
            await self.transport.ack(queue, acked)
        if self.relay is not None:
            pushed = _pushed_queues(c for c in completions if id(c) not in dropped)
            if pushed:
                await self.relay.pushed(pushed)
        return refused

    async def _hand_back(self, completions: Sequence[Completion]) -> Sequence[Completion]:
        """Give the transport back the deliveries whose completion only requeues them, with
        :meth:`Transport.nack`; return the other completions."""
        plain = [
            c
            for c in completions
            if c.requeue is not None
            and c.token is not None
            and c.record is None
            and c.reschedule is None
            and c.dead_letter is None
            and not c.ops
        ]
        if not plain:
            return completions
        tokens: dict[str, list[bytes]] = {}
        for c in plain:
            if c.token is not None:
                tokens.setdefault(c.queue, []).append(c.token)
        for queue, handed in tokens.items():
            await self.transport.nack(queue, handed)
        done = {id(c) for c in plain}
        return [c for c in completions if id(c) not in done]


def pairing_for(transport: Transport, state: StateStore) -> Pairing:
    """:class:`Fused` when ``state`` acks ``transport``'s deliveries itself
    (:meth:`StateStore.acks`), else :class:`CommitThenAck`."""
    if state.acks(transport):
        return Fused(state)
    return CommitThenAck(transport, state)


def _pushed_queues(completions: Iterable[Completion]) -> set[str]:
    """Queues the completions write messages into: a requeue, a ``Publish``, a
    ``WorkflowStep`` or a chord's callback (its ``queue``)."""
    queues: set[str] = set()
    for c in completions:
        if c.requeue is not None:
            queues.add(c.queue)
        for op in c.ops:
            if isinstance(op, Publish | WorkflowStep) or (isinstance(op, ChordMember) and op.queue):
                queues.add(op.queue)
    return queues
