"""The spread layout's outbox hand-off: store slot to queue slot, never lost, never doubled.

On the spread layout (``spread.py``) the state store's outbox is in the namespace's slot and
each queue in its own, so a relay's move is two steps on two slots. The generic relay
(:mod:`blitzq.broker.outbox`) is at-least-once: a relay that dies after publishing a batch
and before releasing it gets the batch put back and published again. Here the publish is
idempotent:

1. **take** (``handoff_take.lua``, store slot): a batch gets a **batch id** from
   ``{ns}:handoff:seq`` (INCR) and its first take time, kept with it in the relay's list
   (header ``"<id> <taken at>"``). A batch whose relay's lease lapses is moved *whole* to
   ``{ns}:handoff:lapsed`` (``handoff_restore.lua``), and the next relay takes it with the
   same id and time.
2. **publish** (``handoff_publish.lua``, queue slot): ``SET {<ns>:q:<queue>}:h:<id> NX EX``
   :data:`MARK_TTL`, and only when it was absent every ``XADD`` of the batch, in one
   script. A second publish of the same batch (by any relay) finds the mark and adds
   nothing.
3. **release** (store slot): the relay's list and lease are deleted.

The mark lives :data:`MARK_TTL` seconds; a batch may be published only while it is younger
than :data:`MAX_AGE` (checked in the publish script, by the queue node's clock, against the
take time on the store node's clock). Every publish attempt of a batch is therefore made
before ``taken_at + MAX_AGE``, and its mark (set at or after ``taken_at``) lives until at
least ``taken_at + MARK_TTL``: the :data:`MARK_TTL` ``-`` :data:`MAX_AGE` seconds between
them cover the clock skew of two nodes, so no attempt can come after the mark expired. A
batch older than :data:`MAX_AGE` (no relay could publish it for that long: the queue's
node down, every worker gone) is refused by the script and dead-lettered through the store
(reason ``"expired"``): it may or may not have been published, and an operator replays it
if it did not run. :data:`MAX_AGE` is five relay leases, so a batch restored after a lapsed
lease is published long before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from redis.exceptions import ResponseError

from ...serialization import envelope_head
from ..outbox import Relay
from ..state import StateStore
from ..transport import Transport
from ..values import Completion, DeadLetterFields
from .client import translate_errors
from .connection import RedisConnection
from .outbox import RedisOutbox
from .records import RedisRecords
from .store import RedisStateStore

logger = logging.getLogger("blitzq.broker")

#: The transport's check of held deliveries: ``(queue, tokens)`` -> the tokens still held.
Held = Callable[[str, Sequence[bytes]], Awaitable[set[bytes]]]

#: The transport's idempotent publish of a relay batch: ``(queue, batch id, taken at,
#: messages)`` -> messages added, 0 when published before, -1 when too old
#: (``SpreadStreamsTransport.publish_once``).
PublishOnce = Callable[[str, str, float, Sequence[bytes]], Awaitable[int]]

#: Seconds a batch may be published after its first take (5 relay leases of 60 s).
MAX_AGE = 300
#: Seconds a hand-off mark lives: :data:`MAX_AGE` plus 300 s of clock skew between nodes.
MARK_TTL = 600


class SpreadOutbox(RedisOutbox):
    """The Redis store's outbox with batch ids (see the module docstring).

    Args:
        conn: the state store's connection.
        store: the state store, which dead-letters a batch refused as too old.
    """

    def __init__(self, conn: RedisConnection, store: StateStore) -> None:
        super().__init__(conn)
        self.store = store

    @translate_errors
    async def take_batch(
        self, relay: str, queue: str, count: int, lease: float
    ) -> tuple[str, str, float, list[bytes]] | None:
        """One ``handoff_take.lua`` call: this relay's batch, a lapsed relay's batch, or a
        new one from ``queue``'s outbox (see :meth:`Outbox.take`).

        Returns:
            ``(queue, batch id, first taken at (Unix seconds), messages)``, or ``None``.
        """
        keys = self.keys
        reply = await self.scripts.call(
            "handoff_take",
            keys=[keys.relay(relay), keys.relays, keys.outboxes, keys.handoffs, keys.handoff_seq],
            args=[keys.prefix, relay, queue, count, repr(float(lease))],
        )
        if not reply:
            return None
        batch, _, taken_at = reply[1].decode().partition(" ")
        return reply[0].decode(), batch, float(taken_at), list(reply[2:])

    async def take(
        self, relay: str, queue: str, count: int, lease: float
    ) -> tuple[str, list[bytes]] | None:
        """See :meth:`Outbox.take` (the batch without its id: :meth:`take_batch` is the
        relay's)."""
        taken = await self.take_batch(relay, queue, count, lease)
        return None if taken is None else (taken[0], taken[3])

    @translate_errors
    async def restore(self, count: int) -> int:
        """One ``handoff_restore.lua`` call: the batches of up to ``count`` relays whose
        lease lapsed are kept whole, with their ids, for the next relay."""
        keys = self.keys
        restored = await self.scripts.call(
            "handoff_restore",
            keys=[keys.relays, keys.outboxes, keys.handoffs],
            args=[keys.prefix, count],
        )
        return int(restored)

    async def expire(self, queue: str, batch: str, messages: Sequence[bytes]) -> None:
        """Dead-letter the messages of a batch refused as older than :data:`MAX_AGE`
        (reason ``"expired"``), through the store.

        Raises:
            BrokerError: the store could not be reached (the batch stays this relay's).
        """
        now = time.time()
        error = (
            f"the outbox relay could not hand batch {batch} to queue {queue!r} within "
            f"{MAX_AGE} s; it may have been published already: replay it if it did not run"
        )
        dead = []
        for i, message in enumerate(messages):
            head = envelope_head(message)
            task_id, task = head if head is not None else (f"handoff-{batch}-{i}", "")
            fields = DeadLetterFields(message, "expired", error, task, queue, now)
            dead.append(Completion(queue, None, task_id, dead_letter=fields))
        logger.error("outbox relay: %s (%d message(s) dead-lettered)", error, len(messages))
        await self.store.complete(dead)


class HandoffRelay(Relay):
    """The :class:`~blitzq.broker.outbox.Relay` of the spread layout: each batch is
    published once (``publish_once``), whoever publishes it (module docstring).

    Args:
        outbox: the store's :class:`SpreadOutbox`.
        transport: the spread layout's streams transport.
        publish_once: its idempotent publish of a batch (:data:`PublishOnce`).
    """

    def __init__(
        self, outbox: SpreadOutbox, transport: Transport, publish_once: PublishOnce
    ) -> None:
        super().__init__(outbox, transport)
        self._handoff = outbox
        self.publish_once = publish_once

    async def drain(self, queues: Iterable[str] | None = None) -> int:
        """See :meth:`Relay.drain`; each batch goes through take, ``publish_once`` (nothing
        added when it was published before; dead-lettered when too old) and release.

        Returns:
            How many messages were added to queues by this call.
        """
        async with self._lock:
            outbox = self._handoff
            names = await outbox.pending() if queues is None else list(queues)
            moved = 0
            for queue in names:
                while True:
                    taken = await outbox.take_batch(self.id, queue, self.batch, self.lease)
                    if taken is None:
                        break
                    target, batch, taken_at, messages = taken
                    added = await self.publish_once(target, batch, taken_at, messages)
                    if added < 0:
                        await outbox.expire(target, batch, messages)
                    await outbox.release(self.id)
                    moved += max(added, 0)
                    self.relayed += max(added, 0)
                    if target == queue and len(messages) < self.batch:
                        break
            return moved


class SpreadRecords(RedisRecords):
    """The records role of the spread layout: progress is fenced by the transport's leases
    (:meth:`set_progress`), the store fencing nothing itself.

    Args:
        conn: the store's connection.
        kind: the store's write kind (``"o"``: it has an outbox).
        held: the transport's check of the deliveries this consumer still holds.
    """

    def __init__(self, conn: RedisConnection, kind: str, held: Held) -> None:
        super().__init__(conn, kind, None)
        self.held = held

    async def set_progress(
        self, task_id: str, data: bytes, at: float, ttl: int, fence: tuple[str, bytes] | None = None
    ) -> bool:
        """See :meth:`.RedisRecords.set_progress`; with ``fence``, stored only while this
        consumer holds that delivery (:attr:`held` first, which renews its lease)."""
        if fence is not None and not await self.held(fence[0], [fence[1]]):
            return False
        return await super().set_progress(task_id, data, at, ttl)


class SpreadStateStore(RedisStateStore):
    """The Redis state store of the spread layout: its outbox hands batches off
    idempotently (:class:`SpreadOutbox`), it counts the completions the pairing fenced off
    before they reached it (:meth:`count_stale`), and its records role fences progress by
    the transport's leases (:class:`SpreadRecords`).

    Args:
        conn: the store's connection (the namespace's keys).
        held: the transport's check of the deliveries this consumer still holds
            (``SpreadStreamsTransport.held``: ``(queue, tokens)`` -> the held tokens, their
            leases renewed).
    """

    outbox: SpreadOutbox
    """The store's outbox (it is always made with one)."""

    def __init__(self, conn: RedisConnection, held: Held) -> None:
        super().__init__(conn, outbox=True)
        self.held = held
        self.records: SpreadRecords = SpreadRecords(conn, self.kind, held)

    def make_outbox(self) -> SpreadOutbox:
        """A :class:`SpreadOutbox` (batches with ids, for :class:`HandoffRelay`)."""
        return SpreadOutbox(self.conn, self)

    @translate_errors
    async def count_stale(self, n: int) -> None:
        """Add ``n`` to the namespace's ``stale_completions`` counter (one that is not an
        integer, a corrupted counter, is reset to ``n``)."""
        try:
            await self.client.hincrby(self.keys.stats, "stale_completions", n)
        except ResponseError as exc:
            if "not an integer" not in str(exc):
                raise
            await self.client.hset(self.keys.stats, "stale_completions", n)
