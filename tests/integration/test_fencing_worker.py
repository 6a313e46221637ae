"""Fencing seen from an in-process worker: ``Worker.stale_completions`` and its WARNING.

While a task runs, another consumer recovers its message (as it would after the worker's
lease lapsed) and the worker itself runs the redelivery to success. When the first run then
ends, its completion is stale: nothing is written, the worker counts it and logs it once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import Queue, TaskState, current_task
from blitzq.broker import Broker
from blitzq.broker.redis import ReliableRedisBroker
from tests.broker_kinds import is_reliable_redis

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "memory"])
async def queue(
    request: pytest.FixtureRequest, make_queue: Callable[..., Queue]
) -> AsyncIterator[Queue]:
    """A reliable Redis Queue, or one on a fresh ``memory://`` name (the private Valkey)."""
    if request.param == "memory":
        q = Queue(redis_url="memory://fence-" + uuid.uuid4().hex)
    else:
        q = make_queue(mode="reliable")
    yield q
    await q.close()


async def thief_of(queue: Queue) -> Broker:
    """A second consumer of the queue's broker (another worker, as far as leases go)."""
    broker = queue.broker
    if is_reliable_redis(broker):
        other = ReliableRedisBroker(broker.state.conn.url, broker.state.keys.namespace)
        await other.prepare_consumer(["default"], "thief")
        return other
    return broker


@pytest.mark.parametrize("fail_first", [False, True], ids=["late-success", "late-failure"])
async def test_the_late_completion_of_a_recovered_run_is_counted_and_logged(
    queue: Queue, fail_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    started, gate = asyncio.Event(), asyncio.Event()

    @queue.task(name="t.fenced", retries=0)
    async def fenced() -> str:
        context = current_task()
        assert context is not None
        if context.attempt > 1:
            return "redelivery"
        started.set()
        await gate.wait()
        if fail_first:
            raise RuntimeError("the first run failed late")
        return "first run"

    thief = await thief_of(queue)
    worker = make_worker(queue, concurrency=4)
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    try:
        async with running(worker):
            handle = await fenced.enqueue()
            await asyncio.wait_for(started.wait(), 10)
            await eventually(lambda: thief.recover("default", 0.001, 10, 5), lambda r: r == (1, 0))
            assert await handle.result(timeout=10) == "redelivery"
            assert worker.stale_completions == 0
            gate.set()
            await eventually(lambda: asyncio.sleep(0, worker.stale_completions), lambda n: n == 1)
            record: Any = await queue.inspect(handle.id)
            assert record.state is TaskState.SUCCEEDED
            assert record.result == "redelivery"
            assert await queue.dead_letter_count() == 0
            assert (await queue.broker.counters())["stale_completions"] == 1
            assert (await queue.stats(["default"]))["stale_completions"] == 1
    finally:
        if thief is not queue.broker:
            await thief.close()
    warnings = [r for r in caplog.records if "stale completion" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert handle.id in warnings[0].getMessage()
    assert "queue default" in warnings[0].getMessage()


async def test_progress_of_a_run_that_lost_its_lease_is_not_stored(queue: Queue) -> None:
    started, gate, reported = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @queue.task(name="t.progress", retries=0)
    async def reporting() -> str:
        context = current_task()
        assert context is not None
        if context.attempt > 1:
            return "redelivery"
        started.set()
        await gate.wait()
        context.update_progress(1, 2, "late")
        await asyncio.sleep(0.2)  # the write goes out while the run is still going
        reported.set()
        return "first run"

    thief = await thief_of(queue)
    worker = make_worker(queue, concurrency=4)
    try:
        async with running(worker):
            handle = await reporting.enqueue()
            await asyncio.wait_for(started.wait(), 10)
            await eventually(lambda: thief.recover("default", 0.001, 10, 5), lambda r: r == (1, 0))
            assert await handle.result(timeout=10) == "redelivery"
            gate.set()
            await asyncio.wait_for(reported.wait(), 10)
            await eventually(lambda: asyncio.sleep(0, worker.stale_completions), lambda n: n == 1)
            assert await queue.get_progress(handle.id) is None
    finally:
        if thief is not queue.broker:
            await thief.close()
