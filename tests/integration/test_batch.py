"""Batch API against a real Redis, in both modes.

``get_results`` returns results in order (raising the first failure, or returning exceptions
in place), ``run`` enqueues and waits, and ``enqueue_many`` takes per-item options while
publishing each queue's messages in one round-trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from blitzq import ConfigurationError, MessageTooLarge, Queue, ResultTimeout, TaskFailed

from .proc_tasks import make_worker, running, worker_thread


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode`` with three tasks: ``b.add``, ``b.fail`` and ``b.slow``."""
    q = make_queue(name="bq", mode=mode)

    @q.task(name="b.add")
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @q.task(name="b.fail", retries=0, dead_letter=False)
    async def fail(message: str) -> None:
        raise ValueError(message)

    @q.task(name="b.slow")
    async def slow(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    yield q
    await q.close()


async def test_get_results_returns_results_in_the_order_given(queue: Queue) -> None:
    add, slow = queue.tasks["b.add"], queue.tasks["b.slow"]
    handles = [await slow.enqueue(0.3), *[await add.enqueue(n, n) for n in range(5)]]
    async with running(make_worker(queue)):
        started = time.monotonic()
        results = await queue.get_results(handles, timeout=10)
        assert results == [0.3, 0, 2, 4, 6, 8]
        assert time.monotonic() - started < 5  # waited concurrently
        assert await queue.get_results([h.id for h in reversed(handles)], timeout=5) == [
            8,
            6,
            4,
            2,
            0,
            0.3,
        ]
    assert await queue.get_results([]) == []


async def test_get_results_raises_the_first_failure_or_returns_exceptions(queue: Queue) -> None:
    add, fail, slow = queue.tasks["b.add"], queue.tasks["b.fail"], queue.tasks["b.slow"]
    ok = await add.enqueue(1, 2)
    bad = await fail.enqueue("nope")
    pending = await slow.options(delay=60).enqueue(0)  # not due during the test
    async with running(make_worker(queue)):
        with pytest.raises(TaskFailed, match="nope") as failed:
            await queue.get_results([ok, pending, bad], timeout=10)
        # It did not wait for the pending one: that wait would end in ResultTimeout instead.
        assert failed.value.task_id == bad.id
        results = await queue.get_results([ok, bad, pending], timeout=0.5, return_exceptions=True)
    assert results[0] == 3
    assert isinstance(results[1], TaskFailed)
    assert results[1].error == "nope"
    assert isinstance(results[2], ResultTimeout)
    assert pending.id in str(results[2])
    with pytest.raises(ResultTimeout):
        await queue.get_results([pending], timeout=0.2)


async def test_run_enqueues_and_waits(queue: Queue) -> None:
    add, fail, slow = queue.tasks["b.add"], queue.tasks["b.fail"], queue.tasks["b.slow"]
    with pytest.raises(ResultTimeout):  # no worker yet
        await queue.run(add, 1, timeout=0.2)
    async with running(make_worker(queue, shutdown_timeout=0.2)):
        assert await queue.run(add, 40, b=2) == 42
        assert await queue.run(add.options(priority="high"), 1, 1, timeout=10) == 2
        with pytest.raises(TaskFailed, match="run failed"):
            await queue.run(fail, "run failed", timeout=10)
        with pytest.raises(ResultTimeout):
            await queue.run(slow, 5, timeout=0.2)


async def test_enqueue_many_takes_per_item_options(queue: Queue, mode: str) -> None:
    add = queue.tasks["b.add"]
    published: list[tuple[str, int]] = []
    broker = queue.broker
    publish = broker.publish

    async def counting_publish(name: str, messages: Sequence[bytes]) -> None:
        published.append((name, len(messages)))
        await publish(name, messages)

    broker.publish = counting_publish  # type: ignore[method-assign]
    try:
        handles = await add.enqueue_many(
            [
                (1,),
                ((2,), {"b": 1}),
                ((3,), {}, {"task_id": "fixed-id-3"}),
                ((4,), {"b": 1}, {"priority": "high"}),
                ((5,), {}, {"delay": 0.4}),
                ((6,), {}, {"headers": {"k": "v"}, "priority": "low"}),
                ((7,), {}, {}),
            ]
        )
    finally:
        del broker.publish
    # One round-trip per physical queue; the delayed item goes to the schedule.
    assert sorted(published) == [("bq", 4), ("bq:high", 1), ("bq:low", 1)]
    assert await queue.broker.scheduled_count() == 1
    assert handles[2].id == "fixed-id-3"
    assert [h.queue for h in handles] == ["bq", "bq", "bq", "bq:high", "bq", "bq:low", "bq"]
    async with running(make_worker(queue)):
        results = await queue.get_results(handles, timeout=10)
    assert results == [1, 3, 3, 5, 5, 6, 7]
    records = await queue.get_results([h.id for h in handles], timeout=1)
    assert records == results


async def test_enqueue_many_refuses_bad_per_item_options_before_publishing(queue: Queue) -> None:
    add = queue.tasks["b.add"]
    # Each error names the item (tester finding: these three named none).
    with pytest.raises(ConfigurationError, match=r"^enqueue_many item 1: .*no_such_option"):
        await add.enqueue_many([(1,), ((2,), {}, {"no_such_option": 1})])
    with pytest.raises(ConfigurationError, match=r"^enqueue_many item 0: .*priority"):
        await add.enqueue_many([((2,), {}, {"priority": "urgent"})])
    with pytest.raises(ConfigurationError, match=r"^enqueue_many items 0 and 2: the same task_id"):
        await add.enqueue_many(
            [((1,), {}, {"task_id": "dup"}), (3,), ((2,), {}, {"task_id": "dup"})]
        )
    with pytest.raises(MessageTooLarge, match=r"^enqueue_many item 1: message of") as big:
        await add.enqueue_many([(1,), ("x" * (queue.max_message_size + 1),)])
    assert big.value.limit == queue.max_message_size
    for items, match in (
        ([("b.add", (1,), None), ("b.add", (2,), None, {"nope": 1})], r"^send_many item 1: "),
        (
            [("b.add", (1,), None, {"task_id": "d"}), ("b.add", (2,), None, {"task_id": "d"})],
            r"^send_many items 0 and 1: the same task_id",
        ),
        ([("b.add", ("x" * (queue.max_message_size + 1),), None)], r"^send_many item 0: message"),
    ):
        with pytest.raises((ConfigurationError, MessageTooLarge), match=match):
            await queue.send_many(items)
    stats = await queue.stats(["bq", "bq:high"])
    assert stats["queues"]["bq"]["waiting"] == 0
    assert stats["scheduled"] == 0


# ------------------------------------------------------------------- sync twins
def test_sync_twins(make_queue: Callable[..., Queue], mode: str) -> None:
    queue = make_queue(name="bs", mode=mode)

    @queue.task(name="bs.mul")
    def mul(a: int, b: int) -> int:
        return a * b

    try:
        handles = mul.enqueue_many_sync([(2, 3), ((4, 5), {}, {"priority": "high"})])
        with worker_thread(queue):
            assert queue.get_results_sync(handles, timeout=10) == [6, 20]
            assert queue.run_sync(mul, 6, 7, timeout=10) == 42
    finally:
        queue.close_sync()
