"""The Redis state store's run-time periodic entries (``blitzq schedule add|list|remove``).

Each entry is one field of the hash ``{ns}:periodic:rt``: its name to its definition, opaque
bytes that :mod:`blitzq.runtime_schedules` encodes. Removing an entry also drops its last-run
record from ``{ns}:periodic``, so a new entry of the same name starts afresh.
"""

from __future__ import annotations

from .client import translate_errors
from .connection import RedisPart


class RedisSchedules(RedisPart):
    """Run-time periodic entries (a part of :class:`~.store.RedisStateStore`)."""

    @translate_errors
    async def runtime_periodic(self) -> dict[str, bytes]:
        """Every run-time periodic entry: name to definition (one HGETALL)."""
        raw: dict[bytes, bytes] = await self.client.hgetall(self.keys.periodic_runtime)
        return {k.decode(errors="replace"): v for k, v in raw.items()}

    @translate_errors
    async def set_runtime_periodic(self, name: str, definition: bytes) -> None:
        """Store (or replace) the entry ``name`` (one HSET)."""
        await self.client.hset(self.keys.periodic_runtime, name, definition)

    @translate_errors
    async def remove_runtime_periodic(self, name: str) -> bool:
        """Delete the entry ``name`` and its last run, in one transaction; ``True`` when the
        entry existed."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.periodic_runtime, name)
            pipe.hdel(self.keys.periodic, name)
            removed, _ = await pipe.execute()
        return bool(removed)
