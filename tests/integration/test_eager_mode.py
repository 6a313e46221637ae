"""The eager test mode and the worker harness (issue 12, testing helpers), in-process.

The user's view -- a pytest file run under the installed plugin -- is
``test_pytest_plugin.py``; here the same machinery is checked case by case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from blitzq import Queue, RetryPolicy, SerializationError, TaskState
from blitzq.testing import WorkerHarness, eager


async def test_enqueue_returns_after_the_task_ran() -> None:
    queue = Queue(namespace="eager-a")  # no URL: must not start the embedded server
    seen: list[int] = []

    @queue.task(name="e.add")
    async def add(a: int, b: int) -> int:
        seen.append(a + b)
        return a + b

    @queue.task(name="e.fan")
    async def fan(n: int) -> int:
        for i in range(n):  # enqueued while the drain runs: the same drain runs them
            await add.enqueue(i, 0)
        return n

    with eager() as mode:
        handle = await add.enqueue(2, 3)
        assert seen == [5]  # ran before enqueue returned
        assert await handle.result(timeout=5) == 5
        assert await (await fan.enqueue(3)).result(timeout=5) == 3
        assert sorted(seen) == [0, 1, 2, 5]
        assert queue.url.startswith("memory://eager-")
        assert mode.names
    await queue.close()


async def test_arguments_are_serialized_as_in_production() -> None:
    queue = Queue(namespace="eager-b")

    @queue.task(name="e.echo")
    async def echo(value: object) -> object:
        return value

    with eager():
        with pytest.raises(SerializationError, match="not plain data"):
            await echo.enqueue(object())
        # A tuple comes back a list, as it does through Redis.
        assert await (await echo.enqueue((1, 2))).result(timeout=5) == [1, 2]
    await queue.close()


async def test_retries_within_the_horizon_run_and_delays_beyond_it_wait() -> None:
    queue = Queue(namespace="eager-c")
    calls = {"n": 0}

    @queue.task(name="e.flaky", retries=2, retry_policy=RetryPolicy(base=0.05, jitter="none"))
    async def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise RuntimeError("not yet")
        return "ok"

    @queue.task(name="e.later")
    async def later() -> None:
        return None

    with eager():
        handle = await flaky.enqueue()
        assert await handle.result(timeout=5) == "ok"
        assert calls["n"] == 3
        delayed = await later.options(delay=3600).enqueue()
        record = await queue.inspect(delayed.id)
        assert record is not None
        assert record.state is TaskState.SCHEDULED
    await queue.close()


def test_sync_api_and_workflows_in_eager_mode() -> None:
    queue = Queue(namespace="eager-d")

    @queue.task(name="e.double")
    def double(x: int) -> int:
        return 2 * x

    with eager():
        assert double.enqueue_sync(21).result_sync(timeout=5) == 42
        flow = queue.apply_sync(double.s(1) | double.s() | double.s())
        assert flow.get_sync(timeout=5) == 8
    queue.close_sync()


async def test_the_mode_switches_back(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()  # the test server
    url = queue.url
    with eager():
        assert queue.url.startswith("memory://")
    assert queue.url == url
    await queue.close()


async def test_worker_harness_drains_on_the_queues_own_backend(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    done: list[int] = []

    @queue.task(name="h.work")
    async def work(i: int) -> None:
        await asyncio.sleep(0)
        done.append(i)

    async with WorkerHarness(queue, concurrency=4) as w:
        await work.enqueue_many([(i,) for i in range(20)])
        await w.drain(timeout=30)
        assert sorted(done) == list(range(20))
    with pytest.raises(RuntimeError, match="inside"):
        await w.drain()
    await queue.close()
