"""Priority levels against a real Redis, in both modes.

A task's priority picks its physical queue (``<q>:high``, ``<q>``, ``<q>:low``); a worker of
``<q>`` takes from the three in that order on every batch, under one concurrency budget, and
blocks on all three at once when they are empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, Worker, current_task
from blitzq.broker.redis import ReliableRedisBroker
from blitzq.routing import levels

from .proc_tasks import eventually, make_worker, running

# Fetching over several levels differs on Redis >= 7.2 / Valkey: run on both.
pytestmark = pytest.mark.both_servers


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``pq`` in ``mode``, closed after the test."""
    q = make_queue(name="pq", mode=mode)
    yield q
    await q.close()


async def test_priority_picks_the_physical_queue(queue: Queue) -> None:
    @queue.task(name="p.urgent", priority="high")
    async def urgent() -> None:
        return None

    @queue.task(name="p.plain")
    async def plain() -> None:
        return None

    assert (await urgent.enqueue()).queue == "pq:high"
    assert (await plain.enqueue()).queue == "pq"
    assert (await plain.options(priority="low").enqueue()).queue == "pq:low"
    assert (await plain.options(priority="high").enqueue()).queue == "pq:high"
    # A per-call priority beats the decorator's, and a per-call queue keeps the level.
    assert (await urgent.options(priority="normal").enqueue()).queue == "pq"
    assert (await urgent.options(queue="other").enqueue()).queue == "other:high"
    assert (await queue.send("p.urgent")).queue == "pq:high"
    assert (await queue.send("p.plain", priority="low")).queue == "pq:low"
    stats = await queue.stats(["pq:high", "pq", "pq:low", "other:high"])
    waiting = {name: counts["waiting"] for name, counts in stats["queues"].items()}
    assert waiting == {"pq:high": 3, "pq": 2, "pq:low": 2, "other:high": 1}
    with pytest.raises(ConfigurationError):
        plain.options(priority="urgent")
    with pytest.raises(ConfigurationError):
        queue.task(name="p.bad", priority="top")(plain.fn)  # type: ignore[arg-type]


async def test_high_runs_before_the_normal_backlog_and_low_runs_last(queue: Queue) -> None:
    order: list[str] = []
    gate = asyncio.Event()

    @queue.task(name="p.step")
    async def step(label: str) -> None:
        order.append(label)
        if label == "gate":
            await gate.wait()

    await step.options(priority="low").enqueue("low-1")
    await step.enqueue("gate")
    for i in range(3):
        await step.enqueue(f"normal-{i}")
    await step.options(priority="low").enqueue("low-2")
    async with running(make_worker(queue, concurrency=1)):
        await eventually(lambda: asyncio.sleep(0, order), lambda o: o == ["gate"], 30.0)
        # The worker is busy with a normal task and has a normal backlog: a high task
        # enqueued now is still the next one to run.
        handle = await step.options(priority="high").enqueue("high")
        gate.set()
        await handle.result(timeout=5)
        await eventually(lambda: asyncio.sleep(0, len(order)), lambda n: n == 7, 30.0)
    assert order == ["gate", "high", "normal-0", "normal-1", "normal-2", "low-1", "low-2"]


async def test_one_concurrency_budget_for_all_levels(queue: Queue) -> None:
    running_now = 0
    peak = 0

    @queue.task(name="p.busy")
    async def busy() -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        await asyncio.sleep(0.05)
        running_now -= 1

    handles = []
    for priority in ("high", "normal", "low"):
        handles += await busy.options(priority=priority).enqueue_many([() for _ in range(6)])
    async with running(make_worker(queue, concurrency=2)):
        for h in handles:
            await h.result(timeout=10)
    assert peak == 2, f"peak concurrency {peak} with concurrency=2 over three levels"


async def test_low_message_wakes_an_idle_worker_at_once(queue: Queue) -> None:
    """A worker blocked on an empty queue (default block_timeout=1 s) sees a push to
    ``:low`` immediately: it blocks on every level at once, not on one after another."""
    started: dict[str, float] = {}

    @queue.task(name="p.stamp")
    async def stamp(label: str) -> None:
        started[label] = time.time()

    worker = Worker(queue, concurrency=4)  # block_timeout is the default 1.0 s
    assert worker.block_timeout == 1.0
    latencies = []
    async with running(worker):
        await eventually(queue.broker.workers, lambda w: worker.id in w, 30.0)
        for i in range(3):
            await asyncio.sleep(0.3)  # idle: the fetch loop is inside its blocking read
            sent = time.time()
            handle = await stamp.options(priority="low").enqueue(f"low-{i}")
            assert handle.queue == "pq:low"
            await handle.result(timeout=5)
            latencies.append(started[f"low-{i}"] - sent)
    print(f"enqueue -> start of a :low task on an idle worker: {[round(x, 4) for x in latencies]}")
    # Blocking on one level after another would cost up to a block_timeout (1 s) per level.
    assert max(latencies) < 0.8, latencies


async def test_abandoned_high_message_is_recovered(make_queue: Callable[..., Queue]) -> None:
    """Reliable mode: a ``:high`` delivery held by a consumer that died is recovered by a live
    worker of the queue and runs again as attempt 2."""
    queue = make_queue(name="pq", mode="reliable", visibility_timeout=1.0)
    runs: list[tuple[str, int]] = []

    @queue.task(name="p.important", priority="high")
    async def important() -> str:
        ctx = current_task()
        assert ctx is not None
        runs.append((ctx.queue, ctx.attempt))
        return "done"

    handle = await important.enqueue()
    assert handle.queue == "pq:high"
    # A "worker" takes the message and dies without completing it.
    dead = ReliableRedisBroker(queue.url, queue.namespace)
    try:
        await dead.prepare_consumer(levels("pq"), "dead-consumer")
        taken = await dead.fetch_first(levels("pq"), 10, 0)
        assert [d.queue for d in taken] == ["pq:high"]
    finally:
        await dead.close()
    assert (await queue.stats(["pq:high"]))["queues"]["pq:high"]["in_flight"] == 1
    started = time.monotonic()
    async with running(make_worker(queue, concurrency=2)):
        assert await handle.result(timeout=10) == "done"
    print(f"abandoned :high message recovered and run in {time.monotonic() - started:.2f} s")
    assert runs == [("pq:high", 2)]
    record = await handle.status()
    assert record is not None
    assert record.attempts == 2
    assert record.queue == "pq:high"
    stats = await queue.stats(["pq:high"])
    assert stats["queues"]["pq:high"] == {"waiting": 0, "in_flight": 0}
    await queue.close()


async def test_recover_on_the_high_stream_directly(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="pq", mode="reliable", visibility_timeout=60.0)

    @queue.task(name="p.h", priority="high")
    async def h() -> None:
        return None

    await h.enqueue()
    dead = ReliableRedisBroker(queue.url, queue.namespace)
    live = ReliableRedisBroker(queue.url, queue.namespace)
    try:
        await dead.prepare_consumer(levels("pq"), "dead")
        assert len(await dead.fetch_first(levels("pq"), 10, 0)) == 1
        await live.prepare_consumer(levels("pq"), "live")
        await asyncio.sleep(0.05)
        assert await live.recover("pq:high", 0.01, 10, 5) == (1, 0)
        again = await live.fetch_first(levels("pq"), 10, 0)
        assert [(d.queue, d.deliveries) for d in again] == [("pq:high", 2)]
    finally:
        await dead.close()
        await live.close()
        await queue.close()
