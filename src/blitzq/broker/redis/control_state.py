"""The Redis state store's control role: rate limits, unique tasks, locks, cancellation.

- Rate limits are token buckets ``{ns}:rl:<key>`` taken on the server's clock
  (``lua/rate_acquire.lua``).
- Unique keys ``{ns}:u:<task>:<key>`` hold the id of the task that claimed them, with a TTL.
  :meth:`RedisControl.enqueue_unique` claims a batch and writes the messages it claimed in
  one script (``lua/unique_enqueue.lua``), so a claim never stands without its message;
  :meth:`RedisControl.claim_unique` claims keys alone (one script run per 1000 keys); the
  completion effect :class:`~blitzq.broker.effects.UniqueRelease` (``lua/complete.lua``) deletes
  a key only while it holds the given id.
- Locks ``{ns}:lk:<key>`` are sorted sets of holder -> lease expiry (server time).
  :meth:`RedisControl.acquire_lock` takes a place, :meth:`RedisControl.renew_locks` renews
  leases, and the completion effect :class:`~blitzq.broker.effects.LockRelease` removes a holder.
- Cancellation: ``lua/cancel.lua`` takes a task off the schedule or marks it revoked
  (``{ns}:revoked``, id -> mark expiry) and announces it on the event channel, which
  :meth:`RedisControl.events` follows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ...limits import CHUNK_ITEMS, CHUNK_WRITES
from ..state import ControlState, UniqueSend
from .client import REDIS_ERRORS, broker_error, subscriber, translate_errors
from .cluster import ready
from .connection import RedisPart
from .replicas import enqueuing

__all__ = ["RedisControl"]

#: Prefix of a message on the event channel -> the kind ``events()`` yields.
_EVENT_KINDS = {
    "r": "revoke",
    "s": "schedule",
    "h": "handed",
    "p": "pause",
    "u": "resume",
    "x": "shutdown",
    "c": "resize",
    "q": "ready",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisControl(RedisPart, ControlState):
    """Rate limits, unique keys, locks, cancel marks and the event channel (the ``control``
    role of :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection.
        kind: the store's write kind (``"s"``, ``"l"``, ``"o"``; ``None``: the connection's):
            where :meth:`enqueue_unique` writes messages.
    """

    @translate_errors
    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """Claim ``(key, task_id, ttl seconds)`` unique keys, each atomically, in one script
        run per :data:`~blitzq.limits.CHUNK_ITEMS` keys.

        Returns:
            Per item, ``None`` when this call claimed the key, else the id of the task that
            already holds it.
        """
        out: list[str | None] = []
        for start in range(0, len(items), CHUNK_ITEMS):  # one short script call per chunk
            chunk = items[start : start + CHUNK_ITEMS]
            keys = [self.keys.unique(key) for key, _, _ in chunk]
            args: list[Any] = [self.keys.prefix]
            for _, task_id, ttl in chunk:
                args += (task_id, max(1, int(ttl * 1000)))
            answer = await self.scripts.call("unique_claim", keys=keys, args=args)
            out += [None if not v else _text(v) for v in answer]
        return out

    @translate_errors
    @enqueuing
    async def enqueue_unique(self, items: Sequence[UniqueSend]) -> list[str | None]:
        """Claim each item's key and write its message in one step, one script run per
        :data:`~blitzq.limits.CHUNK_WRITES` items (each item is atomic; see
        :meth:`ControlState.enqueue_unique`). A message goes where this store writes
        messages into queues (its kind: stream, list or outbox), a ``fast`` one to the
        queue's list when the store writes to streams, a delayed one on the schedule. An
        item with a ``nonce`` (an explicit id) that claims its key starts afresh in the same
        step (its record, progress and cancel mark deleted, its owner mark and ``record``
        stored).
        """
        keys = self.keys
        head: list[Any] = [keys.prefix, keys.events, self.kind]
        out: list[str | None] = []
        for start in range(0, len(items), CHUNK_WRITES):
            chunk = items[start : start + CHUNK_WRITES]
            names: list[str] = [keys.schedule, keys.schedule_data]
            args = list(head)
            for item in chunk:
                kind = "l" if item.fast and self.kind == "s" else self.kind
                names += (
                    keys.unique(item.key),
                    keys.list(item.queue) if kind == "l" else self.queue_key(item.queue),
                )
                args += (
                    item.task_id,
                    max(1, int(item.ttl * 1000)),
                    kind,
                    item.queue,
                    item.message,
                    "" if item.eta is None else repr(float(item.eta)),
                    "" if item.delay is None or item.eta is not None else repr(float(item.delay)),
                    "" if item.nonce is None else "1",
                    item.nonce or "",
                    item.record or b"",
                    max(1, item.record_ttl),
                )
            answer = await self.scripts.call("unique_enqueue", keys=names, args=args)
            out += [
                None if not held or _text(held) == item.task_id else _text(held)
                for item, held in zip(chunk, answer, strict=True)
            ]
        return out

    @translate_errors
    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """Take a place of lock ``key`` for ``holder`` for ``lease`` seconds (server time).

        Returns:
            ``0.0`` when the place is taken, else seconds until the earliest lease expires.
        """
        answer = await self.scripts.call(
            "lock_acquire",
            keys=[self.keys.lock(key)],
            args=[holder, int(limit), repr(float(lease))],
        )
        return float(_text(answer))

    @translate_errors
    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """Renew ``(key, holder, lease seconds)`` lock places still held; return how many."""
        if not items:
            return 0
        keys = [self.keys.lock(key) for key, _, _ in items]
        args: list[Any] = []
        for _, holder, lease in items:
            args += (holder, repr(float(lease)))
        return int(await self.scripts.call("lock_renew", keys=keys, args=args))

    @translate_errors
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Reserve a token from each bucket in one script run on server time."""
        keys = [self.keys.rate_limit(key) for key, _, _ in buckets]
        args: list[float] = []
        for _, rate, capacity in buckets:
            args += (rate, capacity)
        reserved, wait = await self.scripts.call("rate_acquire", keys=keys, args=args)
        return reserved in (b"1", "1", 1), float(wait)

    @translate_errors
    async def cancel(self, task_id: str, record: bytes, ttl: int, announce: bool = True) -> str:
        """Cancel atomically (one script): off the schedule, or revoked (and announced unless
        ``announce`` is ``False``)."""
        keys = self.keys
        answer = await self.scripts.call(
            "cancel",
            keys=[keys.schedule, keys.schedule_data, keys.revoked, keys.record(task_id)],
            args=[keys.prefix, task_id, repr(time.time()), ttl, record, "1" if announce else "0"],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    @translate_errors
    async def announce_revoked(self, task_ids: Sequence[str]) -> None:
        """One ``r:<task_id>`` on the namespace's event channel each, in order, by one script
        call per :data:`~blitzq.limits.CHUNK_ITEMS` ids (``announce_revoked.lua``; a cluster
        pipeline refuses PUBLISH). See :meth:`.ControlState.announce_revoked`."""
        keys = self.keys
        for start in range(0, len(task_ids), CHUNK_ITEMS):
            chunk = task_ids[start : start + CHUNK_ITEMS]
            await self.scripts.call(
                "announce_revoked", keys=[keys.revoked], args=[keys.prefix, *chunk]
            )

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
        pubsub = subscriber(self.client, ignore_subscribe_messages=False)
        try:
            try:
                await ready(self.client)  # a cluster client: its slot map first
                await pubsub.subscribe(self.keys.events)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is not None and message.get("type") == "subscribe":
                        yield "subscribed", ""  # pushes from now on are seen
                        continue
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
