"""An idle worker's task costs two commands, the shared read and the completion (issue 29).

The shared blocking read takes up to two entries a stream (``Transport.block_count``), so a
stream that gave one had no more: the loop blocks again at once, without the non-blocking
``fetch_levels`` look between two tasks of an idle worker. A read that gave two still sends
the loop to look first, so a backlog that arrives at an idle worker is taken in batches, not
one entry per read. Counted on the worker's transport (its own ``fetch_first`` calls, the
looks, and its shared reads); run on Redis 7.0 and on Valkey, whose woken reads differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, Worker

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_servers]


def _count_looks(queue: Queue, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the non-blocking looks (``fetch_first``, which the broker binds from its
    transport) that the worker's fetch loops make."""
    broker: Any = queue.broker
    looks = [0]
    real = broker.fetch_first

    async def counted(*args: Any, **kwargs: Any) -> Any:
        looks[0] += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(broker, "fetch_first", counted)
    return looks


async def _settled(worker: Worker, reads: int) -> None:
    """Wait until the worker's shared read has been sent ``reads`` times."""
    while getattr(getattr(worker, "_fetcher", None), "shared", None) is None:
        await asyncio.sleep(0.01)
    while worker._fetcher.shared.reads < reads:  # type: ignore[union-attr]
        await asyncio.sleep(0.01)


async def test_tasks_one_at_a_time_need_no_look_between_them(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_queue, producer = make_queue(), make_queue()
    for q in (worker_queue, producer):

        @q.task(name="rt.one")
        async def one() -> int:
            return 1

    looks = _count_looks(worker_queue, monkeypatch)
    worker = Worker(worker_queue, concurrency=10, block_timeout=5)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(_settled(worker, 1), 30)
        handle = await producer.tasks["rt.one"].enqueue()
        assert await handle.result(timeout=30) == 1
        before, reads = looks[0], worker._fetcher.shared.reads  # type: ignore[union-attr]
        for _ in range(10):
            handle = await producer.tasks["rt.one"].enqueue()
            assert await handle.result(timeout=30) == 1
        assert looks[0] == before
        assert worker._fetcher.shared.reads >= reads + 10  # type: ignore[union-attr]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await producer.close()
        await worker_queue.close()


async def test_a_backlog_at_an_idle_worker_is_taken_in_batches(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_queue, producer = make_queue(), make_queue()
    done = asyncio.Event()
    ran: list[int] = []
    for q in (worker_queue, producer):

        @q.task(name="rt.many")
        async def many(i: int) -> None:
            ran.append(i)
            if len(ran) == 60:
                done.set()

    looks = _count_looks(worker_queue, monkeypatch)
    worker = Worker(worker_queue, concurrency=20, block_timeout=5)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(_settled(worker, 1), 30)
        reads = worker._fetcher.shared.reads  # type: ignore[union-attr]
        await producer.tasks["rt.many"].enqueue_many([((i,), {}) for i in range(60)])
        await asyncio.wait_for(done.wait(), 60)
        assert sorted(ran) == list(range(60))
        # Two entries from the read send the loop to look: the rest come in batches of up
        # to 20, not one entry per shared read.
        assert looks[0] >= 1
        assert worker._fetcher.shared.reads - reads <= 10  # type: ignore[union-attr]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await producer.close()
        await worker_queue.close()


async def test_a_worker_of_one_slot_reads_one_and_keeps_the_order(
    make_queue: Callable[..., Queue],
) -> None:
    """With one slot the read asks one entry (a second would find no slot and go back to
    the tail of its stream): a burst runs in the order it was enqueued, none handed back."""
    worker_queue, producer = make_queue(), make_queue()
    done = asyncio.Event()
    ran: list[int] = []
    for q in (worker_queue, producer):

        @q.task(name="rt.ordered")
        async def ordered(i: int) -> None:
            ran.append(i)
            if len(ran) == 20:
                done.set()

    worker = Worker(worker_queue, concurrency=1, block_timeout=5)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(_settled(worker, 1), 30)
        await producer.tasks["rt.ordered"].enqueue_many([((i,), {}) for i in range(20)])
        await asyncio.wait_for(done.wait(), 60)
        assert ran == list(range(20))
        assert worker.handed_back == 0
        assert worker._fetcher.shared.counts["default"] == 1  # type: ignore[union-attr]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await producer.close()
        await worker_queue.close()
