"""The Redis state store's outbox: what it writes into queues when its transport is foreign.

:class:`RedisOutbox` is the :class:`~blitzq.broker.outbox.Outbox` of a
:class:`~.store.RedisStateStore` made with ``outbox=True`` (for a transport the store does
not ack: the choice is made once, when the store is made). The store's scripts then write
every message they would have pushed onto a stream or list (a promotion, a requeue, a
``publish`` / workflow / chord effect, a replay, a periodic claim) to
``{ns}:outbox:<queue>`` and name the queue in ``{ns}:outboxes`` (``lua/outbox.lua``), in the
same script as the state change. A relay takes batches from there (``lua/outbox_take.lua``:
to ``{ns}:relay:<relay_id>``, leased in ``{ns}:relays``), publishes them on the transport
and releases them; ``lua/outbox_restore.lua`` puts back the batch of a relay whose lease
lapsed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..outbox import Outbox
from .client import translate_errors
from .connection import RedisPart


class RedisOutbox(RedisPart, Outbox):
    """The outbox lists of a Redis state store (see the module docstring).

    Args:
        conn: the state store's :class:`~.connection.RedisConnection`.
    """

    @translate_errors
    async def take(
        self, relay: str, queue: str, count: int, lease: float
    ) -> tuple[str, list[bytes]] | None:
        """One ``outbox_take.lua`` call (see :meth:`Outbox.take`)."""
        keys = self.keys
        reply = await self.scripts.call(
            "outbox_take",
            keys=[keys.relay(relay), keys.relays, keys.outboxes],
            args=[keys.prefix, relay, queue, count, repr(float(lease))],
        )
        if not reply:
            return None
        head = reply[0]
        return (head.decode() if isinstance(head, bytes) else str(head)), list(reply[1:])

    @translate_errors
    async def release(self, relay: str) -> None:
        """Delete the relay's taken batch and its lease (one MULTI/EXEC)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.relay(relay))
            pipe.zrem(self.keys.relays, relay)
            await pipe.execute()

    @translate_errors
    async def pending(self) -> list[str]:
        """The members of ``{ns}:outboxes``, sorted."""
        names = await self.client.smembers(self.keys.outboxes)
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)

    @translate_errors
    async def restore(self, count: int) -> int:
        """One ``outbox_restore.lua`` call (see :meth:`Outbox.restore`)."""
        keys = self.keys
        restored = await self.scripts.call(
            "outbox_restore", keys=[keys.relays, keys.outboxes], args=[keys.prefix, count]
        )
        return int(restored)

    @translate_errors
    async def waiting(self, queues: Sequence[str]) -> dict[str, int]:
        """LLEN of each queue's outbox (one pipeline)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.llen(self.keys.outbox(queue))
            lengths = await pipe.execute()
        return {q: int(n) for q, n in zip(queues, lengths, strict=True)}

    @translate_errors
    async def purge(self, queue: str) -> int:
        """LLEN and UNLINK of the queue's outbox, SREM from ``{ns}:outboxes`` (one script,
        ``purge_list.lua``, not MULTI: it works on a server at its maxmemory)."""
        keys = [self.keys.outbox(queue), self.keys.outboxes]
        return int(await self.scripts.call("purge_list", keys=keys, args=[queue]))

    async def close(self) -> None:
        """Nothing: the connection is the state store's, closed with it."""
        return
