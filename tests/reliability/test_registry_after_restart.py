"""A server restarted without its data (no persistence) knows a live worker's queues again by
the worker's next registration: ``queue stats``, ``queue pause`` and the dashboard read the
registry of known queues, which only a new process used to fill again."""

from __future__ import annotations

import asyncio

import pytest
import redis

from blitzq import Queue
from tests.integration.proc_tasks import make_worker, running

from .conftest import PrivateRedis

pytestmark = pytest.mark.timeout(90)


async def _known(queue: Queue) -> list[str]:
    return await queue.broker.known_queues()


async def test_a_live_workers_queues_are_known_again_after_the_server_lost_them(
    private_redis: PrivateRedis,
) -> None:
    # A third of the visibility timeout between registrations: one a second.
    queue = Queue("jobs", redis_url=private_redis.url, namespace="reg", visibility_timeout=3)

    @queue.task(name="reg.add")
    async def add(a: int, b: int) -> int:
        return a + b

    async with running(make_worker(queue)):
        assert await (await add.enqueue(1, 2)).result(timeout=20) == 3
        assert "jobs" in await _known(queue)
        with redis.Redis.from_url(private_redis.url) as client:
            client.flushall()  # what a restart without persistence leaves: nothing
        private_redis.shutdown()
        private_redis.start()
        async with asyncio.timeout(30):
            while "jobs" not in await _known(queue):
                await asyncio.sleep(0.1)  # the worker's next registration writes it
        assert {"jobs", "jobs:high", "jobs:low"} <= set(await _known(queue))
        assert await (await add.enqueue(2, 3)).result(timeout=30) == 5
    await queue.close()
