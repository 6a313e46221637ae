"""The Redis state store's operations role: state kept for the operator tools.

- Run-time periodic entries (``blitzq schedule add|list|remove``): each is one field of the
  hash ``{ns}:periodic:rt``, its name to its definition (opaque bytes that
  :mod:`blitzq.runtime_schedules` encodes). Removing an entry also drops its last-run record
  from ``{ns}:periodic``, so a new entry of the same name starts afresh.
- The autoscale setpoint: ``blitzq control scale`` writes it (``{ns}:scale``, or
  ``{ns}:scale:g:<group>`` for the supervisors of ``--group <group>``); every autoscaling
  supervisor reads its own once per sampling interval, and publishes
  its status (``{ns}:supervisors``, liveness in ``{ns}:supervisors:exp``) the same way
  workers register (see :mod:`~blitzq.worker.autoscale`).
- What the server tells about itself (``blitzq check``): INFO, and CONFIG GET ``save``.
"""

from __future__ import annotations

import time

from redis.exceptions import OutOfMemoryError, ResponseError

from ..state import OperationsState
from .client import translate_errors
from .connection import RedisPart

__all__ = ["RedisOperatorState"]


class RedisOperatorState(RedisPart, OperationsState):
    """Run-time periodic entries, the autoscale setpoint, supervisor status and server
    facts (the
    ``operations`` role of :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection.
    """

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
        """Delete the entry ``name``, then its last run (one pipeline: both reach the server in
        one write, in that order); ``True`` when the entry existed.

        Not a MULTI: a server at its maxmemory refuses every command queued in one, deletions
        too, and removing an entry is something an operator does to such a server."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hdel(self.keys.periodic_runtime, name)
            pipe.hdel(self.keys.periodic, name)
            removed, _ = await pipe.execute()
        return bool(removed)

    def _setpoint_key(self, group: str | None) -> str:
        """The setpoint key of the supervisors of ``group`` (``None``: those in no group)."""
        return self.keys.scale if group is None else self.keys.scale_group(group)

    @translate_errors
    async def set_scale(self, minimum: int, maximum: int, group: str | None = None) -> None:
        """Store the autoscale setpoint of the supervisors of ``group`` (``None``: those in no
        group): ``minimum`` and ``maximum`` processes per supervisor (checked by the caller),
        stamped with this machine's time. The previous setpoint is replaced whole."""
        key = self._setpoint_key(group)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"min": minimum, "max": maximum, "at": repr(time.time())})
            await pipe.execute()

    @translate_errors
    async def clear_scale(self, group: str | None = None) -> bool:
        """Remove the setpoint of ``group`` (its supervisors go back to their
        ``--autoscale``); return whether there was one."""
        return bool(await self.client.delete(self._setpoint_key(group)))

    @translate_errors
    async def scale(self, group: str | None = None) -> tuple[int, int, float] | None:
        """The setpoint of ``group`` as ``(min, max, set at in Unix seconds)``, or ``None``
        when none is set or it is unreadable (see :meth:`setpoint` for the raw fields)."""
        raw = await self.setpoint(group) or {}
        try:
            return int(raw["min"]), int(raw["max"]), float(raw.get("at", 0.0))
        except (KeyError, ValueError):
            return None

    @translate_errors
    async def setpoint(self, group: str | None = None) -> dict[str, str] | None:
        """The raw fields of the setpoint of ``group`` (text), ``None`` when there is none;
        a key of another type than a hash reads as ``{"type": <its type>}`` (the supervisor
        rejects it as unreadable)."""
        key = self._setpoint_key(group)
        try:
            raw: dict[bytes, bytes] = await self.client.hgetall(key)
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            kind = await self.client.type(key)
            return {"type": kind.decode() if isinstance(kind, bytes) else str(kind)}
        if not raw:
            return None
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}

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
        """Live supervisors: id to the status they published; expired ones are removed
        (a clean-up a server at ``maxmemory`` refuses: they are then only left out, so this
        read works on a full server)."""
        keys = self.keys
        expired = await self.client.zrangebyscore(keys.supervisor_beats, "-inf", time.time())
        if expired:
            try:
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.hdel(keys.supervisors, *expired)
                    pipe.zrem(keys.supervisor_beats, *expired)
                    await pipe.execute()
            except OutOfMemoryError:
                pass
        raw: dict[bytes, bytes] = await self.client.hgetall(keys.supervisors)
        gone = set(expired)
        return {k.decode(): v for k, v in raw.items() if k not in gone}

    @translate_errors
    async def server_info(self) -> dict[str, str]:
        """Server name and version, persistence and role from INFO (read-only), and the RDB
        ``save`` rules from CONFIG GET when the server allows it (managed services often
        refuse CONFIG: ``save`` is then absent)."""
        info = await self.client.info()
        out: dict[str, str] = {}
        valkey = info.get("valkey_version")
        out["server"] = "valkey" if valkey else "redis"
        out["version"] = str(valkey or info.get("redis_version", ""))
        for name in ("aof_enabled", "rdb_last_bgsave_status", "role", "maxmemory_policy"):
            if name in info:
                value = info[name]
                out[name] = value.decode() if isinstance(value, bytes) else str(value)
        try:
            saved = await self.client.config_get("save")
        except ResponseError:
            return out
        save = saved.get("save", saved.get(b"save"))
        if save is not None:
            out["save"] = save.decode() if isinstance(save, bytes) else str(save)
        return out
