"""Completions held while the next fetch of a backlog is in flight (``Flusher.hold``).

While a worker drains a backlog, the completions of the batch it just started wait until the
next fetch returns, so that the server answers the fetch first and applies them while the
worker starts what it fetched. A hold must never keep a completion back for long: the fetch
that finds the queue empty releases it before it blocks, and a hold nobody releases ends after
``MAX_HOLD`` seconds.

The drains run on the session's Redis and on the embedded Valkey (``both_servers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker import Completion
from blitzq.worker import fetch, flusher
from blitzq.worker.flusher import Flusher

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.both_servers


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


async def test_a_drained_backlog_writes_every_result_and_releases_the_hold(
    make_queue: Callable[..., Queue], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hold nobody released would now keep results back for a minute, not 50 ms.
    monkeypatch.setattr(flusher, "MAX_HOLD", 60.0)
    queue = make_queue(mode=mode)
    concurrency = fetch._OVERLAP_MIN

    @queue.task(name="overlap.triple")
    async def triple(x: int) -> int:
        return 3 * x

    try:
        # Exactly four full fetches: the fifth finds the levels empty and blocks, so it must
        # let the held completions go before it blocks.
        n = 4 * concurrency
        handles = await triple.enqueue_many([(i,) for i in range(n)])
        worker = make_worker(queue, concurrency=concurrency, block_timeout=3.0)
        async with running(worker):
            results = await asyncio.wait_for(
                asyncio.gather(*(h.result(timeout=20) for h in handles)), 25
            )
            assert results == [3 * i for i in range(n)]

            async def blocked_state() -> tuple[dict[str, int], int]:
                return worker._fetcher.in_fetch(), worker._flusher.held

            # Inside the fifth fetch (four returned), blocked, with nothing held.
            await eventually(blocked_state, lambda s: s == ({"default": 4}, 0), timeout=20)
            # More work after the backlog: it runs while nothing is held.
            assert await (await triple.enqueue(7)).result(timeout=20) == 21
    finally:
        await queue.close()


async def test_a_backlog_larger_than_many_batches_loses_no_completion(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode)
    seen: list[int] = []

    @queue.task(name="overlap.note")
    async def note(x: int) -> int:
        seen.append(x)
        if x % 2:
            await asyncio.sleep(0)  # some runs suspend: not every slot frees at once
        return x

    try:
        n = 2000
        handles = await note.enqueue_many([(i,) for i in range(n)])
        async with running(make_worker(queue, concurrency=64, batch_size=64)):
            results = await asyncio.wait_for(
                asyncio.gather(*(h.result(timeout=60) for h in handles)), 90
            )
        assert results == list(range(n))
        assert sorted(seen) == list(range(n))  # each ran once
        stats = await queue.stats()
        assert all(q["waiting"] == 0 and q["in_flight"] == 0 for q in stats["queues"].values())
    finally:
        await queue.close()


async def _record(raw_redis: Any, queue: Queue, task_id: str) -> bytes | None:
    value: bytes | None = await raw_redis.get(queue.broker.state.keys.record(task_id))  # type: ignore[attr-defined]
    return value


async def test_a_held_batch_waits_for_the_release(
    make_queue: Callable[..., Queue], raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flusher, "MAX_HOLD", 60.0)
    queue = make_queue(store_results=True)
    try:
        writer = Flusher(queue.broker)
        running_writer = asyncio.create_task(writer.run())
        writer.hold()
        writer.add(Completion("default", None, "held-1", record=b"\x01", record_ttl=60))
        for _ in range(20):  # many turns of the loop: a writer not held would have sent it
            await asyncio.sleep(0)
        await raw_redis.ping()
        assert await _record(raw_redis, queue, "held-1") is None
        assert writer.held == 1
        writer.release()
        await asyncio.wait_for(writer.flush(), 10)
        assert await _record(raw_redis, queue, "held-1") == b"\x01"
        writer.close()
        await asyncio.wait_for(running_writer, 10)
    finally:
        await queue.close()


async def test_a_hold_nobody_releases_ends_after_max_hold(
    make_queue: Callable[..., Queue], raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flusher, "MAX_HOLD", 0.2)
    queue = make_queue(store_results=True)
    try:
        writer = Flusher(queue.broker)
        running_writer = asyncio.create_task(writer.run())
        writer.hold()  # never released: a fetch that hangs
        writer.add(Completion("default", None, "held-2", record=b"\x02", record_ttl=60))
        await asyncio.wait_for(writer.flush(), 10)
        assert await _record(raw_redis, queue, "held-2") == b"\x02"
        writer.close()
        await asyncio.wait_for(running_writer, 10)
    finally:
        await queue.close()


async def test_call_when_applied_follows_the_watched_completion(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    """The callback runs once the watched completion was applied; not for a stale one (its
    delivery is not held: nothing written), nor for other completions."""
    queue = make_queue(store_results=True)
    try:
        writer = Flusher(queue.broker)
        running_writer = asyncio.create_task(writer.run())
        calls: list[str] = []
        stale = Completion("default", b"1-1", "stale-1", record=b"\x01", record_ttl=60)
        writer.add(stale)
        writer.call_when_applied(stale, lambda: calls.append("stale"))
        writer.add(Completion("default", None, "other-1", record=b"\x01", record_ttl=60))
        await asyncio.wait_for(writer.flush(), 10)
        assert calls == []
        assert writer.stale == 1
        done = Completion("default", None, "done-1", record=b"\x02", record_ttl=60)
        writer.add(done)
        writer.call_when_applied(done, lambda: calls.append("done"))
        await asyncio.wait_for(writer.flush(), 10)
        assert await _record(raw_redis, queue, "done-1") == b"\x02"
        assert calls == ["done"]
        writer.add(Completion("default", None, "later-1", record=b"\x03", record_ttl=60))
        await asyncio.wait_for(writer.flush(), 10)
        assert calls == ["done"]  # once
        writer.close()
        await asyncio.wait_for(running_writer, 10)
    finally:
        await queue.close()
