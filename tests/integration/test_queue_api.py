"""The producer-side Queue API against a real Redis, in both modes.

Sending by name, ``enqueue_many``, dead-letter replay, ``stats``, and the sync API (from plain
threads, inside a running loop, and after ``fork()``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, TaskFailed, TaskState

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queues under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode`` on the test namespace, closed after the test."""
    q = make_queue(mode=mode)
    yield q
    await q.close()


# ---------------------------------------------------------------------------------- send
async def test_send_by_name_from_a_producer_without_the_code(
    queue: Queue, make_queue: Callable[..., Queue], mode: str
) -> None:
    @queue.task(name="api.add")
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @queue.task(name="api.elsewhere", queue="other")
    async def elsewhere() -> str:
        return "other queue"

    producer = make_queue(mode=mode)  # knows no tasks at all
    try:
        async with running(make_worker(queue, concurrency=4)):
            h1 = await producer.send("api.add", args=(2, 3))
            h2 = await producer.send("api.add", args=[1], kwargs={"b": 10})
            h3 = await producer.send("api.add", (4,), delay=0.2)
            # A Queue that knows the task sends it to the task's own queue.
            h4 = await queue.send("api.elsewhere")
            assert h4.queue == "other"
            assert await h1.result(timeout=10) == 5
            assert await h2.result(timeout=10) == 11
            assert await h3.result(timeout=10) == 4
            assert await h4.result(timeout=10) == "other queue"
        assert h1.task == "api.add"
        assert h1.queue == queue.name
        with pytest.raises(ConfigurationError):
            await producer.send("api.add", args=(1,), not_an_option=True)
    finally:
        await producer.close()


# --------------------------------------------------------------------------- enqueue_many
async def test_enqueue_many_publishes_in_one_call(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    @queue.task(name="api.combine")
    async def combine(a: int, b: int = 0) -> int:
        return a * 10 + b

    broker = queue.broker
    calls: list[tuple[str, int]] = []
    real_publish = broker.publish

    async def counting_publish(q: str, messages: Sequence[bytes]) -> None:
        calls.append((q, len(messages)))
        await real_publish(q, messages)

    monkeypatch.setattr(broker, "publish", counting_publish)
    handles = await combine.enqueue_many(
        [(1,), (2, 3), ((4,), {"b": 5}), ((), {"a": 6, "b": 7})] + [(i,) for i in range(6)]
    )
    assert calls == [(queue.name, 10)]
    assert len({h.id for h in handles}) == 10
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 10
    async with running(make_worker(queue, concurrency=4)):
        results = [await h.result(timeout=10) for h in handles]
    assert results == [10, 23, 45, 67, 0, 10, 20, 30, 40, 50]
    assert await combine.enqueue_many([]) == []
    with pytest.raises(ConfigurationError):
        await combine.enqueue_many([[1, 2]])  # type: ignore[list-item]


async def test_enqueue_many_with_delay_goes_to_the_schedule(queue: Queue) -> None:
    @queue.task(name="api.later")
    async def later(i: int) -> float:
        return time.time()

    t0 = time.time()
    handles = await later.options(delay=0.4).enqueue_many([(i,) for i in range(3)])
    stats = await queue.stats([queue.name])
    assert stats["scheduled"] == 3
    assert stats["queues"][queue.name]["waiting"] == 0
    async with running(make_worker(queue, concurrency=4)):
        started = [await h.result(timeout=10) for h in handles]
    assert all(s >= t0 + 0.4 - 0.001 for s in started)


# ---------------------------------------------------------------------- dead-letter replay
async def test_dead_letter_replay_runs_the_task_again(queue: Queue) -> None:
    broken = threading.Event()
    broken.set()
    runs: list[int] = []

    @queue.task(name="api.fragile", retries=0)
    async def fragile(x: int) -> int:
        runs.append(x)
        if broken.is_set():
            raise RuntimeError("dependency down")
        return x * 2

    async with running(make_worker(queue, concurrency=2)):
        h = await fragile.enqueue(21)
        with pytest.raises(TaskFailed):
            await h.result(timeout=10)
        assert await queue.dead_letter_count() == 1
        broken.clear()
        replayed = await queue.retry(h.id)
        assert replayed is not None
        assert replayed.id == h.id
        assert replayed.task == "api.fragile"
        assert await replayed.result(timeout=10) == 42
        # The dead letter is consumed: a second replay does nothing.
        assert await queue.retry(h.id) is None
        assert await queue.retry("no-such-id") is None
    assert runs == [21, 21]
    assert await queue.dead_letter_count() == 0
    record = await h.status()
    assert record is not None
    assert record.state is TaskState.SUCCEEDED
    assert record.attempts == 1


async def test_concurrent_replays_run_the_task_once(queue: Queue) -> None:
    runs: list[int] = []
    fail = threading.Event()
    fail.set()

    @queue.task(name="api.once", retries=0)
    async def once() -> int:
        runs.append(1)
        if fail.is_set():
            raise RuntimeError("first")
        return len(runs)

    async with running(make_worker(queue, concurrency=2)):
        h = await once.enqueue()
        with pytest.raises(TaskFailed):
            await h.result(timeout=10)
        fail.clear()
        replays = await asyncio.gather(*(queue.retry(h.id) for _ in range(5)))
        assert sum(r is not None for r in replays) == 1
        assert await h.result(timeout=10) == 2
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 0
    assert runs == [1, 1]


async def test_purge_dead_letters(queue: Queue) -> None:
    @queue.task(name="api.bad", retries=0)
    async def bad(i: int) -> None:
        raise ValueError(i)

    async with running(make_worker(queue, concurrency=2)):
        handles = await bad.enqueue_many([(i,) for i in range(3)])
        for h in handles:
            with pytest.raises(TaskFailed):
                await h.result(timeout=10)
    listed = await queue.dead_letters()
    assert sorted(d.args or [] for d in listed) == [[0], [1], [2]]
    assert [d.failed_at for d in listed] == sorted((d.failed_at for d in listed), reverse=True)
    assert await queue.purge_dead_letters() == 3
    assert await queue.dead_letters() == []


# -------------------------------------------------------------------------------- stats
async def test_stats(queue: Queue) -> None:
    @queue.task(name="api.noop")
    async def noop() -> None:
        return None

    @queue.task(name="api.fails", retries=0)
    async def fails() -> None:
        raise ValueError("x")

    empty = await queue.stats()
    assert empty == {
        "queues": {},
        "scheduled": 0,
        "dead_letters": 0,
        "workers": 0,
        "stale_completions": 0,
    }
    await noop.enqueue_many([(), (), ()])
    await noop.options(delay=60).enqueue()
    stats = await queue.stats()
    assert stats["queues"] == {queue.name: {"waiting": 3, "in_flight": 0}}
    assert stats["scheduled"] == 1
    assert stats["workers"] == 0
    async with running(make_worker(queue, concurrency=2, name="stats-worker")):
        h = await fails.enqueue()
        with pytest.raises(TaskFailed):
            await h.result(timeout=10)
        live = await eventually(
            queue.stats,
            lambda s: s["workers"] == 1 and s["queues"][queue.name]["waiting"] == 0,
        )
        assert live["dead_letters"] == 1
        assert live["scheduled"] == 1
        assert live["stale_completions"] == 0
    after = await queue.stats()
    assert after["workers"] == 0  # unregistered at shutdown
    assert after["queues"][queue.name] == {"waiting": 0, "in_flight": 0}


# ------------------------------------------------------------------------------ sync API
async def test_sync_api_from_several_plain_threads(queue: Queue) -> None:
    @queue.task(name="api.double")
    def double(x: int) -> int:
        return 2 * x

    def client(i: int) -> tuple[int, str]:
        handle = double.enqueue_sync(i)
        value = handle.result_sync(timeout=15)
        record = handle.status_sync()
        assert record is not None
        return value, record.state.value

    try:
        async with running(make_worker(queue, concurrency=4)):
            results = await asyncio.wait_for(
                asyncio.gather(*(asyncio.to_thread(client, i) for i in range(8))), 30
            )
            batch = await asyncio.to_thread(double.enqueue_many_sync, [(100,), (200,)])
            values = await asyncio.to_thread(lambda: [h.result_sync(timeout=15) for h in batch])
            by_name = await asyncio.to_thread(queue.send_sync, "api.double", (7,))
            assert await by_name.result(timeout=10) == 14
            stats = await asyncio.to_thread(queue.stats_sync, [queue.name])
        assert results == [(2 * i, "succeeded") for i in range(8)]
        assert values == [200, 400]
        assert stats["queues"][queue.name]["waiting"] == 0
    finally:
        await asyncio.to_thread(queue.close_sync)


async def test_sync_api_inside_a_running_loop_raises(queue: Queue) -> None:
    @queue.task(name="api.never")
    async def never() -> None:
        return None

    with pytest.raises(RuntimeError, match="running event loop"):
        never.enqueue_sync()
    with pytest.raises(RuntimeError):
        never.enqueue_many_sync([()])
    with pytest.raises(RuntimeError):
        queue.send_sync("api.never")
    with pytest.raises(RuntimeError):
        queue.stats_sync()
    handle = await never.enqueue()
    with pytest.raises(RuntimeError):
        handle.result_sync(timeout=1)
    with pytest.raises(RuntimeError):
        handle.status_sync()
    # Only the async enqueue published anything.
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 1


def _child_uses_sync_api(queue: Queue, task: Any) -> int:
    """Body of the forked child: exit status 0 when the sync API worked."""
    try:
        handle = task.enqueue_sync(20, 22)
        value = handle.result_sync(timeout=20)
        stats = queue.stats_sync([queue.name])
        return 0 if value == 42 and isinstance(stats["queues"], dict) else 3
    except BaseException:
        import traceback

        traceback.print_exc()
        return 4


async def test_sync_api_works_after_fork(queue: Queue) -> None:
    @queue.task(name="api.forked_add")
    async def forked_add(a: int, b: int) -> int:
        return a + b

    async with running(make_worker(queue, concurrency=2)):
        # The parent uses the sync API first, so its background loop exists before fork().
        handle = await asyncio.to_thread(forked_add.enqueue_sync, 1, 2)
        assert await asyncio.to_thread(handle.result_sync, 10) == 3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            status = 5
            try:
                status = _child_uses_sync_api(queue, forked_add)
            finally:
                os._exit(status)
        deadline = time.monotonic() + 40
        status: int | None = None
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - non-blocking poll
            if done:
                status = os.waitstatus_to_exitcode(raw)
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # noqa: ASYNC222 - reaps a killed child at once
                pytest.fail("forked child did not finish within 40 s")
            else:
                await asyncio.sleep(0.05)
    assert status == 0
    await asyncio.to_thread(queue.close_sync)


async def test_startup_and_shutdown_hooks_run_around_the_worker(
    make_queue: Callable[..., Queue],
) -> None:
    """Hooks registered with the decorator form run once at start and once after stop."""
    queue = make_queue()
    calls: list[str] = []

    @queue.on_startup
    async def opened() -> None:
        calls.append("start")

    @queue.on_shutdown
    async def closed() -> None:
        calls.append("stop")

    from blitzq import Worker

    worker = Worker(queue, block_timeout=0.2)
    task = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + 10
    while calls != ["start"]:
        assert asyncio.get_running_loop().time() < deadline, calls
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, timeout=10)
    assert calls == ["start", "stop"]
    await queue.close()
