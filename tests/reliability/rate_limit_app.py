"""The application of the rate-limit accuracy test, and its worker process entry point.

Usage (one worker process)::

    python tests/reliability/rate_limit_app.py URL NAMESPACE MODE CONCURRENCY

The task :data:`TICK` is limited to :data:`RATE`; each run records ``"<time.time()> <pid>"``
in the list ``{ns}:obs:starts`` as its first action. A worker adds its pid to
``{ns}:obs:ready`` once it runs, and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import redis.asyncio as aioredis

from blitzq import Queue, Worker

#: Name of the rate-limited task (explicit, so producer and workers agree).
TICK = "ratecheck.tick"
#: Its limit: a burst of 50, then 50 per second.
RATE = "50/s"


def obs_key(namespace: str, kind: str) -> str:
    """Key of one observation structure (``starts`` list, ``ready`` set)."""
    return "{" + namespace + "}:obs:" + kind


def build_queue(url: str, namespace: str, mode: str = "reliable") -> Queue:
    """The Queue with :data:`TICK` registered.

    Args:
        url: Redis URL.
        namespace: key namespace of the test.
        mode: ``"reliable"`` or ``"fast"``.
    """
    queue = Queue(name="ratecheck", redis_url=url, namespace=namespace, mode=mode)  # type: ignore[arg-type]
    starts = obs_key(namespace, "starts")
    state: dict[str, Any] = {}

    @queue.task(name=TICK, rate_limit=RATE, retries=0)
    async def tick(i: int) -> int:
        """Record the start time (first thing), return ``i``."""
        started = time.time()
        client = state.get("client")
        if client is None:
            client = state["client"] = aioredis.Redis.from_url(url)
        await client.rpush(starts, f"{started!r} {os.getpid()}")
        return i

    async def close_client() -> None:
        client = state.pop("client", None)
        if client is not None:
            await client.aclose()

    queue.on_shutdown.append(close_client)
    return queue


async def main(url: str, namespace: str, mode: str, concurrency: int) -> None:
    """Run one worker until SIGTERM; announce readiness in ``{ns}:obs:ready``."""
    queue = build_queue(url, namespace, mode)

    async def announce() -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await client.sadd(obs_key(namespace, "ready"), os.getpid())
        finally:
            await client.aclose()

    queue.on_startup.append(announce)
    worker = Worker(queue, concurrency=concurrency, handle_signals=True, shutdown_timeout=5.0)
    try:
        await worker.run()
    finally:
        await queue.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
