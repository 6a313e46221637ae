"""Fast mode's pops that carry the flusher's completions (``broker/redis/carrying.py``).

A fast-mode worker on one server sends its waiting completions and its next non-blocking pop
in one round trip. Every result must still be written (a drain under load, and a lone task
whose completion no pop is due to carry), and a carried batch the server refuses is written
again by the flusher itself once it can be.

The tests run on the session's Redis and on the embedded Valkey (``both_servers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker import Completion
from blitzq.broker.redis.scripts import load
from blitzq.worker.flusher import BIG_WRITE, Flusher

from .proc_tasks import make_worker, running

pytestmark = [pytest.mark.both_servers, pytest.mark.timeout(60)]


async def test_a_fast_drain_carries_completions_and_writes_every_result(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(mode="fast")
    assert queue.broker.carry is not None

    @queue.task(name="carry.double")
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    try:
        n = 600
        handles = await double.enqueue_many([(i,) for i in range(n)])
        worker = make_worker(queue, concurrency=8)
        async with running(worker):
            results = await asyncio.wait_for(
                asyncio.gather(*(h.result(timeout=30) for h in handles)), 40
            )
            assert results == [2 * i for i in range(n)]
            assert worker._flusher.carried > 0  # the pops carried completions
            # Idle now: a lone task's result is written with no pop due to carry it.
            assert await (await double.enqueue(21)).result(timeout=20) == 42
    finally:
        await queue.close()


async def test_a_reliable_broker_carries_nothing(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(mode="reliable")
    try:
        assert queue.broker.carry is None
    finally:
        await queue.close()


async def test_a_refused_carried_batch_is_written_by_the_flusher(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(mode="fast")

    @queue.task(name="carry.noop")
    async def noop() -> None:
        return None

    try:
        broker = queue.broker
        carry = broker.carry
        assert carry is not None
        keys = broker.transport.keys  # type: ignore[attr-defined]
        await noop.enqueue()
        # The schedule's key of another type: complete.lua refuses a batch with a retry.
        await raw_redis.set(keys.schedule, "not a zset")
        flusher = Flusher(broker)
        retry = Completion("default", None, "t-carried", reschedule=b"\x90", delay=60.0)
        flusher.add(retry)
        batch = flusher.board()
        assert batch == [retry]
        assert flusher.board() is None  # one carried batch at a time
        outcomes: list[Any] = []

        def landed(stale: list[Completion] | None) -> None:
            outcomes.append(stale)
            flusher.landed(stale)

        popped = await carry(["default"], 10, batch, landed)
        assert len(popped) == 1  # the pop ran although the completions were refused
        assert outcomes == [None]  # not applied: left to the flusher
        assert flusher.backlog == 1
        assert flusher.carried == 0
        # The flusher writes it itself once the server takes it.
        await raw_redis.delete(keys.schedule)
        writer = asyncio.create_task(flusher.run())
        try:
            await asyncio.wait_for(flusher.flush(), 20)
        finally:
            flusher.close()
            await asyncio.wait_for(writer, 20)
        assert await raw_redis.zscore(keys.schedule, "t-carried") is not None
    finally:
        await queue.close()


async def test_a_carried_batch_is_applied_with_the_pop(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(mode="fast")

    @queue.task(name="carry.noop2")
    async def noop() -> None:
        return None

    try:
        broker = queue.broker
        carry = broker.carry
        assert carry is not None
        keys = broker.transport.keys  # type: ignore[attr-defined]
        # A server that knows the scripts (a fresh one refuses the carried call with NOSCRIPT
        # and the flusher writes the batch itself: test_a_refused_carried_batch_...).
        for name in ("complete", "pop_levels"):
            await raw_redis.script_load(load(name).source)
        flusher = Flusher(broker)
        done = Completion(
            "default", None, "t-done", record=b"\x81\xa5state\xa9succeeded", record_ttl=60
        )
        flusher.add(done)
        batch = flusher.board()
        assert batch is not None
        # Nothing waiting: the pop takes nothing, the completion is applied all the same.
        assert await carry(["default"], 10, batch, flusher.landed) == []
        assert flusher.backlog == 0
        assert flusher.carried == 1
        assert await raw_redis.get(keys.record("t-done")) == done.record
    finally:
        await queue.close()


async def test_a_batch_a_server_may_refuse_for_its_size_is_not_carried(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(mode="fast")
    try:
        flusher = Flusher(queue.broker)
        big = Completion("default", None, "t-big", record=b"x" * BIG_WRITE, record_ttl=60)
        flusher.add(big)
        assert flusher.board() is None  # left to the writer's own path
        flusher.add(Completion("default", None, "t-small", record=b"\x90", record_ttl=60))
        assert flusher.board() is None  # the big one is first in line
    finally:
        await queue.close()
