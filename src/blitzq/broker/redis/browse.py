"""The Redis state store's browse role: what the dashboard lists and charts.

- ``{ns}:recent:<queue>``: the tasks that ended from a queue (written by the workers once a
  second, ``recent.lua``, or with a completion, ``complete.lua``'s ``"I"`` entries), read
  newest first by end time, one ZREVRANGEBYSCORE per queue;
- ``{ns}:sched`` and ``{ns}:sched:m``: the schedule, a page soonest first;
- ``{ns}:s:<queue>`` / ``{ns}:l:<queue>``: a queue's messages, a page in the order taken;
- ``{ns}:series:<slot>``: each 10 s slot's counts and gauges added by the workers
  (:mod:`blitzq.worker.series`);
- ``{ns}:periodic:paused``: the paused periodic entries (``claim_periodic.lua`` skips them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from ..state.browse import BrowseState
from .client import translate_errors
from .connection import RedisPart

__all__ = ["RedisBrowse"]

_encode = msgspec.msgpack.Encoder().encode


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class RedisBrowse(RedisPart, BrowseState):
    """The ``browse`` role of :class:`~.store.RedisStateStore` (module docstring).

    Args:
        conn: the store's connection.
    """

    @translate_errors
    async def ended_tasks(
        self, queues: Sequence[str], before: float | None, after: float | None, limit: int
    ) -> list[tuple[float, str, str]]:
        """See :meth:`BrowseState.ended_tasks` (one pipelined ZREVRANGEBYSCORE per queue)."""
        if not queues:
            return []
        top = "+inf" if before is None else f"({before!r}"
        bottom = "-inf" if after is None else repr(after)
        async with self.client.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zrevrangebyscore(
                    self.keys.recent(q), top, bottom, start=0, num=limit, withscores=True
                )
            answers = await pipe.execute()
        rows = [
            (float(score), q, _text(member))
            for q, answer in zip(queues, answers, strict=True)
            for member, score in answer
        ]
        rows.sort(key=lambda r: r[0], reverse=True)
        return rows[:limit]

    @translate_errors
    async def add_ended(
        self, queue: str, members: Sequence[str], now: float, cap: int, ttl: int
    ) -> None:
        """See :meth:`BrowseState.add_ended` (``recent.lua``: one call, the members as one
        MessagePack argument)."""
        await self.scripts.call(
            "recent",
            keys=[self.keys.recent(queue)],
            args=[repr(float(now)), cap, ttl, _encode(list(members))],
        )

    @translate_errors
    async def scheduled_tasks(
        self, after: float | None, limit: int
    ) -> list[tuple[float, str, bytes]]:
        """See :meth:`BrowseState.scheduled_tasks` (a ZRANGEBYSCORE and an HMGET)."""
        low = "-inf" if after is None else f"({after!r}"
        ids = await self.client.zrangebyscore(
            self.keys.schedule, low, "+inf", start=0, num=limit, withscores=True
        )
        if not ids:
            return []
        names = [_text(m) for m, _ in ids]
        data = await self.client.hmget(self.keys.schedule_data, names)
        return [
            (float(due), name, d or b"") for (_, due), name, d in zip(ids, names, data, strict=True)
        ]

    @translate_errors
    async def waiting_messages(self, queue: str, offset: int, limit: int) -> list[bytes]:
        """See :meth:`BrowseState.waiting_messages`: a stream's entries (XRANGE) or a list's
        items (LRANGE), whichever the queue's key holds."""
        stream, lst = self.keys.stream(queue), self.keys.list(queue)
        if await self.client.exists(stream):
            entries = await self.client.xrange(stream, "-", "+", count=offset + limit)
            out = []
            for _, fields in entries[offset:]:
                message = fields.get(b"m")
                if message is not None:
                    out.append(bytes(message))
            return out
        items = await self.client.lrange(lst, offset, offset + limit - 1)
        return [bytes(i) for i in items]

    @translate_errors
    async def add_sample(
        self, slot: int, counts: Mapping[str, int], gauges: Mapping[str, int], ttl: int
    ) -> None:
        """See :meth:`BrowseState.add_sample` (one pipelined transaction)."""
        key = self.keys.series(slot)
        async with self.client.pipeline(transaction=True) as pipe:
            for name, n in counts.items():
                if n:
                    pipe.hincrby(key, name, n)
            if gauges:
                pipe.hset(key, mapping=dict(gauges))
            pipe.expire(key, ttl)
            await pipe.execute()

    @translate_errors
    async def samples(self, slots: Sequence[int]) -> list[dict[str, int]]:
        """See :meth:`BrowseState.samples` (one pipelined HGETALL per slot)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for slot in slots:
                pipe.hgetall(self.keys.series(slot))
            answers = await pipe.execute()
        out = []
        for raw in answers:
            fields: dict[str, int] = {}
            for k, v in raw.items():
                try:
                    fields[_text(k)] = int(v)
                except ValueError:
                    continue
            out.append(fields)
        return out

    @translate_errors
    async def paused_periodic(self) -> set[str]:
        """See :meth:`BrowseState.paused_periodic` (one SMEMBERS)."""
        return {_text(m) for m in await self.client.smembers(self.keys.periodic_paused)}

    @translate_errors
    async def set_periodic_paused(self, name: str, paused: bool) -> bool:
        """See :meth:`BrowseState.set_periodic_paused` (SADD or SREM)."""
        key = self.keys.periodic_paused
        changed = await (self.client.sadd(key, name) if paused else self.client.srem(key, name))
        return bool(changed)
