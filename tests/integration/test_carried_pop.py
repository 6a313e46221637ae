"""Fast mode's pop that carries the flusher's next completion batch (``broker/redis/carry.py``),
on a real server (Redis, and the embedded Valkey): the batch is applied and the messages
popped in one round trip, in the order of the levels; a batch the server refuses is handed
back (not applied) while the pop still returns its messages; the flusher sends nothing while
a carried batch is in flight and takes the batch back when it was not applied; a fast-mode
worker drains with every record written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, Worker
from blitzq.broker import Completion
from blitzq.broker.redis.carry import CarriedPop
from blitzq.worker.flusher import Flusher

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_servers]


async def _warm(broker: Any) -> None:
    """Load both scripts on the server (a fresh one answers NOSCRIPT to a carried call, whose
    batch is then handed back: the flusher's own write loads the script)."""
    await broker.complete([_completion("warm")])
    await broker.fetch_first(["warm"], 1, 0)


def _completion(task_id: str, record: bytes = b"rec", **kwargs: Any) -> Completion:
    return Completion("default", None, task_id, record, 60, **kwargs)


async def test_a_pop_carries_a_batch_applied_first(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode="fast")
    broker = queue.broker
    carry = broker.carry
    assert isinstance(carry, CarriedPop)
    await _warm(broker)
    await broker.publish("default:high", [b"h1"])
    await broker.publish("default", [b"n1", b"n2", b"n3"])
    levels = ["default:high", "default", "default:low"]
    got, stale = await carry(levels, 3, [_completion("t1", b"r1"), _completion("t2", b"r2")])
    assert stale == []
    assert not isinstance(got, BaseException)
    assert [(d.queue, d.payload) for d in got] == [
        ("default:high", b"h1"),
        ("default", b"n1"),
        ("default", b"n2"),
    ]
    prefix = "{" + namespace + "}:"
    assert await raw_redis.get(prefix + "t:t1") == b"r1"
    assert await raw_redis.get(prefix + "t:t2") == b"r2"
    assert carry.carried == 1
    await queue.close()


async def test_a_refused_batch_is_handed_back_and_the_pop_still_returns(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode="fast")
    broker = queue.broker
    carry = broker.carry
    assert isinstance(carry, CarriedPop)
    await _warm(broker)
    prefix = "{" + namespace + "}:"
    await raw_redis.set(prefix + "sched", b"not a zset")  # a reschedule's ZADD fails
    await broker.publish("default", [b"m1"])
    batch = [_completion("t1", None, reschedule=b"again", delay=5.0)]
    got, stale = await carry(["default"], 5, batch)
    assert stale is None  # not applied: the flusher writes it itself
    assert not isinstance(got, BaseException)
    assert [d.payload for d in got] == [b"m1"]
    assert carry.carried == 0
    await queue.close()


async def test_the_flusher_waits_for_a_carried_batch_and_takes_back_a_refused_one(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode="fast")
    broker = queue.broker
    flusher = Flusher(broker)
    written: list[list[Completion]] = []
    flusher.on_written = lambda batch, stale: written.append(batch)
    runner = asyncio.create_task(flusher.run())
    try:
        flusher.hold()  # as a fetch loop does before it looks
        flusher.add(_completion("a"))
        flusher.add(_completion("b"))
        batch = flusher.carry()
        assert [c.task_id for c in batch] == ["a", "b"]
        assert flusher.carry() == []  # one batch in flight at a time
        flusher.release()
        flusher.add(_completion("c"))
        for _ in range(5):  # the writer runs, and must not send while the carry is out
            await asyncio.sleep(0)
        assert written == []
        flusher.carried(batch, None)  # not applied: the flusher writes all three, in order
        await asyncio.wait_for(flusher.flush(), 10)
        assert [c.task_id for b in written for c in b] == ["a", "b", "c"]
        prefix = "{" + namespace + "}:"
        assert await raw_redis.get(prefix + "t:c") == b"rec"
    finally:
        flusher.close()
        await asyncio.wait_for(runner, 10)
        await queue.close()


async def test_a_fast_mode_worker_drains_with_every_record(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(mode="fast")
    n = 300
    ran = asyncio.Event()
    count = [0]

    @queue.task
    async def bump(i: int) -> int:
        await raw_redis.incr(f"{queue.namespace}:carried-counter")
        count[0] += 1
        if count[0] == n:
            ran.set()
        return i

    handles = await bump.enqueue_many([(i,) for i in range(n)])
    worker = Worker(queue, concurrency=10)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(ran.wait(), 30)
        results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
        assert results == list(range(n))
    finally:
        worker.stop()
        await asyncio.wait_for(running, 20)
        await raw_redis.delete(f"{queue.namespace}:carried-counter")
        await queue.close()
