"""``@queue.task(mode="fast")`` with an in-process Worker on the test Redis: a burst worker
of a reliable Queue runs its fast and reliable tasks and exits; one that registers no fast
task leaves the lists alone and still ends its burst; a fast Queue needs no lane."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from blitzq import Queue, Worker
from blitzq.broker.redis.keys import Keys

pytestmark = pytest.mark.timeout(60)


def _queue(make_queue: Callable[..., Queue], fast_task: bool, **kwargs: object) -> Queue:
    q = make_queue(name="dm", **kwargs)

    @q.task(name="dm.reliable")
    async def reliable(x: int) -> int:
        return x + 1

    if fast_task:

        @q.task(name="dm.fast", mode="fast")
        async def fast(x: int) -> int:
            return x * 10

    return q


async def test_a_burst_worker_runs_both_paths_and_exits(
    make_queue: Callable[..., Queue], server_url: str, namespace: str
) -> None:
    q = _queue(make_queue, fast_task=True)
    handles = [await q.send("dm.fast", [i]) for i in range(3)]
    handles += [await q.send("dm.reliable", [i]) for i in range(3)]
    handles += await q.send_many([("dm.fast", [7], {}), ("dm.reliable", [7], {})])
    client = aioredis.Redis.from_url(server_url)
    try:
        keys = Keys(namespace)
        assert await client.llen(keys.list("dm")) == 4
        assert await client.xlen(keys.stream("dm")) == 4
    finally:
        await client.aclose()
    await asyncio.wait_for(Worker(q, burst=True, handle_signals=False).run(), 30)
    assert [await h.result(timeout=5) for h in handles] == [0, 10, 20, 1, 2, 3, 70, 8]
    assert (await q.stats(["dm"]))["queues"]["dm"]["waiting"] == 0


async def test_a_worker_with_no_fast_task_leaves_the_lists_and_ends_its_burst(
    make_queue: Callable[..., Queue],
) -> None:
    producer = _queue(make_queue, fast_task=True)
    await producer.send("dm.fast", [1])
    handle = await producer.send("dm.reliable", [1])
    plain = _queue(make_queue, fast_task=False)
    await asyncio.wait_for(Worker(plain, burst=True, handle_signals=False).run(), 30)
    assert await handle.result(timeout=5) == 2
    # The fast message waits for a worker that knows the task is fast.
    assert (await plain.stats(["dm"]))["queues"]["dm"]["waiting"] == 1


async def test_a_fast_queue_has_no_lane(make_queue: Callable[..., Queue]) -> None:
    q = _queue(make_queue, fast_task=True, mode="fast")
    assert q.broker.fast_lane is None
    handle = await q.send("dm.fast", [2])
    await asyncio.wait_for(Worker(q, burst=True, handle_signals=False).run(), 30)
    assert await handle.result(timeout=5) == 20
