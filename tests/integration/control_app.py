"""Application and command line for the unique / lock tests that need several processes.

Usage::

    python -m tests.integration.control_app worker URL NS MODE CONCURRENCY VT UNIQUE_TTL
    python -m tests.integration.control_app enqueue URL NS MODE VT UNIQUE_TTL COUNT LABEL

``worker`` runs a worker (its pid is added to ``{ns}:obs:ready`` once it runs); ``enqueue``
enqueues ``ctl.unique_job(LABEL, 0.3)`` COUNT times and appends each answer (``new:<id>`` or
``dup:<id>``) to the list ``{ns}:obs:answers``. Tasks record what they do under
``{ns}:obs:*``:

- ``runs``    hash label -> times a body started
- ``active:<resource>`` / ``max:<resource>``  current and highest concurrent holders
- ``started`` list of labels in start order; ``pid`` hash label -> pid
"""

from __future__ import annotations

import asyncio
import os
import sys

import redis.asyncio as aioredis

from blitzq import Queue, Worker

_MAX_SCRIPT = """
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
return n
"""


def obs(namespace: str, kind: str) -> str:
    """Key of one observation structure."""
    return "{" + namespace + "}:obs:" + kind


def build_queue(
    url: str, namespace: str, mode: str = "reliable", vt: float = 1.5, unique_ttl: float = 2.0
) -> Queue:
    """The Queue with ``ctl.unique_job`` and ``ctl.locked`` registered."""
    queue = Queue(
        name="ctl", redis_url=url, namespace=namespace, mode=mode,  # type: ignore[arg-type]
        visibility_timeout=vt,
    )  # fmt: skip
    client = aioredis.Redis.from_url(url)

    @queue.task(name="ctl.unique_job", unique=True, unique_ttl=unique_ttl)
    async def unique_job(label: str, seconds: float) -> str:
        await client.hincrby(obs(namespace, "runs"), label, 1)
        await client.hset(obs(namespace, "pid"), label, os.getpid())
        await asyncio.sleep(seconds)
        return label

    @queue.task(name="ctl.locked", lock="res:{resource}", lock_ttl=vt, retries=0)
    async def locked(resource: str, label: str, seconds: float) -> str:
        await client.eval(
            _MAX_SCRIPT, 2, obs(namespace, f"active:{resource}"), obs(namespace, f"max:{resource}")
        )
        await client.rpush(obs(namespace, "started"), label)
        await client.hset(obs(namespace, "pid"), label, os.getpid())
        runs = await client.hincrby(obs(namespace, "runs"), label, 1)
        try:
            await asyncio.sleep(seconds if runs == 1 else 0.05)  # a rerun after a crash is short
        finally:
            await client.decr(obs(namespace, f"active:{resource}"))
        return label

    return queue


async def _worker(url: str, ns: str, mode: str, concurrency: int, vt: float, ttl: float) -> None:
    queue = build_queue(url, ns, mode, vt, ttl)

    async def ready() -> None:
        client = aioredis.Redis.from_url(url)
        await client.sadd(obs(ns, "ready"), os.getpid())
        await client.aclose()

    queue.on_startup.append(ready)
    worker = Worker(queue, concurrency=concurrency, handle_signals=True, block_timeout=0.2)
    await worker.run()


async def _enqueue(
    url: str, ns: str, mode: str, vt: float, ttl: float, count: int, label: str
) -> None:
    queue = build_queue(url, ns, mode, vt, ttl)
    task = queue.tasks["ctl.unique_job"]
    client = aioredis.Redis.from_url(url)
    for _ in range(count):
        handle = await task.enqueue(label, 0.3)
        await client.rpush(
            obs(ns, "answers"), f"{'dup' if handle.duplicate else 'new'}:{handle.id}"
        )
    await client.aclose()
    await queue.close()


if __name__ == "__main__":
    command, url, ns, mode = sys.argv[1:5]
    if command == "worker":
        conc, vt, ttl = int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
        asyncio.run(_worker(url, ns, mode, conc, vt, ttl))
    else:
        vt, ttl, count, label = (
            float(sys.argv[5]),
            float(sys.argv[6]),
            int(sys.argv[7]),
            sys.argv[8],
        )
        asyncio.run(_enqueue(url, ns, mode, vt, ttl, count, label))
