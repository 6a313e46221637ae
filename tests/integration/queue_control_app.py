"""The application of the queue-control CLI tests (``test_cli_queue_control.py``), run as
``blitzq worker tests.integration.queue_control_app:queue`` subprocesses.

Broker URL and namespace come from ``BLITZQ_REDIS_URL`` / ``BLITZQ_NAMESPACE``. A short
visibility timeout makes the maintenance round (registrations) about a second.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis

from blitzq import Queue

queue = Queue(name="qc", visibility_timeout=3.0)


@queue.task(name="qc.add")
async def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@queue.task(name="qc.hold", retries=0)
async def hold(gate: str) -> str:
    """Run until the key ``{ns}:gate:<gate>`` exists (the test opens it), then return."""
    key = "{" + queue.namespace + "}:gate:" + gate
    async with aioredis.Redis.from_url(os.environ["BLITZQ_REDIS_URL"]) as client:
        while not await client.exists(key):
            await asyncio.sleep(0.05)
    return "released"
