"""The Redis state store's part for supervisors: the autoscale setpoint and their status.

``blitzq control scale`` writes the setpoint (``{ns}:scale``); every autoscaling supervisor of
the namespace reads it once per sampling interval, and publishes its status
(``{ns}:supervisors``, liveness in ``{ns}:supervisors:exp``) the same way workers register
(see :mod:`~blitzq.worker.autoscale`).
"""

from __future__ import annotations

import time

from .client import translate_errors
from .connection import RedisPart


class RedisScaling(RedisPart):
    """The autoscale setpoint and supervisor status (a part of
    :class:`~.store.RedisStateStore`)."""

    @translate_errors
    async def set_scale(self, minimum: int, maximum: int) -> None:
        """Store the namespace's autoscale setpoint: ``minimum`` and ``maximum`` processes
        per supervisor (checked by the caller), stamped with this machine's time."""
        await self.client.hset(
            self.keys.scale, mapping={"min": minimum, "max": maximum, "at": repr(time.time())}
        )

    @translate_errors
    async def clear_scale(self) -> bool:
        """Remove the setpoint (supervisors go back to their ``--autoscale``); return whether
        there was one."""
        return bool(await self.client.delete(self.keys.scale))

    @translate_errors
    async def scale(self) -> tuple[int, int, float] | None:
        """The setpoint as ``(min, max, set at in Unix seconds)``, or ``None`` when none is
        set or it is unreadable."""
        raw = await self.client.hgetall(self.keys.scale)
        try:
            return int(raw[b"min"]), int(raw[b"max"]), float(raw.get(b"at", 0.0))
        except (KeyError, ValueError):
            return None

    @translate_errors
    async def publish_supervisor(self, supervisor_id: str, status: bytes, ttl: float) -> None:
        """Record a supervisor's status until ``ttl`` seconds from now."""
        keys = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.supervisors, supervisor_id, status)
            pipe.zadd(keys.supervisor_beats, {supervisor_id: time.time() + ttl})
            await pipe.execute()

    @translate_errors
    async def unpublish_supervisor(self, supervisor_id: str) -> None:
        """Remove a supervisor's status."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.supervisors, supervisor_id)
            pipe.zrem(self.keys.supervisor_beats, supervisor_id)
            await pipe.execute()

    @translate_errors
    async def supervisors(self) -> dict[str, bytes]:
        """Live supervisors: id to the status they published; expired ones are removed."""
        keys = self.keys
        expired = await self.client.zrangebyscore(keys.supervisor_beats, "-inf", time.time())
        if expired:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.supervisors, *expired)
                pipe.zrem(keys.supervisor_beats, *expired)
                await pipe.execute()
        raw: dict[bytes, bytes] = await self.client.hgetall(keys.supervisors)
        return {k.decode(): v for k, v in raw.items()}
