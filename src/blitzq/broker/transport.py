"""The transport seam: how messages travel from producers to workers and are leased.

A transport moves opaque ``bytes``: publish to a queue, fetch (one queue or several by
priority), and -- where it has leases -- renew them (heartbeat), take back deliveries whose
lease lapsed (recover) and tidy consumers. That is what Redis Streams (consumer groups, XACK,
XAUTOCLAIM), Redis lists (LPOP, no leases) and RabbitMQ (basic.publish/consume, unacked
redelivery) each do natively. Everything else -- records, results, the schedule, dead letters,
workflow/unique/lock/rate/progress state and the atomic completion -- is the other seam,
:class:`~blitzq.broker.state.StateStore`.

A transport is paired with a state store by the facade :class:`~blitzq.broker.Broker`
(``Broker(transport, state)``). How the ack of a delivery meets the store's writes decides
what a completion guarantees:

- **Fused** (the Redis transports with the Redis state store, on one connection): the store
  acks in the same atomic step as its writes (``complete.lua`` XACKs and XDELs the stream
  entry with the record write, and refuses the whole completion when the entry is no longer
  leased to this consumer: fencing). :meth:`Transport.ack` and :meth:`Transport.nack` exist
  for such a transport but are not on its hot path. The store says so by
  :meth:`~blitzq.broker.state.StateStore.acks`.
- **Separate** (a RabbitMQ transport with the Redis state store): the facade has the store
  commit a completion first, then calls :meth:`Transport.ack` with the delivery tokens of the
  completions it applied. A crash (or a lost channel) in between redelivers the message and
  its effects are applied again: at-least-once, as the transport promises. What the store
  writes into queues (promotions, requeues, workflow steps, replays, periodic claims) goes to
  its outbox, which the facade's relay publishes here (:mod:`blitzq.broker.outbox`); a
  requeue is such a message plus the ack of the original delivery, not a
  :meth:`Transport.nack`. The store cannot fence on a lease it does not see; what
  ``Completion.token`` means then is in :meth:`~blitzq.broker.state.StateStore.complete`.

Every method is a coroutine that raises :class:`~blitzq.exceptions.BrokerError` when the
server cannot be reached. New backends pass the contract suite (``tests/contract/``).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

#: The backstop is this many times ``max_deliveries`` (at least :data:`BACKSTOP_MIN`).
BACKSTOP_FACTOR = 4
#: Smallest backstop (deliveries).
BACKSTOP_MIN = 20


def delivery_backstop(max_deliveries: int) -> int:
    """Deliveries of one message after which a transport's own count dead-letters it
    (``max deliveries exceeded``): ``4 x max_deliveries``, at least 20; 1 for
    ``max_deliveries=1``, which runs no task twice (so the count is the limit, as before).

    The worker dead-letters a task that crashes every run after ``max_deliveries`` runs
    (:mod:`blitzq.worker.solo`), counting only the runs it made alone; a transport's count
    also grows with every crash of a worker that merely held the message (prefetched, or
    running beside a poison task), so it bounds a message only as a backstop: RabbitMQ's
    ``x-delivery-limit`` (one less: it counts returns), the streams and custody recoveries,
    and the check of a delivery on receipt. Past it, a message that kills its worker before
    it ever starts is dead-lettered too.
    """
    if max_deliveries <= 1:
        return max_deliveries
    return max(BACKSTOP_MIN, BACKSTOP_FACTOR * max_deliveries)


def solo_plan(max_deliveries: int) -> tuple[int, int]:
    """``(solo_from, budget)`` for a Queue's ``max_deliveries`` (an int >= 1): the first
    delivery count that runs alone, and how many solo runs a task may start before it is
    dead-lettered (:mod:`blitzq.worker.solo`, which counts them in ``{ns}:solo:<id>``).
    ``budget`` is 0 for ``max_deliveries=1`` (a redelivery is dead-lettered on receipt: there
    is no second run to find the culprit with)."""
    solo_from = 3 if max_deliveries >= 3 else 2
    return solo_from, max(0, max_deliveries - solo_from + 1)


def backstop_note(backstop: int, max_deliveries: int | None = None) -> str:
    """What a dead letter's error and a log line say the delivery limit was: the backstop of
    :func:`delivery_backstop` (``the backstop of 20 deliveries: 4 x max_deliveries=5, at
    least 20``), or ``max_deliveries=1`` when the backstop is the limit itself.

    Args:
        backstop: the count the transport stopped at (deliveries).
        max_deliveries: the Queue's ``max_deliveries``, when the caller knows it (a
            recovery script only knows the backstop).

    Returns:
        The text, for a parenthesis (``recover.lua`` writes the same).
    """
    if backstop <= 1:
        return f"max_deliveries={backstop}"
    given = "" if max_deliveries is None else f"={max_deliveries}"
    return (
        f"the backstop of {backstop} deliveries: {BACKSTOP_FACTOR} x max_deliveries{given}, "
        f"at least {BACKSTOP_MIN}"
    )


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
        unsure: ``deliveries`` counts one delivery that may never have run: RabbitMQ's
            first delivery of a redelivered copy, which a worker may only have prefetched
            (``broker/amqp/redelivered.py``). The worker then counts it as an attempt only
            while that does not take the run past its task's last attempt. Read it only
            for a redelivery (``deliveries`` > 1): fast mode's lists make their deliveries
            as bare 4-tuples, without it.
    """

    queue: str
    token: bytes | None
    payload: bytes
    deliveries: int
    unsure: bool = False


class MalformedDelivery(Delivery):
    """A :class:`Delivery` of an entry that holds no message blitzq can read (a stream entry
    without the message field ``m``, written by another program): ``payload`` is empty, and
    ``fault`` says what is wrong, the reason the worker dead-letters it with.

    Attributes:
        fault: what is wrong with the entry, for the dead letter's error (set after
            construction: a NamedTuple's subclass adds no field).
    """

    fault: str = ""

    @classmethod
    def of(cls, queue: str, token: bytes | None, deliveries: int, fault: str) -> MalformedDelivery:
        """The delivery of such an entry, with its ``fault``."""
        made = cls(queue, token, b"", deliveries)
        made.fault = fault
        return made


class Transport(abc.ABC):
    """Delivery of messages: publish, fetch, leases. See the module docstring."""

    guarantee: Guarantee
    supports_recovery: bool = False
    """Whether abandoned deliveries can be recovered (leases, heartbeat, recover)."""
    recovers_on_silence: bool = False
    """Whether the server takes back a consumer's deliveries when its connection falls silent
    (RabbitMQ: missed AMQP heartbeats) rather than by leases other workers claim."""
    hands_back: bool = False
    """Whether :meth:`nack` puts a delivery back on its queue at once without spending its
    delivery budget (RabbitMQ: republish, then ack). The facade then hands a worker's unstarted
    deliveries back through it; otherwise such a requeue is a message the state store writes
    (its outbox, relayed)."""
    fenced_by_takes: bool = False
    """Whether the transport notes each redelivery it hands a worker as the latest take of
    its message copy in the state store, and its delivery tokens end in ``/<digest>`` of the
    copy (RabbitMQ, ``broker/amqp/redelivered.py``): the commit-then-ack pairing then gives
    a completion's token to the store as its fence, and the store refuses as stale a
    completion of a copy another delivery took since."""
    count_note: str | None = None
    """What :meth:`queue_stats`' ``waiting`` (and a purge's count) counts when it is not
    always tasks, in a sentence for the operator (``blitzq queue stats``, the dashboard);
    ``None``: tasks."""

    @property
    def pool_size(self) -> int | None:
        """Most connections the client this transport shares with the rest of the broker
        opens (a worker checks it fits its fetch loops); ``None``: unknown, or connections
        of the transport's own (RabbitMQ)."""
        return None

    @abc.abstractmethod
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """Append encoded messages to the tail of ``queue`` in one round-trip.

        Returns once the transport holds them (durably where it promises at-least-once:
        RabbitMQ publisher confirms): the outbox relay deletes its batch after this returns
        (:mod:`blitzq.broker.outbox`). A queue no consumer has prepared yet accepts them
        (producers and the relay publish before any worker starts). Raises BrokerError when
        they may not all be held: the caller publishes them again (duplicates possible).
        """

    @abc.abstractmethod
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Create whatever a consumer named ``consumer`` needs to fetch from ``queues`` (a
        consumer group, a queue declaration). The facade then registers the queues in the
        state store (:meth:`~blitzq.broker.state.RegistryState.remember_queues`)."""

    @abc.abstractmethod
    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """Take up to ``count`` messages from ``queue``.

        Returns at once when messages are waiting; otherwise blocks up to ``timeout`` seconds
        (0 = do not block) for the first one.
        """

    @abc.abstractmethod
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> list[Delivery]:
        """Take up to ``count`` messages from ``queues`` in the order given (priority levels).

        Earlier queues are drained first. When all are empty, blocks up to ``timeout`` seconds
        on all of them at once (0 = do not block) and returns what arrives first (a few
        messages at most, possibly from more than one queue).

        ``look_first=False`` (with ``timeout`` > 0) tells that the caller's non-blocking call
        on the same queues just found them all empty: a transport may then go straight to
        its blocking read, one command less (the idle worker's fetch); the blocking read
        still returns at once, earlier queues first, what arrived in between. A transport
        may ignore it.
        """

    shared_block: bool = False
    """Whether :meth:`block_first` blocks on any number of queues in one command on a
    connection :meth:`unblock` can wake (then a worker's idle fetch loops share one blocking
    read: :mod:`blitzq.worker.idle`); otherwise each idle queue blocks on its own."""

    block_count: int = 1
    """The most messages :meth:`block_first` may be asked to take from one queue. A read
    that took fewer than it asked from each queue it returned messages of saw every one of
    them drained (the queues it returned nothing of were empty too), so the worker blocks
    again at once, without a non-blocking look first; after a read of one a queue, a read
    that brought anything is followed by a look (a backlog is taken in batches, most urgent
    queue first)."""

    async def block_first(
        self, queues: Sequence[str], timeout: float, count: int = 1
    ) -> list[Delivery]:
        """Block up to ``timeout`` seconds on all of ``queues`` at once and return what
        arrives first: at least one message, at most ``count`` (1 to :attr:`block_count`)
        per queue, earlier queues first; or nothing at the timeout (or after
        :meth:`unblock`). Messages waiting already are returned at once. Default:
        :meth:`fetch_first` of one message, ``look_first=False``.
        """
        return await self.fetch_first(queues, 1, timeout, look_first=False)

    async def unblock(self) -> bool:
        """End a :meth:`block_first` in flight early, taking nothing (it returns empty);
        ``False`` when there was none to wake or the transport cannot (the read then ends at
        its timeout). Default: cannot."""
        return False

    def arrived(self, queue: str | None) -> None:
        """The worker's event listener heard that base queue ``queue`` got a message
        (``None``: it subscribed again, any queue may have): a transport whose
        :meth:`block_first` waits for such announcements (a Redis Cluster's doorbell) looks
        again. Default: nothing."""
        return

    def hearing(self, on: bool) -> None:
        """The worker's event listener is subscribed (``True``: pushes are heard from now)
        or lost its subscription (``False``). Default: nothing."""
        return

    async def pause(self, queues: Sequence[str]) -> int:
        """Take nothing more from the physical queues ``queues`` (their queue is paused:
        ``blitzq queue pause``) until :meth:`resume`: a transport that receives messages
        ahead of the fetches (RabbitMQ's prefetch) stops receiving them and hands back what
        it received and no fetch took, so they wait on the queue for any worker. The worker
        calls it at each change and each maintenance round (it is idempotent). Returns how
        many messages were handed back. Default: nothing is received ahead (0).

        Raises:
            BrokerError: the server could not be reached (the next call tries again).
        """
        return 0

    async def resume(self, queues: Sequence[str]) -> None:
        """Take from ``queues`` again after :meth:`pause`. Default: nothing to do."""
        return

    async def occupied(self, queues: Sequence[str]) -> list[str]:
        """The queues among ``queues`` that may hold a message (waiting or in flight), for
        :meth:`recover` to skip the empty ones. Default: all of them (one cannot tell
        cheaply)."""
        return list(queues)

    async def ack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """Acknowledge deliveries of ``queue`` for good: they are never delivered again.

        The facade calls it after the state store committed their completions, for a
        transport the store does not ack itself (see the module docstring). A token no longer
        held (its lease lapsed, the channel closed) is ignored. Default: nothing to ack (a
        transport without leases).
        """
        return

    async def nack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """Hand deliveries of ``queue`` back unfinished so they are delivered again
        (RabbitMQ ``basic.nack`` with ``requeue``; Redis streams: made recoverable at once).

        The worker does not call it: a requeue (a delivery handed back at shutdown) is a
        completion whose message the state store writes -- to a foreign transport's queue
        through the outbox relay (:mod:`blitzq.broker.outbox`) -- and whose delivery is acked,
        so it is atomic with the completion's other effects and counts no extra delivery.

        Raises:
            NotImplementedError: the transport has no leases (a popped list message is gone).
        """
        raise NotImplementedError(f"{type(self).__name__} has no leases to hand back")

    async def hand_over(self, queue: str, token: bytes, consumer: str, ttl: float) -> bool:
        """Hand a delivery this consumer holds to the consumer ``consumer`` (a worker that
        knows the message's task), still leased, and wake it (rolling deploys).

        Args:
            queue: the delivery's physical queue.
            token: its delivery token.
            consumer: the other worker's consumer name (its worker id).
            ttl: seconds the record of what was handed to ``consumer`` lives.

        Returns:
            ``True`` when handed over; ``False`` when this consumer no longer holds it.

        Raises:
            NotImplementedError: the transport cannot hand a delivery to one consumer (the
                default; the worker then puts the message back on the schedule).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot hand a delivery over")

    async def take_handed(self, queue: str, count: int) -> list[Delivery]:
        """Up to ``count`` deliveries of ``queue`` handed to this consumer by
        :meth:`hand_over` (their leases renewed).

        Raises:
            NotImplementedError: the transport cannot hand deliveries over (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot hand a delivery over")

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Renew the leases of deliveries this consumer still owns; return how many it renewed.

        A lease another consumer has taken over is never taken back. Without leases: 0.
        """
        return 0

    async def recover(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        record_ttl: int = 86400,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, int]:
        """Put deliveries idle longer than ``min_idle`` seconds back on ``queue``.

        Those delivered ``max_deliveries`` times already are dead-lettered instead, with a
        record (state ``dead_lettered``) kept ``record_ttl`` seconds. ``holders`` maps the
        consumer names of live workers whose visibility timeout is longer than ``min_idle``
        to that timeout in seconds
        (:meth:`~blitzq.broker.state.RegistryState.worker_timeouts`): a delivery one of them
        holds is taken only once idle that long. A transport whose leases carry their
        holder's own expiry ignores it.

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

    def holding(self) -> dict[str, Any] | None:
        """What this transport holds delivered and not acknowledged, for a worker's
        registration (``Worker.info()["in_flight"]``), where the server cannot count it for
        :meth:`queue_stats` (RabbitMQ): ``{"by": <this transport's id>, "alive": <its
        connection's mark>, "queues": {queue: tasks fetched}, "kept": {queue: tasks in
        custody}, "buffered": {queue: tasks prefetched}}``. ``None`` (the default):
        the server counts it (a stream's pending entries)."""
        return None

    async def wrong_type_keys(self, queues: Sequence[str]) -> dict[str, str]:
        """The keys this transport reads for ``queues`` (and the namespace's own: the
        schedule, the dead-letter index) that hold another type than blitzq keeps there (a
        key set by hand, another program in the namespace): key name -> what is wrong
        (``"holds a string, not a stream"``). Such a key makes every command on it fail
        with ``WRONGTYPE``; the worker sets its level aside (``worker/bad_keys.py``),
        ``queue stats`` and ``blitzq check`` report it. The default finds none.

        Raises:
            BrokerError: the broker could not be reached.
        """
        return {}

    async def oldest_waiting(self, queues: Sequence[str]) -> dict[str, float]:
        """Per queue with messages waiting: when its oldest waiting message was enqueued,
        Unix seconds on the broker's clock (what the supervisor's autoscaler reads as
        latency). The default knows none (an empty dict): a transport that cannot tell
        without decoding messages leaves it out."""
        return {}

    @abc.abstractmethod
    async def purge_queue(self, queue: str) -> int:
        """Delete waiting messages of ``queue``; return how many."""

    async def ping(self) -> None:
        """Check that the server answers; raise BrokerError otherwise."""
        return

    async def close(self) -> None:
        """Release connections. The transport may be used again afterwards (it reconnects)."""
        return
