"""The Redis state store's schedule role: the schedule, its promotion, periodic claims.

The schedule is a sorted set ``{ns}:schedule`` (task id -> due time, on the server's clock)
with the messages in ``{ns}:schedule:data``; ``promote.lua`` moves the due ones to their
queues. A periodic occurrence is claimed and published in one script (``claim_periodic.lua``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...limits import CHUNK_WRITES
from ..state import ScheduleState
from ..values import Scheduled
from .client import translate_errors
from .connection import RedisPart
from .replicas import enqueuing

__all__ = ["RedisSchedule"]

logger = logging.getLogger("blitzq.broker")

#: Schedule entries read per ``HSCAN`` call by :meth:`RedisSchedule.scheduled_for`.
SCAN_PAGE = 500


class RedisSchedule(RedisPart, ScheduleState):
    """The schedule, its promotion and periodic claims (the ``scheduling`` role of
    :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection.
        kind: the store's write kind (``"s"``, ``"l"``, ``"o"``): where promoted and claimed
            messages go.
    """

    @translate_errors
    @enqueuing
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
    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """Move messages due by the server's clock (plus ``ahead`` seconds) to their queues
        (one Lua call)."""
        keys = self.keys
        moved, head, now = await self.scripts.call(
            "promote",
            keys=[keys.schedule, keys.schedule_data],
            args=[
                keys.prefix,
                limit,
                self.dead_letter_cap,
                self.dead_letter_ttl,
                self.dead_letter_max_bytes,
                repr(float(ahead)) if ahead > 0 else "0",
            ],
        )
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

    @translate_errors
    async def scheduled_for(self, queues: Sequence[str], purge: bool = False) -> int:
        """See :meth:`ScheduleState.scheduled_for`: ``HSCAN`` of the schedule's data,
        :data:`SCAN_PAGE` entries a call, and for a purge one ``unschedule.lua`` call per
        page of matches (compare-and-delete: an id scheduled again for another queue since
        the scan stays)."""
        keys = self.keys
        heads = {q.encode() + b"\n" for q in queues}
        found = 0
        cursor: int = 0
        while True:
            cursor, page = await self.client.hscan(keys.schedule_data, cursor, count=SCAN_PAGE)
            ids = [
                task_id
                for task_id, entry in page.items()
                if entry[1 : entry.find(b"\n") + 1] in heads
            ]
            if ids and purge:
                args: list[Any] = [keys.prefix, len(queues), *queues, *ids]
                found += int(
                    await self.scripts.call(
                        "unschedule", keys=[keys.schedule, keys.schedule_data], args=args
                    )
                )
            else:
                found += len(ids)
            if not cursor:
                return found

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
            args=[name, repr(float(occurrence)), self.kind, message, queue, limit, keys.prefix],
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
