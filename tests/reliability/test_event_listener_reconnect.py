"""The worker's event listener subscribes again after its connection is killed (issue 7, §8).

On a private server (killing pub/sub connections on the shared one would hit other tests):
``CLIENT KILL TYPE pubsub`` drops the listener's connection; it subscribes again by itself,
and a running task is still cancelled at once by ``cancel()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from blitzq import Queue, TaskCancelled
from tests.integration.proc_tasks import eventually, make_worker, running

from .conftest import PrivateRedis


async def subscribers(client: aioredis.Redis, channel: str) -> int:
    """Connections subscribed to ``channel``."""
    answer = await client.pubsub_numsub(channel)
    return int(answer[0][1])


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_the_listener_subscribes_again_after_its_connection_is_killed(
    private_redis: PrivateRedis, make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="evr", mode=mode, redis_url=private_redis.url)
    started = asyncio.Event()

    @queue.task(name="evr.sleepy")
    async def sleepy() -> str:
        started.set()
        await asyncio.sleep(60)
        return "not cancelled"

    channel = queue.broker.state.keys.events  # type: ignore[attr-defined]
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        async with running(make_worker(queue, concurrency=2)):
            await eventually(lambda: subscribers(client, channel), lambda n: n == 1, 30.0)
            for _ in range(2):  # twice: the listener keeps coming back
                killed = await client.client_kill_filter(_type="pubsub")
                assert killed >= 1
                await eventually(lambda: subscribers(client, channel), lambda n: n == 1, 30.0)
            handle = await sleepy.enqueue()
            await asyncio.wait_for(started.wait(), 30)
            await handle.cancel()
            with pytest.raises(TaskCancelled):
                await handle.result(timeout=30)
    finally:
        await client.aclose()
        await queue.close()
