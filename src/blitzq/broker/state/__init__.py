"""The state-store seam: everything about a task except moving its message.

A state store keeps task records and results (and the waits on them), the schedule (with its
promotion on the store's clock), periodic claims, cancel marks, dead letters, workflow,
unique-key, lock, rate-limit and progress state, the queue and worker registries, and applies
a :class:`Completion` -- its ack, record, retry, dead letter, requeue and typed effects
(:mod:`blitzq.broker.effects`) -- atomically (:meth:`StateStore.complete`).

The Redis state store is its Lua scripts (``redis/lua/``). It pairs with the Redis transports
(streams or lists) on the same connection, where a completion's ack is one more write of the
same script (:meth:`StateStore.acks` answers ``True``), and is meant to pair with a RabbitMQ
transport (:mod:`blitzq.broker.transport`) too: then the facade :class:`~blitzq.broker.Broker`
applies the state effects here and acks on the transport afterwards. What the store writes
into queues -- a promotion of the schedule, a ``publish`` effect, a requeue, a replay, a
periodic claim -- goes to the queues of the kind its connection names (a stream or a list),
or, for a store made to pair with a transport it does not ack, to its outbox
(:attr:`StateStore.outbox`, chosen when the store is made), from which a relay publishes
those messages on the transport (:mod:`blitzq.broker.outbox`). Every method is a coroutine
that raises :class:`~blitzq.exceptions.BrokerError` when the server cannot be reached.

The seam is split by role, each a small abstract class used by one consumer:
:class:`RecordsState` (records, waits, progress, workflow state, liveness),
:class:`ScheduleState` (schedule, promotion, periodic claims), :class:`DeadLetterState`,
:class:`ControlState` (rate, unique, lock, cancel), :class:`RegistryState` (queues, workers,
counters), :class:`OperationsState` (operator state) and :class:`BrowseState` (what the
dashboard lists and charts). :class:`StateStore` holds one object per role
(:attr:`StateStore.records`, ``scheduling``, ``dead_letter_box``, ``control``,
``registry``, ``operations``, ``browse``) and adds the one atomic :meth:`StateStore.complete`
and its lifecycle; it forwards nothing: a caller uses the role object
(``broker.state.records.trace_task(...)``, or the facade's method of the same name where the
facade has one), so a new call of a role is written in that role alone (its abstract class
and its implementation).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ..outbox import Outbox
from ..transport import Transport
from ..values import Completion, DeadLetterFields, Scheduled, UniqueSend
from .browse import BrowseState
from .control import ControlState
from .dead_letters import DeadLetterLimits, DeadLetterState
from .operations import OperationsState
from .records import RecordsState
from .registry import RegistryState
from .schedule import ScheduleState

__all__ = [
    "BrowseState",
    "Completion",
    "ControlState",
    "DeadLetterFields",
    "DeadLetterLimits",
    "DeadLetterState",
    "OperationsState",
    "RecordsState",
    "RegistryState",
    "ScheduleState",
    "Scheduled",
    "StateStore",
    "UniqueSend",
]


class StateStore(abc.ABC):
    """Task state, by role, and completion effects. See the module docstring.

    Attributes:
        records: records and their waits, workflow state, progress, task liveness.
        scheduling: the schedule and its promotion, periodic claims.
        dead_letter_box: the dead letters.
        control: rate limits, unique keys, locks, cancel marks, events.
        registry: known queues, live workers, paused queues, requests, counters.
        operations: operator state (run-time periodic entries, the autoscale setpoint,
            supervisor status, server facts).
        browse: what the dashboard lists and charts.
    """

    records: RecordsState
    scheduling: ScheduleState
    dead_letter_box: DeadLetterState
    control: ControlState
    registry: RegistryState
    operations: OperationsState
    browse: BrowseState

    def acks(self, transport: Transport) -> bool:
        """Whether :meth:`complete` acknowledges ``transport``'s deliveries itself, in the
        same atomic step as its writes (and fences on their leases).

        ``True`` lets the facade call :meth:`complete` alone; ``False`` (the default) has it
        call :meth:`Transport.ack` after :meth:`complete` (see :mod:`blitzq.broker.transport`).
        """
        return False

    replicated: bool = False
    """Whether a write acknowledged by this store may still be lost by a failover it is set
    up for (asynchronous replication: a ``redis+sentinel://`` store), so that a commit that
    acks a delivery must go through :meth:`complete_durably`. ``False`` (the default): a
    commit survives what the store survives, :meth:`complete` is durable."""

    outbox: Outbox | None = None
    """Where this store writes every message it puts into queues, when it was made to pair
    with a transport it does not ack (:mod:`blitzq.broker.outbox`): the pairing relays it to
    that transport. ``None`` (the default): the store writes into the transport's queues
    itself, or writes nothing into queues."""

    # ------------------------------------------------------------ completions
    def counts(self, completion: Completion) -> bool:
        """Whether :meth:`complete` adds ``completion``'s run (its
        :attr:`~blitzq.broker.values.Completion.tally`) to the namespace's ``processed`` /
        ``failed`` counters (``registry.counters``) in the same atomic step as its writes.

        ``False`` (the default): the store writes nothing for it, or cannot count it with its
        writes; the worker then adds the run to those counters through its registrations
        (``registry.register_worker``), about once a second, so a killed worker's last
        second of such runs is not counted.

        Args:
            completion: a completion the worker is about to hand to :meth:`complete`.
        """
        return False

    @abc.abstractmethod
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply completions; each one atomically, a batch in as few round-trips as possible.

        Fencing: a completion whose delivery (``token``, else ``fence``) is no longer leased
        to this consumer -- its lease lapsed and another worker recovered the message -- is
        stale: none of its writes (ack, record, retry, dead letter, requeue, ops) is applied,
        the check and the writes being one atomic step. Each stale completion adds 1 to the
        namespace's ``stale_completions`` counter (``registry.counters``). Brokers without leases
        (fast mode) have nothing to check.

        ``token`` and fencing with a transport whose ack is separate (:meth:`acks` is
        ``False``, e.g. RabbitMQ): ``token`` is the transport's delivery tag, which the
        facade acks after this call; the store does not ack it and cannot see its lease, so
        it fences nothing (returns no stale completion) unless it keeps a lease of its own
        for the delivery -- or, RabbitMQ's (:attr:`Transport.fenced_by_takes`), a
        completion's ``fence`` is its delivery's token and the store refuses it when another
        delivery took that message copy since (:meth:`RecordsState.take_redelivered`).
        Effects are then at-least-once: a message redelivered after a
        crash between commit and ack completes again, so effects must be idempotent per
        task id (records are overwritten, chord members counted once, unique and lock
        releases compare the holder).

        Returns:
            The stale completions (not applied), in no particular order; usually empty.
        """

    async def complete_durably(self, completions: Sequence[Completion]) -> list[Completion]:
        """:meth:`complete`, returning only once the writes would survive the failover the
        store is set up for (raising :class:`~blitzq.BrokerError`, transient, when they may
        not: the caller commits them again). The pairing with a transport whose ack is
        separate (RabbitMQ) acks the deliveries right after this: a commit a failover then
        loses would leave a task that ran with no record. Default: :meth:`complete` (a store
        without replicas)."""
        return await self.complete(completions)

    async def ping(self) -> None:
        """Check that the store answers; raise BrokerError otherwise."""
        return

    async def close(self) -> None:
        """Release connections. The store may be used again afterwards (it reconnects)."""
        return
