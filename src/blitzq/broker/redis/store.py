"""The Redis state store: role objects over one connection, and the atomic completion.

:class:`RedisStateStore` is the :class:`~blitzq.broker.state.StateStore` of every Redis
deployment. It holds one :class:`~.connection.RedisConnection` and one small object per role,
each taking that connection:

============================  =====================================================
``records`` (records.py)      records and their waits, workflow state, progress,
                              task liveness (trace, keep running)
``scheduling`` (schedule.py)  the schedule and its promotion, periodic claims
``dead_letter_box``           dead letters: list, read, count, replay, purge
(dead_letters.py)
``control``                   rate limits, unique keys, locks, cancel marks, events
(control_state.py)
``registry`` (registry.py)    known queues, live workers, paused queues, shutdown
                              requests, counters, memory policy
``operations``                run-time periodic entries, the autoscale setpoint,
(operator_state.py)           supervisor status, server facts
============================  =====================================================

(and ``browse``, browse.py: what the dashboard lists and charts), and applies a batch of
completions itself (:meth:`RedisStateStore.complete`, one ``complete.lua`` call; the batch
encoding is ``completion.py``). It forwards nothing to its roles: callers use them
(``store.records.get_record(...)``), so a new call is written in its role's module alone. A
layout that changes one role (the spread layout: ``handoff.py``, ``homes.py``) puts its own
role object in that attribute. The logic is the Lua in ``lua/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...exceptions import ConfigurationError
from ...limits import NOTIFY_INLINE_MAX
from ..outbox import Outbox
from ..state import StateStore
from ..transport import Transport
from ..values import Completion
from .browse import RedisBrowse
from .client import translate_errors
from .completion import encode_batch, encode_entries, guard_unfenced
from .connection import LeaseIdentity, RedisConnection, RedisPart
from .control_state import RedisControl
from .dead_letters import RedisDeadLetters
from .keys import GROUP
from .operator_state import RedisOperatorState
from .outbox import RedisOutbox
from .records import RedisRecords
from .registry import RedisRegistry
from .replicas import durable_writes, is_replicated
from .schedule import RedisSchedule

__all__ = ["CompleteCall", "RedisStateStore"]


class CompleteCall:
    """One prepared ``complete.lua`` call (:meth:`RedisStateStore.prepare_complete`).

    Attributes:
        keys, args: the script's ``KEYS`` and ``ARGV``.
        completions: the batch it applies.
    """

    __slots__ = ("_forget", "_fresh", "_store", "args", "completions", "keys")

    def __init__(
        self,
        store: RedisStateStore,
        completions: Sequence[Completion],
        keys: list[Any],
        args: list[Any],
        fresh: str | None,
        forget: list[str],
    ) -> None:
        self._store = store
        self.completions = completions
        self.keys = keys
        self.args = args
        self._fresh = fresh
        self._forget = forget

    def applied(self, reply: Any) -> list[Completion]:
        """The script answered ``reply``: the stale completions of the batch (fenced, not
        applied). The guards given at this first try are forgotten with the next batch."""
        store = self._store
        if self._fresh is not None:
            store._settled.append(self._fresh)
        if not reply:
            return []
        wanted = {(q.decode(), bytes(t)) for q, t in reply}
        return [c for c in self.completions if (c.queue, c.token or c.fence) in wanted]

    def failed(self) -> None:
        """The call is not known to be applied: its guards stay (a later try, or this one
        applied late, finds them); the marks it was to forget go with the next batch."""
        store = self._store
        store._settled = self._forget + store._settled


class RedisStateStore(StateStore):
    """The Redis state store on a connection it may share with a Redis transport.

    Both choices are made here, once: whose leases it fences on, and whether it writes into
    the transport's queues or into its outbox.

    Args:
        conn: the :class:`~.connection.RedisConnection` (its ``kind`` says where the
            store's writes into queues go without an outbox).
        lease: the :class:`~.connection.LeaseIdentity` of the streams transport on ``conn``
            whose deliveries this store acks: completions and progress are fenced on its
            leases (``None``: nothing is fenced; a lists transport has no leases).
        outbox: write every message the store puts into a queue to that queue's outbox
            (kind ``"o"``, ``{ns}:outbox:<queue>``), for a transport the store does not ack
            (RabbitMQ, another connection, the spread layout), which the pairing's relay
            publishes on; such a store fences no lease (``lease`` is ignored), only a
            ``fence`` its pairing gives against the takes of RabbitMQ's redeliveries
            (``complete.lua``).

    Attributes:
        conn: the connection; ``keys`` and ``client`` are its own.
        kind: where the store's scripts write messages into queues: the connection's kind
            (``"s"``, ``"l"``), or ``"o"`` (made with an outbox).
        lease: the lease identity it fences on, or ``None``.
        outbox: its :class:`~.outbox.RedisOutbox` when made with ``outbox=True``, else
            ``None``.
        records, scheduling, dead_letter_box, control, registry, operations, browse: the
            role objects (see the module docstring).
    """

    def __init__(
        self, conn: RedisConnection, *, lease: LeaseIdentity | None = None, outbox: bool = False
    ) -> None:
        self.conn = conn
        self.keys = conn.keys
        self.client: Any = conn.client
        self.scripts = conn.scripts
        self.lease = None if outbox else lease
        self.kind = "o" if outbox else conn.kind
        self.outbox: Outbox | None = self.make_outbox() if outbox else None
        self.records = RedisRecords(conn, self.kind, self.lease)
        self.scheduling = RedisSchedule(conn, self.kind)
        self.dead_letter_box = RedisDeadLetters(conn, self.kind)
        self.control = RedisControl(conn, self.kind)
        self.registry = RedisRegistry(conn)
        self.operations = RedisOperatorState(conn)
        self.browse = RedisBrowse(conn)
        #: Batch ids of guards applied at their first try, answered: the next batch
        #: deletes their marks (see :meth:`complete`).
        self._settled: list[str] = []

    def make_outbox(self) -> Outbox:
        """The outbox of a store made with ``outbox=True`` (a :class:`~.outbox.RedisOutbox`)."""
        return RedisOutbox(self.conn)

    @property
    def pool_size(self) -> int | None:
        """Most connections the store's client opens (``max_connections``), ``None`` when
        unknown."""
        return self.conn.pool_size

    def acks(self, transport: Transport) -> bool:
        """``True`` for a Redis transport on this store's connection, the store made without
        an outbox: ``complete.lua`` acks (XACK + XDEL) and fences its stream entries in the
        same script as the writes.

        Raises:
            ConfigurationError: the transport holds leases (streams) and this store was not
                given its :class:`~.connection.LeaseIdentity`: it could not fence on them.
        """
        if self.outbox is not None or not isinstance(transport, RedisPart):
            return False
        if transport.conn is not self.conn:
            return False
        if getattr(transport, "lease", None) is not self.lease:
            raise ConfigurationError(
                "a Redis state store on a streams transport's connection fences on that "
                "transport's leases: make it with RedisStateStore(conn, lease=transport.lease)"
            )
        return True

    @property
    def replicated(self) -> bool:  # type: ignore[override]
        """``True`` on ``redis+sentinel://`` and on a Redis Cluster (asynchronous
        replication: see :meth:`complete_durably`; a cluster shard without a replica sends
        its commands unwaited)."""
        client = self.conn.client
        return is_replicated(client) or getattr(client, "replicas", None) is not None

    # ------------------------------------------------------------ completions
    def counts(self, completion: Completion) -> bool:
        """``True`` when ``complete.lua`` writes anything for ``completion`` (a record, a
        retry, a dead letter, a requeue, ops, or the ack of a stream entry): it then adds the
        completion's run (:attr:`~blitzq.broker.values.Completion.tally`) to ``{ns}:stats``
        ``processed`` / ``failed`` in the same script as those writes, not when the
        completion is stale. See :meth:`StateStore.counts`."""
        c = completion
        if c.token is not None and self.kind == "s":  # the common case first: one test
            return True
        return bool(
            c.record
            or c.reschedule is not None
            or c.dead_letter is not None
            or c.requeue is not None
            or c.ops
        )

    async def complete_durably(self, completions: Sequence[Completion]) -> list[Completion]:
        """:meth:`complete`, each write waited for by the primary's replicas that exist (at
        least one, ``wait_replicas`` if more) on a ``redis+sentinel://`` store
        (``sentinel.py``: ``WAIT``; ``BrokerError`` when fewer acknowledged in time), by the
        shard's replicas that exist on a Redis Cluster (``cluster_replicas.py``); as
        :meth:`complete` on a single server."""
        token = durable_writes.set(True)
        try:
            return await self.complete(completions)
        finally:
            durable_writes.reset(token)

    @translate_errors
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply a batch of completions in one Lua call (one round-trip, atomic).

        The batch travels as one MessagePack argument (:func:`~.completion.encode_batch`)
        that the script unpacks with ``cmsgpack``. Stream completions are fenced in the
        script (see :meth:`Broker.complete`); the stale ones are returned.

        A write that failed (a timeout, a dropped connection) may have been applied: the
        server may have read it, or read it later (a paused server runs the buffered script
        when it resumes, after the worker gave up waiting). Its retry must not repeat what
        the first try did, such as pushing a workflow's next step once more. A stream
        completion's retry is fenced (its entry is acked). An unfenced completion with
        effects gets a guard at its first try (:func:`~.completion.guard_unfenced`) that
        the script marks applied (``{ns}:cg:<batch>``, :data:`~.completion.GUARD_TTL`)
        together with the effects, and a try whose guard is marked applies nothing: one
        mark per batch while its first try holds all of it, one per completion retried
        apart. Marks of first tries that were answered are deleted by the next batch.
        """
        if not completions:
            return []
        call = self.prepare_complete(completions)
        if call is None:
            return []
        try:
            reply = await self.scripts.call("complete", keys=call.keys, args=call.args)
        except BaseException:
            call.failed()
            raise
        return call.applied(reply)

    def prepare_complete(self, completions: Sequence[Completion]) -> CompleteCall | None:
        """The ``complete.lua`` call of ``completions``, for a caller that sends it itself
        (:meth:`complete`, or fast mode's pop that carries it: ``carrying.py``).

        Guards are given here (see :meth:`complete`): the caller must end the call with
        exactly one of :meth:`CompleteCall.applied` (the script's reply) or
        :meth:`CompleteCall.failed` (not known to be applied).

        Returns:
            The call, or ``None`` when the batch has nothing to apply.
        """
        fresh = guard_unfenced(completions, self.kind)
        forget, self._settled = self._settled, []
        keys, conn = self.keys, self.conn
        entries, strings = encode_batch(completions, self.kind, keys.record(""), forget)
        if not entries:
            self._settled = forget
            return None
        args = [
            keys.prefix,
            GROUP,
            conn.dead_letter_cap,
            encode_entries(entries),
            conn.dead_letter_ttl,
            conn.dead_letter_max_bytes,
            NOTIFY_INLINE_MAX,
            self.lease.consumer if self.lease is not None else "",
            "",  # not quiet: records are announced on their done channel
            "" if conn.cluster else "1",  # ... only to one with a subscriber (one server)
            *strings,  # from ARGV[STRINGS_AT]
        ]
        keys_ = [keys.schedule, keys.schedule_data, keys.dead_letters]
        return CompleteCall(self, completions, keys_, args, fresh, forget)

    # --------------------------------------------------------------- lifecycle
    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.conn.ping()

    async def close(self) -> None:
        """Close the shared connection (see :meth:`.RedisConnection.close`)."""
        await self.conn.close()
