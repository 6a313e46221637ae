"""The lists transport of fast mode: Redis lists (at-most-once).

A message is popped from the list by exactly one worker and is gone from Redis at that moment:
no ack, no lease, no recovery. A worker that crashes loses the messages it was running (and
never runs one twice). Retries, results and dead letters work as in reliable mode. Every pop
goes through a :class:`~.popping.Popper`, so a worker paused or a network stalled past the
socket timeout still reads the reply of a pop the server ran (``popping.py``).

:class:`ListsTransport` is a :class:`~blitzq.broker.transport.Transport` on a
:class:`~.connection.RedisConnection` of kind ``"l"``, paired with the
:class:`~.store.RedisStateStore` on the same connection by :class:`~.fast.FastRedisBroker`.
It has nothing to ack (:meth:`~blitzq.broker.transport.Transport.ack` does nothing) and
nothing to hand back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from ...exceptions import ConfigurationError
from ...limits import CHUNK_ITEMS
from ..transport import Delivery, Guarantee, Transport
from .client import translate_errors, wrong_type
from .connection import RedisConnection, RedisPart
from .popping import Popper
from .replicas import enqueuing
from .scripts import Scripts, load

#: Tuples of queues whose :class:`Levels` a transport keeps (a worker's fetch loops use a
#: few: each queue's levels, less any set aside); past it the cache starts again.
_LEVELS_KEPT = 64

_new = tuple.__new__


class Levels(NamedTuple):
    """What a pop over some lists needs, made once per tuple of queues (see
    :meth:`ListsTransport.levels_of`).

    Attributes:
        keys: the lists' keys, in the queues' order.
        by_key: each key's queue, by the key's bytes (the list a ``BLMPOP`` reply names).
        head: ``EVALSHA <pop_levels> <n> <keys>...`` without the count, or ``None`` on a
            cluster (its scripts route the call).
    """

    keys: list[str]
    by_key: dict[bytes, str]
    head: tuple[Any, ...] | None


class ListsTransport(RedisPart, Transport):
    """At-most-once delivery on Redis lists.

    Args:
        conn: the connection (kind ``"l"``), shared with the state store.

    Raises:
        ConfigurationError: ``conn`` is of another kind.
    """

    guarantee = Guarantee.AT_MOST_ONCE
    supports_recovery = False

    def __init__(self, conn: RedisConnection) -> None:
        if conn.kind != "l":
            raise ConfigurationError("a lists transport needs a connection of kind 'l'")
        super().__init__(conn)
        # Every pop goes through the popper: a pause or a stall cannot drop its reply.
        self.popper = Popper(self.client)
        self._pop_scripts = self.scripts if conn.cluster else Scripts(self.popper)
        #: Per tuple of queues (a fetch loop's levels): what a pop over them needs, made
        #: once instead of at every pop.
        self._levels: dict[tuple[str, ...], Levels] = {}

    @translate_errors
    @enqueuing
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """RPUSH the messages to the queue's list, :data:`~blitzq.limits.CHUNK_ITEMS` per
        command (in order)."""
        key = self.keys.list(queue)
        for start in range(0, len(messages), CHUNK_ITEMS):
            await self.client.execute_command("RPUSH", key, *messages[start : start + CHUNK_ITEMS])

    @translate_errors
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Check that no queue's key holds another type than a list (lists need no setup;
        the facade registers the queues).

        Raises:
            BrokerError: (not transient) a queue's key holds another type; the message names
                the key and its type.
        """
        for queue in queues:
            key = self.keys.list(queue)
            if (await self.client.type(key)) not in (b"list", b"none", "list", "none"):
                raise await wrong_type(self.client, key, "list", queue)

    @translate_errors
    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """LPOP up to ``count``; when empty, BLMPOP blocking up to ``timeout`` seconds."""
        key = self.keys.list(queue)
        pop = self.popper.execute_command
        items = await pop("LPOP", key, count)
        if not items and timeout > 0:
            block = self.block_for(timeout)
            reply = await pop("BLMPOP", block, 1, key, "LEFT", "COUNT", count, block=block)
            items = reply[1] if reply else None
        if not items:
            return []
        return [Delivery(queue, None, item, 1) for item in items]

    def levels_of(self, queues: Sequence[str]) -> Levels:
        """The :class:`Levels` of ``queues`` (physical queue names, most urgent first),
        made on first use; at most :data:`_LEVELS_KEPT` tuples are kept."""
        names = tuple(queues)
        levels = self._levels.get(names)
        if levels is None:
            if len(self._levels) >= _LEVELS_KEPT:
                self._levels.clear()
            keys = [self.keys.list(q) for q in names]
            by_key = dict(zip((k.encode() for k in keys), names, strict=True))
            script = load("pop_levels")
            head = None if self.conn.cluster else ("EVALSHA", script.sha, len(keys), *keys)
            levels = self._levels[names] = Levels(keys, by_key, head)
        return levels

    async def _pop_levels(self, levels: Levels, count: int) -> Any:
        """``pop_levels.lua`` over ``levels``, at most ``count`` messages: the cached command
        through the popper (loading the script where the server lacks it), or the cluster's
        scripts."""
        head = levels.head
        if head is None:
            return await self._pop_scripts.call("pop_levels", keys=levels.keys, args=[count])
        pop = self.popper.execute_command
        try:
            return await pop(*head, count)
        except NoScriptError:
            await self.popper.script_load(load("pop_levels").source)
            return await pop(*head, count)

    @translate_errors
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> list[Delivery]:
        """Pop from the lists in order in one script call; block on all of them at once (at
        once, without the script, when ``look_first`` is false and ``timeout`` > 0: BLMPOP
        pops from the first non-empty list, so the order holds)."""
        levels = self.levels_of(queues)
        rows: list[Any] = []  # the caller's script just found every list empty
        if look_first or timeout <= 0:
            rows = await self._pop_levels(levels, count)
        if len(rows) > len(queues) or timeout <= 0:
            return self.deliveries(queues, rows)
        keys = levels.keys
        block = self.block_for(timeout)
        reply = await self.popper.execute_command(
            "BLMPOP", block, len(keys), *keys, "LEFT", "COUNT", 1, block=block
        )
        if not reply:
            return []
        queue = levels.by_key[reply[0]]
        return [_new(Delivery, (queue, None, item, 1)) for item in reply[1]]

    @staticmethod
    def deliveries(queues: Sequence[str], rows: list[Any]) -> list[Delivery]:
        """The deliveries of a ``pop_levels.lua`` reply ``rows`` (one count per queue of
        ``queues``, then the messages in order)."""
        n = len(queues)
        out: list[Delivery] = []
        start = n
        for queue, taken in zip(queues, rows[:n], strict=True):
            if taken:
                end = start + taken
                # Delivery(...) without the NamedTuple's Python __new__ (one per message).
                out += [_new(Delivery, (queue, None, item, 1)) for item in rows[start:end]]
                start = end
        return out

    @property
    def shared_block(self) -> bool:  # type: ignore[override]
        """Whether :meth:`block_first` may cover many lists (single server or Sentinel)."""
        return self.conn.blocking is not None

    @translate_errors
    async def block_first(
        self, queues: Sequence[str], timeout: float, count: int = 1
    ) -> list[Delivery]:
        """One ``BLMPOP ... COUNT 1`` over the lists of ``queues`` (it pops from the first
        non-empty one; ``count`` is 1: :attr:`block_count`), on the held connection
        :meth:`unblock` can wake (``blocking.py``, whose reads a pause cannot drop);
        elsewhere :meth:`fetch_first`'s blocking pop."""
        blocking = self.conn.blocking
        if blocking is None:
            return await self.fetch_first(queues, 1, timeout, look_first=False)
        keys = [self.keys.list(q) for q in queues]
        block = self.block_for(timeout)
        reply = await blocking.run(
            "BLMPOP", block, len(keys), *keys, "LEFT", "COUNT", 1, block=block
        )
        if not reply:
            return []
        queue = queues[[k.encode() for k in keys].index(reply[0])]
        return [_new(Delivery, (queue, None, item, 1)) for item in reply[1]]

    async def unblock(self) -> bool:
        """Wake the :meth:`block_first` in flight (``CLIENT UNBLOCK``; it pops nothing)."""
        blocking = self.conn.blocking
        return False if blocking is None else await blocking.unblock()

    @translate_errors
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """Waiting messages per queue (fast mode has nothing in flight in Redis; 0 for a
        queue whose key holds another type: :meth:`wrong_type_keys` names it)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.llen(self.keys.list(queue))
            lengths = await pipe.execute(raise_on_error=False)
        return {
            q: {"waiting": n if isinstance(n, int) else 0, "in_flight": 0}
            for q, n in zip(queues, lengths, strict=True)
        }

    @translate_errors
    async def wrong_type_keys(self, queues: Sequence[str]) -> dict[str, str]:
        """See :meth:`Transport.wrong_type_keys`: each queue's list, and the namespace's
        keys."""
        wanted = dict.fromkeys((self.keys.list(q) for q in queues), "list")
        return await self.wrong_types({**wanted, **self.namespace_types()})

    @translate_errors
    async def purge_queue(self, queue: str) -> int:
        """Delete the queue's list (UNLINK: a long list is freed off the server's main
        thread) and return its length, in one script (``purge_list.lua``, not MULTI: it
        works on a server at its maxmemory, which the purge may be there to free)."""
        return int(await self.scripts.call("purge_list", keys=[self.keys.list(queue)], args=[]))
