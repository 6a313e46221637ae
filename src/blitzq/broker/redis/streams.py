"""The streams transport of reliable mode: one consumer group per queue (at-least-once).

A fetched entry stays in the group's pending list, leased to its consumer, until the completion
acknowledges and deletes it (XACK + XDEL in the same script as the record write). A consumer
that dies leaves its entries pending; once idle longer than the visibility timeout, any live
worker's :meth:`recover` re-adds them to the stream with their delivery count, or
dead-letters them after ``max_deliveries``. A worker renews the leases of the entries it still
runs (:meth:`heartbeat`), and a renewal never takes an entry back from another consumer.

:class:`StreamsTransport` is a :class:`~blitzq.broker.transport.Transport` on a
:class:`~.connection.RedisConnection` of kind ``"s"``; paired with the
:class:`~.store.RedisStateStore` on the same connection, made with this transport's
:attr:`~StreamsTransport.lease` (:func:`~.reliable.ReliableRedisBroker`), its completions are
acked and fenced by ``complete.lua``, so :meth:`StreamsTransport.ack` and
:meth:`StreamsTransport.nack` serve a state store that does not ack (not the Redis one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from redis.exceptions import OutOfMemoryError, ResponseError

from ...exceptions import ConfigurationError
from ...limits import CHUNK_ITEMS
from ...routing import base_queue
from ..transport import Delivery, Guarantee, Transport
from .client import translate_errors, wrong_type
from .connection import LeaseIdentity, RedisConnection, RedisPart
from .doorbell import READY, look_then_wait
from .entries import entry_delivery as _delivery
from .handed import HandOver
from .keys import GROUP, MESSAGE_FIELD
from .replicas import durable_writes, durably, enqueuing, is_replicated
from .scripts import holder_waits

logger = logging.getLogger("blitzq.broker")

#: Idle time (ms) a nack gives an entry: past any visibility timeout, under the server's clock.
_HANDED_BACK_MS = 10 * 365 * 86400 * 1000

#: A non-blocking fetch of at least this many messages, on levels whose last fetch found a
#: backlog, reads the levels with one plain ``XREADGROUP`` each instead of ``fetch_levels.lua``
#: (see :meth:`StreamsTransport.fetch_first`).
_PLAIN_READS_MIN = 32


class StreamsTransport(HandOver, RedisPart, Transport):
    """At-least-once delivery on Redis Streams.

    Args:
        conn: the connection (kind ``"s"``), shared with the state store.

    Raises:
        ConfigurationError: ``conn`` is of another kind.
    """

    guarantee = Guarantee.AT_LEAST_ONCE
    supports_recovery = True

    def __init__(self, conn: RedisConnection) -> None:
        if conn.kind != "s":
            raise ConfigurationError("a streams transport needs a connection of kind 's'")
        super().__init__(conn)
        #: Who holds this transport's leases (its consumer name), handed to the state store
        #: that acks its deliveries when that store is made (``RedisStateStore(conn,
        #: lease=transport.lease)``), which fences on it.
        self.lease = LeaseIdentity()
        #: Whether the last non-blocking fetch of each set of levels (by its first level)
        #: took all it asked for: a backlog, where plain reads cost the server less.
        self._backlog: dict[str, bool] = {}
        #: On a cluster, base queues whose last idle look found their streams empty (no
        #: message waiting or in flight): :meth:`occupied` leaves them out.
        self._vacant: dict[str, bool] = {}
        #: A Sentinel client (asked once: ``isinstance`` of redis-py's clients is slow).
        self._sentinel = is_replicated(self.client)

    @translate_errors
    @enqueuing
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """XADD each message to the queue's stream, in one round-trip."""
        key = self.keys.stream(queue)
        if self.conn.doorbell is not None:  # a cluster: announce them to a watching worker
            ring = [self.keys.events, f"{READY}:{base_queue(queue)}"]
            for start in range(0, len(messages), CHUNK_ITEMS):
                chunk = list(messages[start : start + CHUNK_ITEMS])
                keys = [key, self.keys.idle(base_queue(queue))]
                await self.scripts.call("publish_ring", keys=keys, args=[*ring, *chunk])
            return
        if len(messages) == 1:
            await self.client.execute_command("XADD", key, "*", MESSAGE_FIELD, messages[0])
            return
        # One script call instead of a pipeline of XADDs: redis-py's per-command cost
        # dominates, its per-argument cost is small.
        for start in range(0, len(messages), CHUNK_ITEMS):
            chunk = list(messages[start : start + CHUNK_ITEMS])
            await self.scripts.call("publish", keys=[key], args=chunk)

    @translate_errors
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Create each queue's stream and consumer group if missing; name this consumer (in
        :attr:`lease`, which a state store that acks this transport fences on).

        Raises:
            BrokerError: (not transient) a queue's key holds another type than a stream; the
                message names the key and its type.
        """
        self.lease.consumer = consumer
        for queue in queues:
            key = self.keys.stream(queue)
            try:
                await self.client.xgroup_create(key, GROUP, "0", mkstream=True)
            except OutOfMemoryError as exc:
                # noeviction at maxmemory refuses XGROUP CREATE even when the group exists:
                # look (a read), and leave a missing group to the fetch, which creates it
                # once memory is freed. Never a reason not to start and drain the rest.
                if not await self._has_group(key):
                    logger.warning("could not create the consumer group of %s: %s", queue, exc)
            except ResponseError as exc:
                if "WRONGTYPE" in str(exc):
                    raise await wrong_type(self.client, key, "stream", queue) from exc
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _has_group(self, key: str) -> bool:
        try:
            groups = await self.client.xinfo_groups(key)
        except ResponseError:  # no such key
            return False
        return any(g.get("name") in (GROUP, GROUP.encode()) for g in groups)

    @translate_errors
    @durably
    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """XREADGROUP up to ``count`` new entries, blocking up to ``timeout`` s when empty.

        On ``redis+sentinel://`` and a Redis Cluster with replicas the read is durable
        (``sentinel.py``, ``cluster_replicas.py``): it returns only once
        the replicas that exist have the leases it took (:class:`~blitzq.BrokerError` when
        they do not: the entries stay leased here and are recovered after the visibility
        timeout), so a failover cannot lose the message of a task that runs."""
        key = self.keys.stream(queue)
        args: list[object] = ["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", count]
        if timeout > 0:
            args += ("BLOCK", max(1, int(self.block_for(timeout) * 1000)))
        args += ("STREAMS", key, ">")
        try:
            reply = await self.client.execute_command(*args)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream was deleted (purge, FLUSHDB): recreate the group and report nothing.
            await self.prepare_consumer([queue], self.consumer)
            return []
        if not reply:
            return []
        # RESP3 answers a map of stream to entries, RESP2 a list of [stream, entries].
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        return [_delivery(queue, entry_id, fields) for entry_id, fields in entries if fields]

    @translate_errors
    @durably
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> list[Delivery]:
        """Take from the streams in order in one script call; block on all of them at once
        (at once, without the script, when ``look_first`` is false and ``timeout`` > 0).

        A large fetch (:data:`_PLAIN_READS_MIN` messages or more) from levels that had a
        backlog last time reads them with one plain ``XREADGROUP`` each instead, in order,
        until it has ``count``: the server's cost of the script is mostly converting the
        entries to Lua and back (about 3 us a message, against about 1.1 us for the read
        itself), far more than one more command per batch costs. The order is the same:
        every message waiting on a level when its read starts is taken before any of a
        later level, and a higher level is always read first.
        """
        if self._vacant:  # fetched by a busy loop: a recovery may look at it again
            self._vacant.pop(base_queue(queues[0]), None)
        if self.conn.doorbell is not None:  # and an idle read looks at it again
            self.conn.doorbell.looked.pop(base_queue(queues[0]), None)
        keys = [self.keys.stream(q) for q in queues]
        if (
            count >= _PLAIN_READS_MIN
            and self._backlog.get(queues[0])
            and (look_first or timeout <= 0)
        ):
            taken = await self._read_levels(queues, keys, count)
            self._backlog[queues[0]] = len(taken) >= count
            if taken or timeout <= 0:
                return taken
            look_first = False  # every level was empty a moment ago: block at once
        if look_first or timeout <= 0:
            rows = await self.scripts.call(
                "fetch_levels", keys=keys, args=[GROUP, self.consumer, count]
            )
        else:  # the caller's script just found every level empty
            rows = []
        n = len(keys)
        if len(rows) > n or timeout <= 0:
            if count >= _PLAIN_READS_MIN:
                self._backlog[queues[0]] = sum(rows[:n]) >= count
            out: list[Delivery] = []
            start = n
            for queue, taken in zip(queues, rows[:n], strict=True):
                end = start + 2 * taken
                # _delivery() inlined for the usual entry (the message field alone).
                out += [
                    Delivery(queue, rows[j], f[1], 1)
                    if len(f := rows[j + 1]) == 2 and f[0] == MESSAGE_FIELD
                    else _delivery(queue, rows[j], f)
                    for j in range(start, end, 2)
                ]
                start = end
            return out
        # What arrived since the script is returned at once, one entry per stream that has
        # some, in the order of the keys; the worker keeps the most urgent (Fetcher._grant).
        block = max(1, int(self.block_for(timeout) * 1000))
        reply = await self.client.execute_command(
            "XREADGROUP",
            "GROUP",
            GROUP,
            self.consumer,
            "COUNT",
            1,
            "BLOCK",
            block,
            "STREAMS",
            *keys,
            *(">" for _ in keys),
        )
        if not reply:
            return []
        by_key = reply.items() if isinstance(reply, dict) else reply
        names = dict(zip((k.encode() for k in keys), queues, strict=True))
        return [
            _delivery(names[key], entry_id, fields)
            for key, entries in by_key
            for entry_id, fields in entries
            if fields is not None
        ]

    @property
    def shared_block(self) -> bool:  # type: ignore[override]
        """Whether :meth:`block_first` may cover many streams: always (one blocking read on
        a single server or Sentinel, looks woken by a doorbell on a cluster)."""
        return self.conn.blocking is not None or self.conn.doorbell is not None

    def arrived(self, queue: str | None) -> None:
        """A ``q:<queue>`` push (``None``: the listener subscribed again): ring the
        cluster's doorbell (``doorbell.py``); nothing on a single server."""
        if self.conn.doorbell is not None:
            self.conn.doorbell.ring(queue)

    def hearing(self, on: bool) -> None:
        """The event listener subscribed (``True``) or lost its subscription: arm or disarm
        the cluster's doorbell (``doorbell.py``)."""
        if self.conn.doorbell is not None:
            self.conn.doorbell.arm(on)

    @property
    def block_count(self) -> int:  # type: ignore[override]
        """Entries per stream :meth:`block_first` takes at most: 2 on the held connection."""
        return 2 if self.conn.blocking is not None else 1

    @translate_errors
    async def block_first(
        self, queues: Sequence[str], timeout: float, count: int = 1
    ) -> list[Delivery]:
        """One ``XREADGROUP ... COUNT <count> BLOCK`` over the streams of ``queues`` (in their
        order), on the held connection :meth:`unblock` can wake (``blocking.py``); on a
        cluster's spread layout a look at each base queue not watched since its last look,
        then a wait for its doorbell until the next safety look is due (``timeout`` while the
        event listener is not subscribed; :func:`~.doorbell.look_then_wait`). At most
        ``count`` entries per stream; durable as :meth:`fetch` (the ``WAIT`` goes
        on the held connection, which took the entries)."""
        blocking = self.conn.blocking
        if blocking is None:
            if self.conn.doorbell is None:
                return await self.fetch_first(queues, 1, timeout, look_first=False)
            token = durable_writes.set(True)  # the looks take entries: waited for as fetches
            try:
                rows = await look_then_wait(self.conn, self.consumer, queues, timeout, self._vacant)
            finally:
                durable_writes.reset(token)
            return [_delivery(queue, entry_id, fields) for queue, entry_id, fields in rows]
        keys = [self.keys.stream(q) for q in queues]
        block = self.block_for(timeout)
        args = ["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", min(count, 2)]
        args += ["BLOCK", max(1, int(block * 1000)), "STREAMS", *keys, *(">" for _ in keys)]
        try:
            reply = await blocking.run(*args, block=block)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # A stream was deleted (purge, FLUSHDB): recreate the groups, report nothing.
            await self.prepare_consumer(queues, self.consumer)
            return []
        if not reply:
            return []
        by_key = reply.items() if isinstance(reply, dict) else reply
        names = dict(zip((k.encode() for k in keys), queues, strict=True))
        taken = [
            _delivery(names[key], entry_id, fields)
            for key, entries in by_key
            for entry_id, fields in entries
            if fields is not None
        ]
        if taken and self._sentinel:
            await self.client.settle(blocking.command, "XREADGROUP", blocking.on_primary)
        elif taken and blocking.node is not None and hasattr(self.client, "replicas"):
            await self.client.replicas.settle(blocking.node, blocking.command, "XREADGROUP")
        return taken

    async def unblock(self) -> bool:
        """Wake the :meth:`block_first` in flight (``CLIENT UNBLOCK``, or the cluster's
        doorbell; it takes nothing)."""
        blocking = self.conn.blocking
        if blocking is None:
            return self.conn.doorbell is not None and self.conn.doorbell.wake()
        return await blocking.unblock()

    @translate_errors
    async def occupied(self, queues: Sequence[str]) -> list[str]:
        """The queues whose stream holds any entry, waiting or in flight (acked entries are
        deleted, so an empty stream has nothing to recover): one ``XREAD COUNT 1`` over all
        streams (on a cluster's ``?layout=slot`` all in the namespace's slot, sent to its
        node); on the spread layout of a cluster (the streams on several nodes) every queue
        but those whose last idle look found them empty: a write into the queue rings, and the
        ring makes an idle worker look again (a safety look comes at least every
        ``doorbell.revisit_period`` s), and a busy queue is never left out (a fetch that
        takes messages marks it occupied again). A key that holds another
        type (:meth:`wrong_type_keys`) is left out, not an error: the other queues are
        still recovered."""
        if self.conn.doorbell is not None:  # the spread layout: what the looks found empty
            return [q for q in queues if not self._vacant.get(base_queue(q))]
        if not queues:
            return []
        keys = [self.keys.stream(q) for q in queues]
        try:
            reply = await self.client.execute_command(
                "XREAD",
                "COUNT",
                1,
                "STREAMS",
                *keys,
                *("0-0" for _ in keys),
                **self.conn.node_kwargs(),
            )
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            bad = await self.wrong_types(dict.fromkeys(keys, "stream"))
            healthy = [q for q, k in zip(queues, keys, strict=True) if k not in bad]
            if len(healthy) == len(queues):
                raise
            return await self.occupied(healthy)
        if not reply:
            return []
        found = {
            bytes(k) for k in (reply.keys() if isinstance(reply, dict) else (r[0] for r in reply))
        }
        return [q for q, k in zip(queues, keys, strict=True) if k.encode() in found]

    async def _read_levels(
        self, queues: Sequence[str], keys: list[str], count: int
    ) -> list[Delivery]:
        """Up to ``count`` new entries from the streams in order, one ``XREADGROUP`` each,
        without blocking. A read that fails after earlier ones took entries ends the fetch
        with those (they are leased to this consumer: never left unseen)."""
        out: list[Delivery] = []
        for queue, key in zip(queues, keys, strict=True):
            try:
                reply = await self.client.execute_command(
                    "XREADGROUP",
                    "GROUP",
                    GROUP,
                    self.consumer,
                    "COUNT",
                    count - len(out),
                    "STREAMS",
                    key,
                    ">",
                )
            except ResponseError as exc:
                if out:
                    return out
                if "NOGROUP" not in str(exc):
                    raise
                # The stream was deleted (purge, FLUSHDB): recreate the group, read on.
                await self.prepare_consumer([queue], self.consumer)
                continue
            except Exception:
                if out:
                    return out
                raise
            if not reply:
                continue
            # RESP3 answers a map of stream to entries, RESP2 a list of [stream, entries].
            entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
            out += [
                Delivery(queue, entry_id, f[1], 1)
                if len(f) == 2 and f[0] == MESSAGE_FIELD
                else _delivery(queue, entry_id, f)
                for entry_id, f in entries
                if f
            ]
            if len(out) >= count:
                break
        return out

    @translate_errors
    async def ack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """XACK and XDEL the entries (one MULTI/EXEC). Not on reliable mode's path: there
        ``complete.lua`` acks with the completion's writes, fenced."""
        if not tokens:
            return
        key = self.keys.stream(queue)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.xack(key, GROUP, *tokens)
            pipe.xdel(key, *tokens)
            await pipe.execute()

    async def nack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """Hand back entries this consumer still owns: their idle time is set past any
        visibility timeout, so the next :meth:`recover` (of any worker) re-adds them with
        their delivery count. Entries another consumer took over are left alone."""
        await self._set_idle(queue, tokens, _HANDED_BACK_MS)

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Renew leases this consumer still owns (ownership-checked script, one call per
        :data:`~blitzq.limits.CHUNK_ITEMS` tokens)."""
        return await self._set_idle(queue, tokens, 0)

    @translate_errors
    async def _set_idle(self, queue: str, tokens: Sequence[bytes], idle_ms: int) -> int:
        changed = 0
        key, consumer = self.keys.stream(queue), self.consumer
        for start in range(0, len(tokens), CHUNK_ITEMS):
            chunk = tokens[start : start + CHUNK_ITEMS]
            changed += int(
                await self.scripts.call(
                    "renew", keys=[key], args=[GROUP, consumer, idle_ms, *chunk]
                )
            )
        return changed

    @translate_errors
    async def recover(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        record_ttl: int = 86400,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, int]:
        """Re-add entries idle over ``min_idle`` seconds (over their holder's time for a
        consumer of ``holders``), or dead-letter them (one script: ``recover.lua``)."""
        requeued, dead = await self.scripts.call(
            "recover",
            keys=[self.keys.stream(queue), self.keys.dead_letters],
            args=[
                GROUP,
                self.consumer,
                max(1, int(min_idle * 1000)),
                count,
                max_deliveries,
                repr(time.time()),
                self.keys.prefix,
                queue,
                self.dead_letter_cap,
                record_ttl,
                self.dead_letter_ttl,
                self.dead_letter_max_bytes,
                *holder_waits(holders, min_idle),
            ],
        )
        return int(requeued), int(dead)

    @translate_errors
    async def prune_consumers(self, queue: str, idle: float) -> int:
        """Delete group consumers idle over ``idle`` seconds that hold nothing; return count.

        Keeps the group from growing by one consumer per worker process ever started.
        """
        removed = await self.scripts.call(
            "prune",
            keys=[self.keys.stream(queue)],
            args=[GROUP, max(1, int(idle * 1000)), self.consumer],
        )
        return int(removed)

    @translate_errors
    async def wrong_type_keys(self, queues: Sequence[str]) -> dict[str, str]:
        """See :meth:`Transport.wrong_type_keys`: each queue's stream, and the namespace's
        keys."""
        wanted = dict.fromkeys((self.keys.stream(q) for q in queues), "stream")
        return await self.wrong_types({**wanted, **self.namespace_types()})

    @translate_errors
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """Waiting (not yet delivered) and in-flight (pending) entries per queue (0 and 0 for
        a queue whose key holds another type: :meth:`wrong_type_keys` names it)."""
        out: dict[str, dict[str, int]] = {}
        bad = await self.wrong_types(dict.fromkeys((self.keys.stream(q) for q in queues), "stream"))
        for queue in queues:
            if self.keys.stream(queue) in bad:
                out[queue] = {"waiting": 0, "in_flight": 0}
                continue
            key = self.keys.stream(queue)
            length = int(await self.client.xlen(key))
            pending = 0
            try:
                groups = await self.client.xinfo_groups(key)
            except ResponseError:
                groups = []
            for group in groups:
                if group.get("name") in (GROUP, GROUP.encode()):
                    pending = int(group.get("pending", 0))
            out[queue] = {"waiting": max(0, length - pending), "in_flight": pending}
        return out

    @translate_errors
    async def oldest_waiting(self, queues: Sequence[str]) -> dict[str, float]:
        """When the oldest waiting (undelivered) entry of each queue was added: Unix seconds
        on the server's clock, read from its stream entry id; a queue with nothing waiting
        is left out."""
        out: dict[str, float] = {}
        for queue in queues:
            key = self.keys.stream(queue)
            last = b"0-0"
            try:
                groups = await self.client.xinfo_groups(key)
            except ResponseError:
                groups = []
            for group in groups:
                if group.get("name") in (GROUP, GROUP.encode()):
                    found = group.get("last-delivered-id", b"0-0")
                    last = found if isinstance(found, bytes) else str(found).encode()
            entries = await self.client.xrange(key, min=b"(" + last, count=1)
            if entries:
                entry_id = entries[0][0]
                text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                out[queue] = int(text.split("-")[0]) / 1000.0
        return out

    @translate_errors
    async def purge_queue(self, queue: str) -> int:
        """Delete waiting entries of the stream (in-flight ones stay until completed)."""
        key = self.keys.stream(queue)
        stats = await self.queue_stats([queue])
        waiting = stats[queue]["waiting"]
        if waiting == 0:
            return 0
        # Undelivered entries are those after the group's last-delivered id.
        groups = await self.client.xinfo_groups(key)
        last = b"0-0"
        for group in groups:
            if group.get("name") in (GROUP, GROUP.encode()):
                last = group.get("last-delivered-id", b"0-0")
        removed = 0
        start = last if isinstance(last, bytes) else str(last).encode()
        while True:
            entries = await self.client.xrange(key, min=b"(" + start, count=1000)
            if not entries:
                break
            ids = [entry_id for entry_id, _ in entries]
            removed += int(await self.client.xdel(key, *ids))
            start = ids[-1]
        return removed
