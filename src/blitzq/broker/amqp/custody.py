"""Custody of long-held RabbitMQ deliveries in the state store, and the dead-letter drain.

**Why.** RabbitMQ closes the channel of a consumer that leaves a delivery unacked longer than
its ``consumer_timeout`` (30 minutes by default; 3.10 has only the server-wide setting) and
redelivers the message: a task running longer would run twice. So a worker never holds a
delivery that long. Its maintenance round (every third of the visibility timeout) calls
:meth:`Custody.maintain`, which hands each delivery held longer than the visibility timeout
to the Redis state store: the message and its delivery count are written to
``{ns}:ac:<queue>`` with a lease in ``{ns}:acl:<queue>`` (expiry on Redis's clock), and only
then is the delivery acked on RabbitMQ. The worker renews the lease each round while the task
runs; the completion's ack (:meth:`~.transport.AmqpTransport.ack`) deletes the entry. Should
the worker die, its leases lapse and any worker's maintenance publishes the message again
(with its delivery count in a header), or dead-letters it once it has had ``max_deliveries``:
the same at-least-once promise as an unacked delivery, without RabbitMQ's timeout.

A lapsed entry is claimed by moving its lease forward in a ``WATCH``/``MULTI`` transaction
(one claimer wins), published, then deleted: a crash in between leaves it to lapse again, so
it is published at least once, never lost.

**Dead letters.** Messages past a queue's ``x-delivery-limit`` are dead-lettered by RabbitMQ
into ``<namespace>.dead-letter``; the same round moves them into the state store's dead
letters (reason ``"max deliveries exceeded"``, with a ``dead_lettered`` record, as the Redis
streams transport writes them), then acks them, so ``Queue.dead_letters()`` lists them. A
message whose task's completion is committed already (:func:`.redelivered.committed`: its
record is final, or ``retrying`` past this attempt) is over and only acked: its ack was lost
(the worker died, or its connection dropped, before RabbitMQ read it) and the deliveries
that followed spent the limit. A pack (``packs.py``) becomes one dead letter per task whose
completion is not committed. Nothing is lost, nothing finished is listed as dead; the store
itself never writes a dead letter over a final record either (``complete.lua``), should the
records not be readable here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis.exceptions

from ... import records
from ...exceptions import BrokerError
from ...serialization import envelope_head
from ..redis.client import translate_errors
from ..redis.connection import RedisConnection
from ..state import StateStore
from ..transport import backstop_note, solo_plan
from ..values import Completion, DeadLetterFields
from .channels import DELIVERIES, FAILURES, AmqpLink, header_int, settle, translate
from .deliveries import Consumer, Held
from .packs import decode, is_pack
from .pausing import hand_back
from .publishing import BACKSTOPS
from .redelivered import committed

logger = logging.getLogger("blitzq.broker.amqp")

#: Reason of a dead letter RabbitMQ dead-lettered past ``x-delivery-limit`` (as on Redis).
MAX_DELIVERIES_REASON = "max deliveries exceeded"
#: Times a task may reach RabbitMQ's ``x-delivery-limit`` and be published again by the
#: dead-letter drain (its count in the header :data:`.publishing.BACKSTOPS`) before it is a
#: dead letter whatever its solo runs: a message that kills its worker before it starts
#: counts no solo run, and would go round forever.
BACKSTOP_ROUNDS = 3


def _error(deliveries: int, limit: int) -> str:
    return (
        f"delivered {deliveries} times without completing ({backstop_note(limit)}); "
        "the worker running it probably crashed"
    )


class Kept(Protocol):
    """What custody reads and calls of the transport whose deliveries it keeps
    (:class:`~.transport.AmqpTransport`), so it needs no import of the transport."""

    link: AmqpLink
    held: dict[bytes, Held]
    consumers: dict[str, Consumer]

    async def publish_with(
        self, queue: str, messages: Sequence[bytes], deliveries: int, backstops: int = 0
    ) -> None:
        """Publish ``messages`` on ``queue`` as delivered ``deliveries`` times before (and
        dead-lettered by RabbitMQ's delivery limit ``backstops`` times)."""

    def forget_lost(self, queue: str) -> int:
        """Drop the unacked deliveries of ``queue`` whose connection is gone."""


class Custody:
    """The state store's custody of long-held deliveries (see the module docstring).

    Args:
        conn: the state store's Redis connection (keys and client).
        store: the state store, which writes dead letters and their records.

    Attributes:
        transport: the transport whose deliveries it keeps (:class:`Kept`), given by the
            broker once both are made (``broker.py``).
    """

    def __init__(self, conn: RedisConnection, store: StateStore) -> None:
        self.conn = conn
        self.keys = conn.keys
        self.client: Any = conn.client
        self.store = store
        self.transport: Kept | None = None
        self._lease = 60.0
        self._store_lost = False

    @translate_errors
    async def _now(self) -> float:
        seconds, micros = await self.client.time()
        return int(seconds) + int(micros) / 1e6

    async def maintain(
        self, queue: str, min_idle: float, count: int, max_deliveries: int, record_ttl: int
    ) -> tuple[int, int]:
        """One maintenance round for ``queue``: hand over, renew, recover, drain.

        Args:
            queue: physical queue.
            min_idle: seconds a delivery may be held before it is handed over; also the
                custody lease (the visibility timeout).
            count: most lapsed entries (and dead-lettered messages) handled.
            max_deliveries: deliveries after which a lapsed entry is dead-lettered.
            record_ttl: seconds the ``dead_lettered`` record is kept.

        Returns:
            ``(published again, dead-lettered)``.

        Raises:
            BrokerError: Redis or RabbitMQ could not be reached.
        """
        self._lease = min_idle
        await self.check_store()  # Redis first: with the store down, nothing is handed back
        await self.hand_over(queue, min_idle)
        await self.release_stale(queue, min_idle)
        requeued, dead = await self._recover(queue, count, max_deliveries, record_ttl)
        again, lost = await self.abandon(queue, min_idle, max_deliveries, record_ttl)
        dead += await self.drain_dead_letters(count, record_ttl)
        return requeued + again, dead + lost

    async def check_store(self) -> None:
        """Raise BrokerError while Redis does not answer. The first round after an outage
        counts every held delivery as heartbeated now: completions the worker could not
        commit meanwhile get a visibility timeout to land before a delivery is taken for
        abandoned (else it would be handed back and run again, spending a delivery).
        """
        try:
            await self._now()
        except BrokerError:
            self._store_lost = True
            raise
        if self._store_lost and self.transport is not None:
            self._store_lost = False
            now = time.monotonic()
            for held in self.transport.held.values():
                held.beat = max(held.beat, now)

    async def abandon(
        self, queue: str, min_idle: float, max_deliveries: int, record_ttl: int
    ) -> tuple[int, int]:
        """Hand back this process's unacked deliveries of ``queue`` not heartbeated for
        ``min_idle`` seconds (the worker no longer runs them): ``basic.nack`` with requeue
        (RabbitMQ counts the delivery), or, delivered ``max_deliveries`` times already, a
        dead letter in the store and an ack; return ``(requeued, dead-lettered)``."""
        transport = self.transport
        if transport is None:
            return (0, 0)
        limit = time.monotonic() - min_idle
        lapsed = [
            (token, held)
            for token, held in transport.held.items()
            if held.queue == queue and held.state == "held" and held.beat <= limit
        ]
        requeued = dead = 0
        for token, held in lapsed:
            transport.held.pop(token, None)
            if held.deliveries >= max_deliveries:
                body = held.message.body
                await self._dead_letter(queue, body, held.deliveries, max_deliveries, record_ttl)
                await settle(held.message, True)
                dead += 1
            elif held.message.pack is not None:
                # One task of a pack: published again alone, this delivery counted (as a
                # basic.nack would count it); the pack's other tasks go on.
                await transport.publish_with(queue, [held.message.body], held.deliveries)
                await settle(held.message, True)
                requeued += 1
            else:
                await settle(held.message, False)
                requeued += 1
        return requeued, dead

    async def release_stale(self, queue: str, age: float) -> int:
        """Hand back what ``queue``'s consumer prefetched over ``age`` seconds ago and no
        fetch took (every slot busy, e.g. with long tasks whose deliveries custody acked):
        published again, then acked, so RabbitMQ's ``consumer_timeout`` never fires on them
        and no delivery is spent; another worker with free slots may take them. Returns
        how many. The channel is confirmed first, as before a fetch takes from the buffer
        (:meth:`.deliveries.Consumer.confirm`): a worker that resumes from a stall past the
        heartbeat finds its buffer old, but RabbitMQ took those messages back with its
        channel, and publishing them again would make a second copy of each."""
        transport = self.transport
        consumer = transport.consumers.get(queue) if transport is not None else None
        if transport is None or consumer is None or consumer.epoch != transport.link.epoch:
            return 0
        if consumer.unconfirmed():
            try:
                await consumer.confirm()
            except FAILURES:  # the channel is gone and the buffer dropped: RabbitMQ has them
                return 0
        stale = consumer.stale(age)
        await hand_back(transport, queue, stale)
        return len(stale)

    async def hand_over(self, queue: str, min_idle: float) -> int:
        """Move deliveries of ``queue`` held over ``min_idle`` seconds into custody, then
        ack them on RabbitMQ; return how many."""
        transport = self.transport
        if transport is None:
            return 0
        transport.forget_lost(queue)
        limit = time.monotonic() - min_idle
        due = [
            (token, held)
            for token, held in transport.held.items()
            if held.queue == queue and held.state == "held" and held.since <= limit < held.beat
        ]
        if not due:
            return 0
        for _, held in due:
            held.state = "handing"
        try:
            await self._write(queue, [(t, h.deliveries, h.message.body) for t, h in due])
        except BrokerError:
            for _, held in due:
                if held.state == "handing":
                    held.state = "held"
            raise
        released: list[bytes] = []
        for token, held in due:
            await settle(held.message, True)
            if held.state == "done":  # completed while it was being handed over
                released.append(token)
            else:
                held.state = "custody"
        if released:
            await self.release(queue, released)
        logger.info("%d long-running deliveries of %s handed to the state store", len(due), queue)
        return len(due)

    @translate_errors
    async def _write(self, queue: str, items: Sequence[tuple[bytes, int, bytes]]) -> None:
        expiry = await self._now() + self._lease
        async with self.client.pipeline(transaction=True) as pipe:
            for token, deliveries, body in items:
                pipe.hset(self.keys.custody(queue), token, b"%d\n" % deliveries + body)
                pipe.zadd(self.keys.custody_leases(queue), {token: expiry})
            pipe.sadd(self.keys.custody_queues, queue)
            await pipe.execute()

    @translate_errors
    async def queues(self) -> set[str]:
        """The queues that have had deliveries in custody (``{ns}:acq``, never shrunk: at
        most every queue of the namespace), which every worker's recovery looks at."""
        names = await self.client.smembers(self.keys.custody_queues)
        return {n.decode() if isinstance(n, bytes) else str(n) for n in names}

    @translate_errors
    async def renew(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Extend the leases of the custody entries ``tokens`` of ``queue``; return how many
        are still this process's (an entry recovered by another worker is dropped: its
        lease is never taken back)."""
        if not tokens:
            return 0
        try:
            expiry = await self._now() + self._lease
        except BrokerError:
            self._store_lost = True
            raise
        leases = self.keys.custody_leases(queue)
        async with self.client.pipeline(transaction=False) as pipe:
            for token in tokens:
                pipe.zadd(leases, {token: expiry}, xx=True, ch=True)
            changed = await pipe.execute()
        renewed = 0
        for token, n in zip(tokens, changed, strict=True):
            if n:
                renewed += 1
            elif self.transport is not None:
                self.transport.held.pop(token, None)
        return renewed

    @translate_errors
    async def release(self, queue: str, tokens: Sequence[bytes]) -> None:
        """Delete custody entries: their task completed (or they were published again)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.custody(queue), *tokens)
            pipe.zrem(self.keys.custody_leases(queue), *tokens)
            await pipe.execute()

    @translate_errors
    async def _claim(self, queue: str, token: bytes, now: float) -> bytes | None:
        """Take a lapsed entry (its lease moved forward, so one claimer wins); its stored
        value, or ``None`` when it is gone or someone else renewed or claimed it."""
        leases = self.keys.custody_leases(queue)
        async with self.client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(leases)
                score = await pipe.zscore(leases, token)
                if score is None or float(score) > now:
                    return None
                value = await pipe.hget(self.keys.custody(queue), token)
                pipe.multi()
                pipe.zadd(leases, {token: now + self._lease})
                await pipe.execute()
            except redis.exceptions.WatchError:
                return None
        if value is None:
            await self.release(queue, [token])
        return value  # type: ignore[no-any-return]

    async def _recover(
        self, queue: str, count: int, max_deliveries: int, record_ttl: int
    ) -> tuple[int, int]:
        transport = self.transport
        if transport is None:
            return (0, 0)
        now = await self._now()
        lapsed = await _zrange_due(self, queue, now, count)
        requeued = dead = 0
        for token in lapsed:
            # One of this process's own lapsed too: it was not heartbeated (abandoned).
            transport.held.pop(token, None)
            value = await self._claim(queue, token, now)
            if value is None:
                continue
            head, _, body = value.partition(b"\n")
            deliveries = int(head or 0)
            if deliveries >= max_deliveries:
                await self._dead_letter(queue, body, deliveries, max_deliveries, record_ttl)
                dead += 1
            else:
                await transport.publish_with(queue, [body], deliveries)
                requeued += 1
            await self.release(queue, [token])
        if requeued or dead:
            logger.warning("recovered %d message(s) of %s from custody", requeued + dead, queue)
        return requeued, dead

    async def _dead_letter(
        self, queue: str, body: bytes, deliveries: int, limit: int, record_ttl: int
    ) -> None:
        """Store a dead letter (and its ``dead_lettered`` record) for ``body``."""
        now = time.time()
        head = envelope_head(body)
        task_id, task = head if head is not None else (f"unknown-{time.time_ns()}", "")
        error = _error(deliveries, limit)
        record = records.deliveries_exceeded(task_id, task, queue, deliveries, error, now)
        reason = MAX_DELIVERIES_REASON
        dead = DeadLetterFields(body, reason, error, task, queue, now, "")  # one kind: RabbitMQ
        await self.store.complete(
            [Completion(queue, None, task_id, record, record_ttl, dead_letter=dead)]
        )

    async def drain_dead_letters(self, count: int, record_ttl: int) -> int:
        """Move up to ``count`` messages of RabbitMQ's dead-letter queue on: return how many
        messages. A task whose completion is committed is over (acked, no dead letter); the
        others are published again alone, marked as delivered once, while the backstop may
        have been reached by bystanders' crashes (:meth:`_backstopped`), else each becomes a
        dead letter in the state store; then the message is acked there.

        Raises:
            BrokerError: RabbitMQ or Redis could not be reached.
        """
        transport = self.transport
        if transport is None:
            return 0
        link = transport.link
        moved = 0
        while moved < count:
            try:
                dlq = await link.dead_letters()
                message = await dlq.get(no_ack=False, fail=False)
            except FAILURES as exc:
                if isinstance(exc, BrokerError):
                    raise
                raise translate(exc, "reading the dead-letter queue") from None
            if message is None:
                return moved
            headers = message.headers or {}
            queue = link.physical(str(headers.get("x-first-death-queue") or ""))
            before = header_int(headers, DELIVERIES)
            deliveries = link.max_deliveries + before
            rounds = header_int(headers, BACKSTOPS) + 1
            bodies = decode(message.body) if is_pack(headers) else None
            packed = bodies is not None and len(bodies) > 1
            if bodies is None:
                bodies = [message.body]
            # A task whose completion is committed already (its ack was lost: the worker
            # died or its connection dropped before RabbitMQ read it) is over: no dead
            # letter of it; a pack's other tasks are dead letters of their own.
            over = await committed(self.store, bodies)
            again = [body for body, done in zip(bodies, over, strict=True) if not done]
            if again and await self._backstopped(again[0], packed, rounds):
                await transport.publish_with(queue, again, 1, rounds)
                again = []
            for body in again:
                await self._dead_letter(queue, body, deliveries, deliveries, record_ttl)
            if any(over):
                logger.info(
                    "%d dead-lettered task(s) of %s had completed already: acked, no dead "
                    "letter written",
                    sum(over),
                    queue,
                )
            await settle(message, True)
            moved += 1
        return moved

    async def _backstopped(self, body: bytes, packed: bool, rounds: int) -> bool:
        """Whether the tasks of one message RabbitMQ dead-lettered past its
        ``x-delivery-limit`` (the backstop, ``rounds`` times so far; ``body``: its first
        task's message) are published again rather than dead-lettered: RabbitMQ counts
        every crash of a worker that merely held a message (prefetched, or a pack's task
        beside a poison one), so the backstop alone does not show a task crashed its
        workers.

        - ``max_deliveries=1``: never (a redelivery is a dead letter).
        - a pack (it reached the limit unsplit: its tasks were not tried one by one yet):
          always.
        - a plain message: while the task's solo runs (``{ns}:solo:<id>``,
          :mod:`blitzq.worker.solo`, the runs only it could have crashed) are below its
          budget; a store that does not answer counts as spent (dead letter).

        Either way no more than :data:`BACKSTOP_ROUNDS` times: a message that kills its
        worker before it ever starts (no solo run counted) is dead-lettered then.
        """
        max_deliveries = self.transport.link.max_deliveries if self.transport else 1
        if max_deliveries <= 1 or rounds > BACKSTOP_ROUNDS:
            return False
        if packed:
            return True
        budget = solo_plan(max_deliveries)[1]
        head = envelope_head(body)
        if head is None:
            return False
        try:
            runs = await self.store.records.solo_runs(head[0])
        except (BrokerError, NotImplementedError) as exc:
            logger.debug("could not read the solo runs of %s: %s", head[0], exc)
            return False
        if runs >= budget:
            return False
        logger.info(
            "task %s reached RabbitMQ's delivery limit with %d of %d solo run(s): published "
            "again (crashes of the workers that held it, not its own)",
            head[0],
            runs,
            budget,
        )
        return True


@translate_errors
async def _zrange_due(custody: Custody, queue: str, now: float, count: int) -> list[bytes]:
    leases = custody.keys.custody_leases(queue)
    found = await custody.client.zrangebyscore(leases, "-inf", now, start=0, num=count)
    return list(found)
