"""The Redis state store's writes: completions, rate limits, schedule, cancel, periodic.

:meth:`RedisState.complete` sends a batch of completions (and their typed effects, encoded by
:func:`~blitzq.broker.ops.encode_op`) as one MessagePack argument to ``lua/complete.lua``;
the schedule is a sorted set promoted on the server's clock (``promote.lua``); cancel marks
and the event channel tell workers what to skip.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from ...limits import CHUNK_ITEMS, CHUNK_WRITES, NOTIFY_INLINE_MAX
from .. import Completion, Scheduled
from ..ops import encode_op
from .client import REDIS_ERRORS, broker_error, subscriber, translate_errors
from .cluster import ready
from .connection import RedisPart
from .keys import GROUP

logger = logging.getLogger("blitzq.broker")

#: Prefix of a message on the event channel -> the kind ``events()`` yields.
_EVENT_KINDS = {
    "r": "revoke", "s": "schedule", "h": "handed", "p": "pause", "u": "resume", "x": "shutdown",
}  # fmt: skip

_batch_encoder = msgspec.msgpack.Encoder()


def _lua_bytes(data: bytes) -> msgspec.Raw:
    """``data`` as a MessagePack *str*: the ``cmsgpack`` in Redis/Valkey Lua rejects *bin*.

    Lua strings are byte strings, so the bytes arrive unchanged.
    """
    n = len(data)
    if n < 256:
        return msgspec.Raw(b"\xd9" + n.to_bytes(1, "big") + data)
    if n < 65536:
        return msgspec.Raw(b"\xda" + n.to_bytes(2, "big") + data)
    return msgspec.Raw(b"\xdb" + n.to_bytes(4, "big") + data)


_EMPTY = msgspec.Raw(b"\xa0")

#: The MessagePack *str* header of each length under 256 (``str8``).
_STR8 = [b"\xd9" + bytes([n]) for n in range(256)]


def _lua_array(items: list[bytes]) -> msgspec.Raw:
    """``items`` as one MessagePack array of *str* (see :func:`_lua_bytes`), built without a
    Python call per item for items under 256 bytes (a typical record)."""
    n = len(items)
    if n < 16:
        head = bytes([0x90 | n])
    else:
        head = b"\xdc" + n.to_bytes(2, "big") if n < 65536 else b"\xdd" + n.to_bytes(4, "big")
    str8 = _STR8
    body = b"".join(
        [str8[len(item)] + item if len(item) < 256 else _lua_bytes(item) for item in items]
    )
    return msgspec.Raw(head + body)


def _lua_op(op: tuple[Any, ...]) -> list[Any]:
    """A completion op with its bytes items made Lua-readable (see :func:`_lua_bytes`)."""
    return [
        _lua_bytes(item)
        if isinstance(item, bytes)
        else _lua_op(item)
        if isinstance(item, tuple)
        else item
        for item in op
    ]


class RedisState(RedisPart):
    """Completions, rate limits, the schedule, cancellation and periodic claims (a part of
    :class:`~.store.RedisStateStore`)."""

    # ------------------------------------------------------------ completions
    @translate_errors
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply a batch of completions in one Lua call (one round-trip, atomic).

        The batch travels as one MessagePack argument that the script unpacks with
        ``cmsgpack``: building a handful of arguments per completion in redis-py cost more
        than the whole server-side work. Stream completions are fenced in the script (see
        :meth:`Broker.complete`); the stale ones are returned.
        """
        if not completions:
            return []
        entries: list[Any] = []
        acks: dict[str, list[bytes]] = {}
        # A run of consecutive completions that only ack and store a record (the common
        # success), of one queue and TTL: sent as one "R" entry, in its place in the batch
        # (a task's "running" record must not land after its final one).
        run_key: tuple[str, int] | None = None
        ids: list[str] = []
        task_ids: list[str] = []
        recs: list[bytes] = []
        seen: set[str] = set()
        kind = self.kind
        # Only stream entries are acked (and fenced) here; a token of a list completion or of
        # a separate transport (acked by the facade afterwards) is not this store's to touch.
        streams = kind == "s"
        for c in completions:
            if c.reschedule is None and c.dead_letter is None and c.requeue is None and not c.ops:
                token, record = c.token, c.record
                if not record:
                    if token is not None and streams:
                        acks.setdefault(c.queue, []).append(token)
                    continue
                if c.fence is None and (token is not None or not streams):
                    key = (c.queue, c.record_ttl)
                    entry_id = token.decode() if token is not None and streams else None
                    # A second completion of one delivery starts a new entry, so that it is
                    # found stale after the first acked and deleted it (as a "C" entry is).
                    if key != run_key or (entry_id is not None and entry_id in seen):
                        if run_key is not None:
                            entries.append(("R", *run_key, ids, task_ids, _lua_array(recs)))
                        run_key, ids, task_ids, recs, seen = key, [], [], [], set()
                    if entry_id is not None:  # a stream entry id is ASCII
                        ids.append(entry_id)
                        seen.add(entry_id)
                    task_ids.append(c.task_id)
                    recs.append(record)
                    continue
            if run_key is not None:
                entries.append(("R", *run_key, ids, task_ids, _lua_array(recs)))
                run_key = None
            d = c.dead_letter
            entries.append(
                (
                    "C",
                    kind,
                    c.queue,
                    _lua_bytes(c.token) if c.token and streams else _EMPTY,
                    c.task_id,
                    _lua_bytes(c.record) if c.record else _EMPTY,
                    c.record_ttl,
                    _lua_bytes(c.reschedule) if c.reschedule else _EMPTY,
                    float(c.delay),
                    (_lua_bytes(d.message), d.reason, d.error, d.task, d.queue, d.failed_at)
                    if d
                    else _EMPTY,
                    _lua_bytes(c.requeue) if c.requeue else _EMPTY,
                    [_lua_op(encode_op(op)) for op in c.ops] if c.ops else _EMPTY,
                    _lua_bytes(c.fence) if c.fence else _EMPTY,
                )
            )
        if run_key is not None:
            entries.append(("R", *run_key, ids, task_ids, _lua_array(recs)))
        for queue, tokens in acks.items():
            entries.append(("A", queue, [t.decode() for t in tokens]))
        if not entries:
            return []
        keys = self.keys
        stale = await self.scripts.call(
            "complete",
            keys=[keys.schedule, keys.schedule_data, keys.dead_letters],
            args=[
                keys.prefix, GROUP, self.dead_letter_cap, _batch_encoder.encode(entries),
                self.dead_letter_ttl, self.dead_letter_max_bytes, NOTIFY_INLINE_MAX,
                self.consumer,
            ],
        )  # fmt: skip
        if not stale:
            return []
        wanted = {(q.decode(), bytes(t)) for q, t in stale}
        return [c for c in completions if (c.queue, c.token or c.fence) in wanted]

    @translate_errors
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Reserve a token from each bucket in one script run on server time."""
        keys = [self.keys.rate_limit(key) for key, _, _ in buckets]
        args: list[float] = []
        for _, rate, capacity in buckets:
            args += (rate, capacity)
        reserved, wait = await self.scripts.call("rate_acquire", keys=keys, args=args)
        return reserved in (b"1", "1", 1), float(wait)

    # --------------------------------------------------------------- schedule
    @translate_errors
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule; due times on the server's clock.

        One script run per :data:`~blitzq.limits.CHUNK_WRITES` items (each item is atomic, a
        large batch is not), so no call holds the server long.
        """
        keys = self.keys
        kind = self.kind.encode()
        for start in range(0, len(items), CHUNK_WRITES):
            args: list[Any] = [keys.events]
            for item in items[start : start + CHUNK_WRITES]:
                args += (
                    item.task_id,
                    "" if item.eta is None else repr(float(item.eta)),
                    repr(float(item.delay)),
                    kind + item.queue.encode() + b"\n" + item.message,
                )
            await self.scripts.call("schedule", keys=[keys.schedule, keys.schedule_data], args=args)

    @translate_errors
    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """Cancel atomically (one script): off the schedule, or revoked and announced."""
        keys = self.keys
        answer = await self.scripts.call(
            "cancel",
            keys=[keys.schedule, keys.schedule_data, keys.revoked, keys.record(task_id)],
            args=[keys.prefix, task_id, repr(time.time()), ttl, record],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    @translate_errors
    async def revoked(self) -> dict[str, float]:
        """Revoked ids whose mark has not expired, read :data:`~blitzq.limits.CHUNK_ITEMS` per
        call (pages by offset), so a mass cancel makes no single long read."""
        out: dict[str, float] = {}
        now, offset = time.time(), 0
        while True:
            rows = await self.client.zrangebyscore(
                self.keys.revoked, now, "+inf", start=offset, num=CHUNK_ITEMS, withscores=True
            )
            out.update((member.decode(errors="replace"), float(score)) for member, score in rows)
            if len(rows) < CHUNK_ITEMS:
                return out
            offset += len(rows)

    @translate_errors
    async def cancel_mark(self, task_id: str) -> float | None:
        """The expiry (Unix seconds) of ``task_id``'s cancel mark (ZSCORE), or ``None`` when
        it has none or it has expired."""
        score = await self.client.zscore(self.keys.revoked, task_id)
        if score is None or float(score) <= time.time():
            return None
        return float(score)

    async def events(self) -> AsyncIterator[tuple[str, str]]:
        """Messages of the namespace's event channel, on a pub/sub connection of their own."""
        pubsub = subscriber(self.client, ignore_subscribe_messages=True)
        try:
            try:
                await ready(self.client)  # a cluster client: its slot map first
                await pubsub.subscribe(self.keys.events)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is None or message.get("type") != "message":
                        continue
                    data = message["data"]
                    # Anyone may publish here: never fail on a payload (the listener
                    # checks the values).
                    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
                    kind, _, value = text.partition(":")
                    yield _EVENT_KINDS.get(kind, "unknown"), value
            except REDIS_ERRORS as exc:
                raise broker_error(exc) from exc
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()

    @translate_errors
    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """Move messages due by the server's clock (plus ``ahead`` seconds) to their queues
        (one Lua call)."""
        keys = self.keys
        moved, head, now = await self.scripts.call(
            "promote",
            keys=[keys.schedule, keys.schedule_data],
            args=[
                keys.prefix, limit,
                self.dead_letter_cap, self.dead_letter_ttl, self.dead_letter_max_bytes,
                repr(float(ahead)) if ahead > 0 else "0",
            ],
        )  # fmt: skip
        return int(moved), (float(head) if head else None), float(now)

    @translate_errors
    async def scheduled_count(self) -> int:
        """Number of messages waiting on the schedule."""
        return int(await self.client.zcard(self.keys.schedule))

    @translate_errors
    async def scheduled_entry(self, task_id: str) -> tuple[float, str, bytes] | None:
        """The due time, queue and message of a scheduled task (ZSCORE + HGET, one pipeline);
        ``None`` when it is not on the schedule (or its entry is unreadable)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zscore(self.keys.schedule, task_id)
            pipe.hget(self.keys.schedule_data, task_id)
            due, entry = await pipe.execute()
        if due is None or not entry:
            return None
        head, sep, message = bytes(entry).partition(b"\n")
        if not sep or len(head) < 2:
            return None
        return float(due), head[1:].decode("utf-8", "replace"), message

    # --------------------------------------------------------------- periodic
    @translate_errors
    async def server_time(self) -> float:
        """The server's clock, Redis ``TIME`` (Unix seconds)."""
        seconds, micros = await self.client.time(**self.conn.node_kwargs())
        return float(seconds) + int(micros) / 1_000_000

    @translate_errors
    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str, until: float | None = None
    ) -> bool:
        """Compare-and-set the last occurrence of ``name`` and publish, in one Lua call on
        the server's clock (see :meth:`Broker.claim_periodic`)."""
        keys = self.keys
        limit = "" if until is None else repr(float(until))
        done = await self.scripts.call(
            "claim_periodic",
            keys=[keys.periodic, self.queue_key(queue), keys.outboxes],
            args=[name, repr(float(occurrence)), self.kind, message, queue, limit],
        )
        return bool(done)

    @translate_errors
    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """Last dispatched occurrence of each name that has one (one HMGET). A value that is
        not a number (a corrupted entry) counts as none, with a WARNING naming it; the next
        claim overwrites it."""
        if not names:
            return {}
        values = await self.client.hmget(self.keys.periodic, list(names))
        out: dict[str, float] = {}
        for name, value in zip(names, values, strict=True):
            if value is None:
                continue
            try:
                out[name] = float(value)
            except ValueError:
                logger.warning(
                    "last occurrence of periodic %s in %s is not a number (%r): read as none",
                    name,
                    self.keys.periodic,
                    value[:32],
                )
        return out
