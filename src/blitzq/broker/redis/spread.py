"""The spread layout: a namespace's queues spread over a Redis Cluster's slots.

On one slot (phase A's layout, ``?layout=slot``) every key of a namespace shares the hash
tag ``{ns}``, so one namespace lives on one shard. The spread layout (the default on a
cluster) splits a broker in two halves that never share a script:

- the **transport** (:class:`SpreadStreamsTransport`, reliable mode's streams) keeps each
  queue in a slot of its own: every priority level's stream and consumer group and the
  relay's hand-off marks of a queue ``q`` are under the tag ``{<ns>:q:<q>}``
  (:class:`SpreadKeys`), so a fetch still reads the levels of one queue in one script;
- the **state store** (:class:`~.homes.HomedStateStore`) keeps a *homed* task's own keys
  (its record, progress and their channels: the ids the producer generates here,
  ``<hex>.<queue>``, ``homes.py``) under its queue's tag, and everything else (schedule,
  dead letters, workflows, unique keys, locks, rate buckets, periodic claims, registries,
  the outbox, and the own keys of ids chosen by the caller) under ``{<ns>}``.

The common completion (an ack, a homed record, a requeue onto its queue, progress) is one
``complete.lua`` call in the queue's slot (:meth:`SpreadPairing.hold_then_commit`), as on one
slot. The others are joined as any *foreign pairing* is: held, applied in the store (the
namespace's part), then acked on the transport with the home's part (at-least-once); what the
store writes into queues goes to its outbox, which the relay hands to the queue's slot
idempotently (``handoff.py``: each batch has a stable id and is published under a mark in
the queue's slot, so a relay that dies after publishing never doubles it). Two steps of
the transport that wrote into the namespace's keys are split here:

- **recovery** (:meth:`SpreadStreamsTransport.recover`): ``recover_split.lua`` re-adds entries
  under their delivery budget and returns the ones past it, still pending; the transport
  dead-letters those through the store (with their ``dead_lettered`` record), then acks
  them. A crash in between leaves them pending: recovered again, dead-lettered again under
  the same task id (idempotent), never lost.
- **fencing** (:class:`SpreadPairing`, hold-then-commit-then-ack): before the store
  applies a batch of completions, ``hold.lua`` keeps those whose delivery this consumer
  still holds and renews their leases (a full visibility timeout to apply and ack them);
  the others are stale, refused whole and counted in ``stale_completions``, as on one slot.

Every script works on one slot: a transport script or a homed completion on one queue's
tag, a store script on ``{ns}``. docs/architecture.md ("Redis Cluster", and "Redis Cluster:
per-task state in the queue's slot") says why no cross-slot step loses or doubles a task.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from ...limits import CHUNK_ITEMS, DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from ...records import deliveries_exceeded
from ...routing import base_queue
from ...serialization import envelope_head
from ..facade import Broker
from ..outbox import Outbox, Relay
from ..pairing import CommitThenAck
from ..state import StateStore
from ..transport import backstop_note
from ..values import Completion, DeadLetterFields, HeldBack
from .client import REDIS_ERRORS, broker_error, translate_errors
from .cluster_scripts import briefly, migrating
from .connection import DEFAULT_DEAD_LETTER_CAP, RedisConnection, RedisDeadLetterLimits
from .doorbell import READY, Doorbell
from .handoff import MARK_TTL, MAX_AGE, HandoffRelay
from .homes import HomedKeys, HomedStateStore, complete_in, homed_id, homeless, split_home
from .keys import GROUP, Keys
from .replicas import durably
from .scripts import holder_waits
from .streams import StreamsTransport

__all__ = [
    "SpreadKeys",
    "SpreadPairing",
    "SpreadRedisBroker",
    "SpreadStreamsTransport",
    "spread_broker",
]

#: Reason and error of a dead letter recovery writes (the same as ``recover.lua``'s).
MAX_DELIVERIES_REASON = "max deliveries exceeded"


@dataclass(frozen=True, slots=True)
class SpreadKeys(Keys):
    """The transport's key names on the spread layout: a queue's keys under its own tag.

    ``stream("q:high")`` is ``{<ns>:q:q}:s:q:high``: the levels ``q:high``, ``q``, ``q:low``
    share the tag of their queue ``q`` (``routing.base_queue``), so a fetch of every level
    (``fetch_levels.lua``) stays in one slot. Every other key is the namespace's.
    """

    def queue_tag(self, queue: str) -> str:
        """``{<ns>:q:<queue>}:`` for a physical queue of ``queue`` (any priority level)."""
        return "{" + self.namespace + ":q:" + base_queue(queue) + "}:"

    def stream(self, queue: str) -> str:
        """The stream of the physical queue ``queue``, under its queue's tag."""
        return self.queue_tag(queue) + "s:" + queue

    def idle(self, queue: str) -> str:
        """The watch mark of ``queue``'s base queue, under its queue's tag
        (``doorbell.py``)."""
        return self.queue_tag(queue) + "idle:" + base_queue(queue)

    def handed(self, queue: str, consumer: str) -> str:
        """Entry ids of ``queue``'s stream handed to ``consumer``, in the queue's slot."""
        return self.queue_tag(queue) + "handed:" + queue + ":" + consumer

    def mark(self, queue: str, batch: str) -> str:
        """The hand-off mark of relay batch ``batch`` published on ``queue``
        (``handoff_publish.lua``), in the queue's slot."""
        return self.queue_tag(queue) + "h:" + batch


class SpreadStreamsTransport(StreamsTransport):
    """The streams transport with each queue in its own slot (:class:`SpreadKeys`).

    Fetch, publish, heartbeat, nack, ack, stats and purge are the streams transport's; they
    name only the stream keys of one queue. Recovery (which dead-letters in the store),
    the fencing check and the hand-off are the spread layout's (:meth:`recover`,
    :meth:`held`, :meth:`publish_once`).

    Args:
        conn: a connection of kind ``"s"`` whose ``keys`` are :class:`SpreadKeys`.

    Attributes:
        store: the state store that recovery dead-letters in, set once both are made
            (:func:`spread_parts`).
    """

    keys: SpreadKeys
    store: StateStore

    @translate_errors
    async def recover_split(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, list[tuple[bytes, bytes, int]]]:
        """Re-add entries idle over ``min_idle`` seconds (over their holder's time for a
        consumer of ``holders``) under their delivery budget; return how many, and
        ``(entry id, message, deliveries)`` of those at the budget (still pending, now this
        consumer's; deliveries 0: an entry without a message field, its fields as
        MessagePack) for the caller to dead-letter and ack (``recover_split.lua``).
        """
        reply = await self.scripts.call(
            "recover_split",
            keys=[self.keys.stream(queue)],
            args=[
                GROUP,
                self.consumer,
                max(1, int(min_idle * 1000)),
                count,
                max_deliveries,
                *holder_waits(holders, min_idle),
            ],
        )
        over = [(reply[i], reply[i + 1], int(reply[i + 2])) for i in range(1, len(reply), 3)]
        return int(reply[0]), over

    @briefly
    async def recover(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        record_ttl: int = 86400,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, int]:
        """See :meth:`Transport.recover <blitzq.broker.transport.Transport.recover>`:
        :meth:`recover_split` re-adds what is under budget; the entries past it are
        dead-lettered in :attr:`store` with their ``dead_lettered`` record (one ``complete``
        call), then acked. A crash in between leaves them pending: recovered again,
        dead-lettered again under the same task id (idempotent), never lost. A migrating
        slot is not waited for (:func:`~.cluster_scripts.briefly`): the next round tries
        again."""
        requeued, over = await self.recover_split(queue, min_idle, count, max_deliveries, holders)
        if requeued and self.conn.doorbell is not None:  # an idle worker is told
            await self.ring(queue)
        if not over:
            return requeued, 0
        now = time.time()
        dead = [
            _dead_letter(queue, token, message, deliveries, max_deliveries, now, record_ttl)
            for token, message, deliveries in over
        ]
        await self.store.complete(dead)
        await self.ack(queue, [token for token, _, _ in over])
        return requeued, len(over)

    @translate_errors
    async def held(self, queue: str, tokens: Sequence[bytes]) -> set[bytes]:
        """The entries of ``tokens`` this consumer still holds, their leases renewed
        (``hold.lua``, one call per :data:`~blitzq.limits.CHUNK_ITEMS` tokens)."""
        out: set[bytes] = set()
        key, consumer = self.keys.stream(queue), self.consumer
        for start in range(0, len(tokens), CHUNK_ITEMS):
            chunk = list(tokens[start : start + CHUNK_ITEMS])
            out.update(await self.scripts.call("hold", keys=[key], args=[GROUP, consumer, *chunk]))
        return out

    @translate_errors
    async def publish_once(
        self, queue: str, batch: str, taken_at: float, messages: Sequence[bytes]
    ) -> int:
        """Publish relay batch ``batch`` on ``queue`` unless it was published before
        (``handoff_publish.lua``: a mark in the queue's slot and the XADDs in one step).

        Args:
            queue: the physical queue.
            batch: the batch id the store gave it (``handoff_take.lua``).
            taken_at: when it was first taken (Unix seconds, the store node's clock).
            messages: the batch, at most 1000 messages.

        Returns:
            Messages added; 0 when the batch was published before; -1 when it is older than
            :data:`~.handoff.MAX_AGE` (refused: its mark may be gone).
        """
        added = int(
            await self.scripts.call(
                "handoff_publish",
                keys=[self.keys.stream(queue), self.keys.mark(queue, batch)],
                args=[MARK_TTL, repr(float(taken_at)), MAX_AGE, *messages],
            )
        )
        if added > 0 and self.conn.doorbell is not None:
            await self.ring(queue)
        return added

    async def ring(self, queue: str) -> None:
        """Announce a message just added to ``queue`` when an idle worker watches it: the
        watch mark taken (deleted) after the write (a look made before the write is told;
        one made after it takes the message: ``doorbell.py``)."""
        base = base_queue(queue)
        if await self.client.delete(self.keys.idle(base)):
            await self.client.publish(self.keys.events, f"{READY}:{base}")


def spread_broker(conn: RedisConnection) -> Broker:
    """Reliable mode on the spread layout over ``conn``'s client (see the module docstring):
    a :class:`SpreadStreamsTransport` with each queue in its own slot (its own connection,
    :class:`SpreadKeys`, on the same client) and the :class:`~.homes.HomedStateStore` on
    ``conn`` (keys under ``{ns}``, but a homed task's own under its queue's tag), joined by
    :class:`SpreadPairing`; the broker generates homed task ids (``task_ids``:
    :func:`~.homes.homed_id`).

    Args:
        conn: the state store's connection (any kind: the store writes to its outbox); its
            ``keys`` become :class:`~.homes.HomedKeys`.
    """
    conn.keys = HomedKeys(conn.keys.namespace)  # a homed id's own keys in its queue's slot
    transport_conn = RedisConnection(conn.url, conn.keys.namespace, client=conn.client, kind="s")
    transport_conn.keys = SpreadKeys(conn.keys.namespace)
    if transport_conn.cluster:  # no read covers many slots: looks woken by a doorbell
        transport_conn.blocking, transport_conn.doorbell = None, Doorbell()
    transport = SpreadStreamsTransport(transport_conn)
    store = HomedStateStore(conn, transport.held)
    transport.store = store  # recovery dead-letters in the store
    pairing = SpreadPairing(transport, store)
    broker = Broker(transport, store, pairing, dead_letter_limits=RedisDeadLetterLimits(conn))
    broker.task_ids = homed_id
    return broker


def SpreadRedisBroker(
    url: str,
    namespace: str,
    *,
    dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
    client: aioredis.Redis | None = None,
    dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
    dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
) -> Broker:
    """Reliable mode on the spread layout (:func:`spread_broker`) on a new connection.

    Args:
        url: a Redis Cluster node's URL (any URL of a Redis server works: a single server
            holds every slot).
        namespace: the namespace (no ``{`` or ``}``).
        dead_letter_cap: dead letters kept before the oldest are dropped.
        client: an existing client to use instead of ``url`` (not closed by the broker).
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept.

    Returns:
        A :class:`~blitzq.broker.Broker`: ``transport`` the :class:`SpreadStreamsTransport`
        (its connection ``transport.conn``, :class:`SpreadKeys`), ``state`` the
        :class:`~.homes.HomedStateStore` (``state.conn``, keys under ``{ns}`` but a homed
        task's own under its queue's tag, sharing the client), ``pairing`` a
        :class:`SpreadPairing` (it fences, as on one slot), ``task_ids``
        :func:`~.homes.homed_id`.

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value.
    """
    conn = RedisConnection(
        url,
        namespace,
        dead_letter_cap=dead_letter_cap,
        client=client,
        dead_letter_ttl=dead_letter_ttl,
        dead_letter_max_bytes=dead_letter_max_bytes,
        kind="l",  # the store is made with its outbox: it writes no list
    )
    return spread_broker(conn)


class SpreadPairing(CommitThenAck):
    """The pairing of the spread layout: the common completion in its queue's slot, the
    others held, then committed, then acked.

    A completion that writes only its own delivery's ack, a homed record, a requeue onto its
    queue and progress is applied with the ack in one script in the queue's slot
    (:func:`~.homes.complete_in`, fenced there as on one slot). For the others, before the
    store applies them, the transport keeps the completions whose delivery
    (``token`` or ``fence``) this consumer still holds and renews their leases
    (:meth:`SpreadStreamsTransport.held`, ``hold.lua``); the others are stale, refused whole
    and counted as ``stale_completions``, as on one slot. The rest is
    :class:`~blitzq.broker.pairing.CommitThenAck`, with the idempotent hand-off relay
    (:class:`~.handoff.HandoffRelay`).

    Args:
        transport: the spread layout's streams transport.
        state: its state store (made with its :class:`~.handoff.SpreadOutbox`).
    """

    transport: SpreadStreamsTransport
    state: HomedStateStore
    fences = True

    def __init__(self, transport: SpreadStreamsTransport, state: HomedStateStore) -> None:
        super().__init__(transport, state)
        self.complete = self.hold_then_commit

    def make_relay(self, outbox: Outbox) -> Relay:
        """A :class:`~.handoff.HandoffRelay` from the store's :class:`~.handoff.SpreadOutbox`."""
        return HandoffRelay(self.state.outbox, self.transport, self.transport.publish_once)

    @translate_errors
    @durably
    @briefly
    async def hold_then_commit(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply the colocated completions in their queue's slot (``homes.complete_in``: one
        script per queue, which fences, acks and writes the homed records); fence, then
        :meth:`commit_then_ack` the others (namespace-wide writes, unhomed records); return
        the stale ones with those the store refused (docs/architecture.md, "Redis Cluster:
        per-task state in the queue's slot"). Durable: each script is waited for by its
        shard's replicas that exist (``cluster_replicas.py``).

        Each part goes on its own: a part whose slot migrates (or whose node is failing
        over) is held back, the others are applied, and :class:`HeldBack`
        says which are which (a script does not wait for a migration,
        :func:`~.cluster_scripts.briefly`: the worker retries the held ones).

        Raises:
            HeldBack: a part could not be applied now (its slot migrates, or its node is
                failing over: ``unavailable``) and another part was, or a slot migrates.
            BrokerError: nothing was applied: the error of the first part (a refusal, or
                the server is down).
        """
        keys = self.state.keys
        near: dict[str, list[Completion]] = {}
        far: list[Completion] = []
        for c in completions:
            tag = keys.queue_home(c.queue)
            if homeless(c) or (keys.home(c.task_id) != tag and (c.record is not None or c.ops)):
                far.append(c)
            else:
                near.setdefault(tag, []).append(c)
        stale: list[Completion] = []
        near_stale = 0  # split_commit counts its own
        parts: list[tuple[str | None, list[Completion]]] = [*near.items()]
        if far:
            parts.append((None, far))
        held: list[Completion] = []
        errors: list[BaseException] = []
        for home, part in parts:
            try:
                done = await self._apply(home, part)
            except REDIS_ERRORS as exc:
                if not (_moving(exc) or broker_error(exc).unavailable):
                    # A refusal (the worker writes the batch in parts to find it) or a lost
                    # connection (the worker retries the batch, or finds a write too big).
                    raise
                errors.append(exc)
                held += part
                continue
            stale += done
            near_stale += len(done) if home is not None else 0
        if near_stale:
            with contextlib.suppress(*REDIS_ERRORS):  # a count only: never holds anything up
                await self.state.count_stale(near_stale)
        if not held:
            return stale
        if len(held) == len(completions) and not any(map(_moving, errors)):
            raise errors[0]  # nothing applied, no slot moving (the server is down): as one
        kept = {id(c) for c in held}
        raise HeldBack(
            str(broker_error(errors[0])),
            [c for c in completions if id(c) not in kept],
            stale,
            [c for c in completions if id(c) in kept],
        )

    async def _apply(self, tag: str | None, part: list[Completion]) -> list[Completion]:
        """Apply the colocated completions of queue tag ``tag`` (``None``: the others, by
        :meth:`split_commit`); the stale ones."""
        if tag is None:
            return await self.split_commit(part)
        stale = await complete_in(
            self.transport.conn, self.transport.lease.consumer, self.state.keys.home_keys(tag), part
        )
        if self.transport.conn.doorbell is not None:  # a requeue: an idle worker is told
            for queue in {c.queue for c in part if c.requeue is not None}:
                await self.transport.ring(queue)
        return stale

    async def split_commit(self, completions: Sequence[Completion]) -> list[Completion]:
        """Fence, then :meth:`commit_then_ack` the completions this consumer still holds;
        return the stale ones with those the store refused."""
        asked: dict[str, list[bytes]] = {}
        for c in completions:
            token = c.token if c.token is not None else c.fence
            if token is not None:
                asked.setdefault(c.queue, []).append(token)
        if not asked:
            return await self.commit_then_ack(completions)
        held: set[tuple[str, bytes]] = set()
        for queue, tokens in asked.items():
            held.update((queue, t) for t in await self.transport.held(queue, tokens))
        fresh: list[Completion] = []
        stale: list[Completion] = []
        for c in completions:
            token = c.token if c.token is not None else c.fence
            (fresh if token is None or (c.queue, token) in held else stale).append(c)
        if stale:
            await self.state.count_stale(len(stale))
        refused = await self.commit_then_ack(fresh) if fresh else []
        return stale + refused

    async def commit_then_ack(self, completions: Sequence[Completion]) -> list[Completion]:
        """See :meth:`CommitThenAck.commit_then_ack`; a homed completion of a delivery on its
        own queue is split (:func:`~.homes.split_home`): its namespace part is applied with
        the others first, then its record, requeue and progress with its ack in one script
        in the queue's slot (so its record and its ack commit together)."""
        keys = self.state.keys
        spaced, homes = split_home(keys, completions)
        if not homes:
            return await super().commit_then_ack(completions)
        refused = await super().commit_then_ack(spaced) if spaced else []
        dropped = {id(c) for c in refused}  # a refused namespace part: its home part waits
        originals = {id(ns): c for parts in homes.values() for c, _, ns in parts if ns is not None}
        refused = [originals.get(id(c), c) for c in refused]
        stale: list[Completion] = []
        for tag, parts in homes.items():
            kept = [(c, home) for c, home, ns in parts if ns is None or id(ns) not in dropped]
            if not kept:
                continue
            batch = [home for _, home in kept]
            consumer = self.transport.lease.consumer
            done = await complete_in(self.transport.conn, consumer, keys.home_keys(tag), batch)
            lost = {id(h) for h in done}
            stale += [c for c, home in kept if id(home) in lost]
        if stale:
            await self.state.count_stale(len(stale))
        return refused + stale


def _moving(exc: BaseException) -> bool:
    """Whether ``exc`` (a Redis error, or the :class:`~blitzq.BrokerError` made of one) says
    its slot is being migrated (``cluster_scripts.migrating``)."""
    return migrating(exc) or (exc.__cause__ is not None and migrating(exc.__cause__))


def _dead_letter(
    queue: str, token: bytes, message: bytes, deliveries: int, limit: int, now: float, ttl: int
) -> Completion:
    """The completion dead-lettering a recovered entry past its budget (``deliveries`` 0: an
    entry without a message field, ``message`` its fields), as ``recover.lua`` writes it:
    the dead letter and a ``dead_lettered`` record kept ``ttl`` seconds."""
    entry = token.decode()
    if deliveries == 0:
        fields = DeadLetterFields(
            message, "malformed message", 'stream entry has no "m" field', "", queue, now
        )
        return Completion(queue, None, entry, dead_letter=fields)
    head = envelope_head(message)
    task_id, task = head if head is not None else (entry, "")
    error = (
        f"delivered {deliveries} times without completing ({backstop_note(limit)}); "
        "the worker running it probably crashed"
    )
    record = deliveries_exceeded(task_id, task, queue, deliveries, error, now)
    fields = DeadLetterFields(message, MAX_DELIVERIES_REASON, error, task, queue, now)
    return Completion(queue, None, task_id, record, ttl, dead_letter=fields)
