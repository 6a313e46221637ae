"""The application of the operator-tool tests (``test_cli_ops.py``): ``blitzq worker
tests.integration.ops_app:queue --burst``, ``blitzq check``, ``blitzq scheduler run``.

The Queue takes its broker URL and namespace from the command line (``BLITZQ_REDIS_URL`` /
``BLITZQ_NAMESPACE``). Task ``ops.add`` records each result under ``{ns}:obs:sums``.
"""

from __future__ import annotations

import os

import redis.asyncio as aioredis

from blitzq import Queue

queue = Queue(name="ops")


@queue.task(name="ops.add")
async def add(a: int, b: int) -> int:
    """Return ``a + b`` and push it to the list ``{ns}:obs:sums``."""
    url = os.environ["BLITZQ_REDIS_URL"]
    key = "{" + queue.namespace + "}:obs:sums"
    async with aioredis.Redis.from_url(url) as client:
        await client.rpush(key, a + b)
    return a + b


@queue.task(name="ops.boom", retries=0)
async def boom(message: str) -> None:
    """Fail with ``ValueError(message)`` (dead-lettered: no retries)."""
    raise ValueError(message)


@queue.periodic(3600.0, name="ops.hourly")
async def hourly() -> str:
    """A code-defined periodic entry (every hour)."""
    return "hourly"
