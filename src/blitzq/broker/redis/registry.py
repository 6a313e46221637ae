"""The Redis state store's registry role: queues, workers, counters, the memory policy.

What the CLI and monitoring read; nothing here is on a task's path except
:meth:`RedisRegistry.remember_queues`, which a producer calls once per new queue name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import OutOfMemoryError, ResponseError

from ..eviction import eviction_risk
from ..state import RegistryState
from .client import translate_errors
from .connection import RedisPart
from .keys import Keys

__all__ = ["RedisRegistry"]

logger = logging.getLogger("blitzq.broker")


def _registry_keys(keys: Keys) -> list[str]:
    """The keys ``register.lua`` and ``unregister.lua`` both take, in their order."""
    return [
        keys.workers,
        keys.worker_beats,
        keys.worker_counts,
        keys.stats,
        keys.worker_timeouts,
    ]


class RedisRegistry(RedisPart, RegistryState):
    """Known queues, live workers, counters and the memory policy (the
    ``registry`` role of :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection.
    """

    @translate_errors
    async def known_queues(self) -> list[str]:
        """Queues recorded by producers and workers."""
        names = await self.client.smembers(self.keys.queues)
        return sorted(name.decode() for name in names)

    @translate_errors
    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the registry of known queues.

        A server out of memory (``noeviction`` at ``maxmemory``) refuses the SADD even for
        names already there; the registry only serves inspection, so that refusal is logged
        (when a name is really missing) and not raised: a worker still starts.
        """
        if not queues:
            return
        try:
            await self.client.sadd(self.keys.queues, *queues)
        except OutOfMemoryError as exc:
            known = await self.client.smismember(self.keys.queues, list(queues))
            missing = [q for q, there in zip(queues, known, strict=True) if not there]
            if missing:
                logger.warning("could not register queue(s) %s: %s", ", ".join(missing), exc)

    @translate_errors
    async def register_worker(
        self,
        worker_id: str,
        info: bytes,
        ttl: float,
        counts: tuple[int, int] = (0, 0),
        base: tuple[int, int] = (0, 0),
        visibility_timeout: float | None = None,
        queues: Sequence[str] = (),
    ) -> None:
        """Record a live worker until ``ttl`` seconds from now, with its visibility timeout
        in ``{ns}:workers:vt`` and its ``queues`` in the known queues, and add what
        ``counts`` has above the counts already added for it to ``{ns}:stats``
        ``processed`` / ``failed`` (``lua/register.lua``, one call: see
        :meth:`RegistryState.register_worker`)."""
        vt = "" if visibility_timeout is None else repr(float(visibility_timeout))
        await self.scripts.call(
            "register",
            keys=[*_registry_keys(self.keys), self.keys.queues],
            args=[
                worker_id,
                info,
                repr(time.time() + ttl),
                *_counts(counts),
                *_counts(base),
                vt,
                *queues,
            ],
        )

    @translate_errors
    async def unregister_worker(self, worker_id: str, counts: tuple[int, int] = (0, 0)) -> None:
        """Remove a worker's registration and add what ``counts`` has above the counts
        already added for it to ``{ns}:stats`` ``processed`` / ``failed``
        (``lua/unregister.lua``, one call: see :meth:`RegistryState.unregister_worker`)."""
        await self.scripts.call(
            "unregister",
            keys=_registry_keys(self.keys),
            args=[worker_id, *_counts(counts)],
        )

    @translate_errors
    async def workers(self) -> dict[str, bytes]:
        """Live workers: registrations past their ``ttl`` are left out (and left in place
        for :meth:`lapsed_workers`, which reports and removes each once).

        Two reads in one plain pipeline, not a MULTI: a server at ``maxmemory`` refuses
        every command queued in a MULTI, reads included, and this is what inspection needs
        most when the server is full. (A worker whose registration lapses between the two
        reads is shown once more; nothing else can differ.)"""
        keys = self.keys
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(keys.worker_beats, "-inf", time.time())
            pipe.hgetall(keys.workers)
            expired, raw = await pipe.execute()
        gone = set(expired)
        return {k.decode(): v for k, v in raw.items() if k not in gone}

    @translate_errors
    async def lapsed_workers(self, limit: int = 100) -> dict[str, bytes]:
        """Take the registrations whose ``ttl`` passed (a worker that stopped renewing its
        registration without unregistering: killed, frozen, cut off): each is removed and
        returned to exactly one caller, however many ask at once.

        Args:
            limit: most registrations taken per call.

        Returns:
            worker id -> the info it last registered (``b""`` when none was left).
        """
        keys = self.keys
        expired = await self.client.zrangebyscore(
            keys.worker_beats, "-inf", time.time(), start=0, num=limit
        )
        if not expired:
            return {}
        async with self.client.pipeline(transaction=True) as pipe:
            for worker_id in expired:
                pipe.hget(keys.workers, worker_id)
                pipe.zrem(keys.worker_beats, worker_id)
            pipe.hdel(keys.workers, *expired)
            pipe.hdel(keys.worker_counts, *expired)
            pipe.zrem(keys.worker_timeouts, *expired)
            replies = await pipe.execute()
        taken: dict[str, bytes] = {}
        for i, worker_id in enumerate(expired):
            info, removed = replies[2 * i], replies[2 * i + 1]
            if removed:  # another caller's ZREM came first: it reports this one
                taken[worker_id.decode()] = info or b""
        return taken

    @translate_errors
    async def worker_timeouts(self, above: float) -> dict[str, float]:
        """See :meth:`RegistryState.worker_timeouts` (``lua/worker_timeouts.lua``, one call
        on the registry's keys; the live registrations are those whose expiry is after
        ``time.time()``, as :meth:`workers` counts them)."""
        keys = self.keys
        rows = await self.scripts.call(
            "worker_timeouts",
            keys=[keys.worker_timeouts, keys.worker_beats],
            args=[repr(float(above)), repr(time.time())],
        )
        return {rows[i].decode(): float(rows[i + 1]) for i in range(0, len(rows), 2)}

    @translate_errors
    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause (``paused``) or resume a queue for every worker of the namespace: the set
        ``{ns}:paused``, then a push on the event channel (a worker that misses the push reads
        the set at its next maintenance round). Returns whether the state changed
        (``False``: it already was).

        Two commands, not a MULTI: a server at its maxmemory (``noeviction``) refuses every
        command queued in a MULTI, while a plain SREM works there, so a queue can be resumed
        on a full server (the SADD of a pause is a write such a server refuses: an
        ``OutOfMemoryError`` BrokerError, nothing changed, nothing pushed)."""
        keys = self.keys
        change = self.client.sadd if paused else self.client.srem
        changed = await change(keys.paused, queue)
        await self.client.publish(keys.events, ("p:" if paused else "u:") + queue)
        return bool(changed)

    @translate_errors
    async def paused_queues(self) -> set[str]:
        """The paused queue names (workers re-read them every maintenance round)."""
        return {name.decode() for name in await self.client.smembers(self.keys.paused)}

    @translate_errors
    async def request_shutdown(self, worker_id: str) -> None:
        """Ask worker ``worker_id`` to shut down gracefully (a push on the event channel)."""
        await self.client.publish(self.keys.events, "x:" + worker_id)

    @translate_errors
    async def request_resize(self, worker_id: str, concurrency: int) -> None:
        """Ask worker ``worker_id`` to run at most ``concurrency`` tasks at once: the size in
        ``{ns}:workers:size`` (for a worker that misses the push: it takes it at its next
        maintenance round) and a push ``c:<concurrency>:<worker id>`` on the event channel.
        """
        size = int(concurrency)
        await self.client.hset(self.keys.worker_sizes, worker_id, size)
        await self.client.publish(self.keys.events, f"c:{size}:{worker_id}")

    @translate_errors
    async def take_resize(self, worker_id: str) -> int | None:
        """The concurrency asked of ``worker_id`` by :meth:`request_resize`, removed as it is
        read (one transaction); ``None`` when none is waiting (or it is not a number)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.worker_sizes, worker_id)
            pipe.hdel(self.keys.worker_sizes, worker_id)
            value, _ = await pipe.execute()
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    @translate_errors
    async def counters(self) -> dict[str, int]:
        """The namespace's counters (one HGETALL of ``{ns}:stats``). A field that is not an
        integer (a corrupted counter) reads as 0, with a WARNING naming it; the scripts that
        increment it reset it."""
        raw = await self.client.hgetall(self.keys.stats)
        out: dict[str, int] = {}
        for k, v in raw.items():
            name = k.decode(errors="replace")
            try:
                out[name] = int(v)
            except ValueError:
                logger.warning(
                    "counter %s of %s is not an integer (%r): read as 0",
                    name,
                    self.keys.stats,
                    v[:32],
                )
                out[name] = 0
        return out

    @translate_errors
    async def memory_policy(self) -> tuple[str, int] | None:
        """``(maxmemory-policy, maxmemory bytes)`` from INFO memory (read-only; ``None``
        when the server refuses INFO, as some managed services do). On a cluster, every
        primary's: blitzq's keys spread over them (a queue's slot, the spread layout's
        homes), so the first one that can evict them is answered, else the namespace's
        primary's."""
        if not self.conn.cluster:
            return _policy(await self._memory_info(self.conn.node_kwargs()))
        found = _policy(await self._memory_info(self.conn.node_kwargs()))
        for node in self.client.get_primaries():
            policy = _policy(await self._memory_info({"target_nodes": node}))
            if policy is not None and eviction_risk(*policy) is not None:
                return policy
        return found

    async def _memory_info(self, target: dict[str, Any]) -> dict[str, Any] | None:
        """INFO memory of the node ``target`` names (``None``: the server refuses INFO)."""
        try:
            info: dict[str, Any] = await self.client.info("memory", **target)
        except ResponseError:
            return None
        return info

    @translate_errors
    async def memory_use(self) -> tuple[int, int] | None:
        """``(used_memory - mem_not_counted_for_evict, maxmemory)`` from INFO memory (the
        figure Redis compares with ``maxmemory`` before refusing a write; read-only), or
        ``None`` when the server refuses INFO."""
        try:
            info = await self.client.info("memory", **self.conn.node_kwargs())
        except ResponseError:
            return None
        if "used_memory" not in info:
            return None
        used = int(info.get("used_memory", 0) or 0) - int(
            info.get("mem_not_counted_for_evict", 0) or 0
        )
        return used, int(info.get("maxmemory", 0) or 0)


def _policy(info: dict[str, Any] | None) -> tuple[str, int] | None:
    """``(maxmemory-policy, maxmemory)`` of an INFO memory answer, or ``None``."""
    policy = None if info is None else info.get("maxmemory_policy")
    if info is None or policy is None:
        return None
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    return policy, int(info.get("maxmemory", 0) or 0)


def _counts(counts: tuple[int, int]) -> tuple[int, int]:
    """``(processed, failed)`` as two non-negative integers (a script argument)."""
    processed, failed = counts
    return max(0, int(processed)), max(0, int(failed))
