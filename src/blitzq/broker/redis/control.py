"""Redis side of unique tasks and locks (mixed into :class:`~.store.RedisStateStore`).

- Unique keys ``{ns}:u:<task>:<key>`` hold the id of the task that claimed them, with a TTL.
  :meth:`RedisControl.claim_unique` claims a batch in one script run per 1000 keys; the
  completion effect :class:`~blitzq.broker.ops.UniqueRelease` (``lua/complete.lua``) deletes
  a key only while it holds the given id.
- Locks ``{ns}:lk:<key>`` are sorted sets of holder -> lease expiry (server time).
  :meth:`RedisControl.acquire_lock` takes a place, :meth:`RedisControl.renew_locks` renews
  leases, and the completion effect :class:`~blitzq.broker.ops.LockRelease` removes a holder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...limits import CHUNK_ITEMS
from .client import translate_errors
from .keys import Keys
from .scripts import Scripts


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisControl:
    """Unique-key and lock operations of the Redis brokers (a mixin; needs ``keys``,
    ``scripts``)."""

    keys: Keys
    scripts: Scripts

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
