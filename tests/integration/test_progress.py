"""Progress tracking against a real Redis, in both modes.

A task reports ``current_task().update_progress(current, total, message)`` from async and
thread code; ``get_progress`` reads the latest, ``watch_progress`` yields pushed updates and
ends with the task, a tight loop of updates is coalesced to about 20 writes per second, and
``blitzq task inspect`` shows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import (
    ConfigurationError,
    Progress,
    Queue,
    ResultTimeout,
    TaskFailed,
    current_task,
)
from blitzq.cli import cli

from .proc_tasks import eventually, make_worker, running, worker_thread


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode`` with a 600 s result TTL, closed after the test."""
    q = make_queue(name="pq", mode=mode, result_ttl=600)
    yield q
    await q.close()


def progress_is(current: float) -> Callable[[Progress | None], bool]:
    return lambda p: p is not None and p.current == current


async def test_progress_of_an_async_task_is_stored_with_the_record_ttl(
    queue: Queue, raw_redis: Any, namespace: str
) -> None:
    steps = [asyncio.Event() for _ in range(3)]

    @queue.task(name="p.steps")
    async def stepped() -> str:
        ctx = current_task()
        assert ctx is not None
        for n, step in enumerate(steps, 1):
            ctx.update_progress(n, 3, f"step {n}")
            await step.wait()
        return "done"

    handle = await stepped.enqueue()
    assert await queue.get_progress(handle.id) is None
    async with running(make_worker(queue)):
        for n, step in enumerate(steps, 1):
            p = await eventually(lambda: queue.get_progress(handle.id), progress_is(n))
            assert p is not None
            assert (p.total, p.message, p.fraction) == (3, f"step {n}", n / 3)
            assert abs(p.updated_at - time.time()) < 30
            step.set()
        assert await handle.result(timeout=10) == "done"
    final = await queue.get_progress(handle.id)
    assert final is not None
    assert final.current == 3
    ttl = await raw_redis.ttl("{" + namespace + "}:p:" + handle.id)
    assert 500 < ttl <= 600


async def test_progress_of_a_thread_task_goes_through_the_worker_loop(queue: Queue) -> None:
    go = threading.Event()

    @queue.task(name="p.thread")
    def crunch(n: int) -> int:
        ctx = current_task()
        assert ctx is not None
        ctx.update_progress(1, n, "first half")
        go.wait(10)
        ctx.update_progress(n, n, "all done")
        return n

    handle = await crunch.enqueue(8)
    async with running(make_worker(queue)):
        p = await eventually(lambda: queue.get_progress(handle.id), progress_is(1))
        assert p is not None
        assert (p.total, p.message) == (8, "first half")
        go.set()
        assert await handle.result(timeout=10) == 8
    p = await queue.get_progress(handle.id)
    assert p is not None
    assert (p.current, p.total, p.message) == (8, 8, "all done")


@pytest.mark.parametrize("executor", ["async", "thread"])
async def test_watch_progress_yields_pushed_updates_and_ends_with_the_task(
    queue: Queue, executor: str
) -> None:
    seen_upto = threading.Semaphore(0)

    if executor == "async":

        @queue.task(name="p.watched")
        async def watched() -> int:
            ctx = current_task()
            assert ctx is not None
            for n in range(1, 5):
                ctx.update_progress(n, 4)
                if n < 4:  # wait until the watcher saw it
                    while not seen_upto.acquire(blocking=False):
                        await asyncio.sleep(0.005)
            return 4

        task: Any = watched
    else:

        @queue.task(name="p.watched_thread")
        def watched_thread() -> int:
            ctx = current_task()
            assert ctx is not None
            for n in range(1, 5):
                ctx.update_progress(n, 4)
                if n < 4:
                    assert seen_upto.acquire(timeout=10)
            return 4

        task = watched_thread

    handle = await task.enqueue()
    seen: list[tuple[float, float]] = []

    async def watch() -> None:
        async for p in queue.watch_progress(handle.id, timeout=20):
            seen.append((p.current, time.monotonic()))
            seen_upto.release()

    async with running(make_worker(queue)):
        await asyncio.wait_for(watch(), 30)  # ends by itself when the task ends
        assert await handle.result(timeout=30) == 4
    assert [current for current, _ in seen] == [1, 2, 3, 4]
    # Pushed, not polled: three hand-offs (each update waits until the previous one was
    # seen) would take about a second each with the fallback re-read.
    elapsed = seen[-1][1] - seen[0][1]
    assert elapsed < 2.5, elapsed


async def test_watch_progress_ends_for_a_failed_task_and_times_out_otherwise(
    queue: Queue,
) -> None:
    @queue.task(name="p.fails", retries=0, dead_letter=False)
    async def fails() -> None:
        ctx = current_task()
        assert ctx is not None
        ctx.update_progress(5, None, "halfway, total unknown")
        raise ValueError("broke at 5")

    never = await fails.options(delay=60).enqueue()  # not due while the test runs
    with pytest.raises(ResultTimeout):
        async for _ in queue.watch_progress(never.id, timeout=0.3):
            pass
    handle = await fails.enqueue()
    async with running(make_worker(queue)):
        updates = [p async for p in queue.watch_progress(handle.id, timeout=10)]
        with pytest.raises(TaskFailed):
            await handle.result(timeout=5)
    assert [(p.current, p.total, p.fraction) for p in updates] == [(5, None, None)]


async def test_a_tight_loop_of_updates_is_coalesced_to_about_20_writes_a_second(
    queue: Queue, raw_redis: Any, namespace: str
) -> None:
    calls = [0]

    @queue.task(name="p.tight")
    def tight(seconds: float) -> int:
        ctx = current_task()
        assert ctx is not None
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            ctx.update_progress(n, None)
        ctx.update_progress(n, n, "finished")
        calls[0] = n + 1
        return n

    handle = await tight.options(task_id="tight-" + os.urandom(4).hex()).enqueue(0.6)
    pubsub = raw_redis.pubsub()
    await pubsub.subscribe("{" + namespace + "}:progress:" + handle.id)
    writes = 0
    async with running(make_worker(queue)):
        last = await handle.result(timeout=20)
        deadline = time.monotonic() + 2
        final_seen = False
        while time.monotonic() < deadline and not final_seen:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                writes += 1
                final_seen = b"finished" in message["data"]
    await pubsub.aclose()
    assert final_seen
    assert calls[0] > 1000  # the loop really was tight
    assert 2 <= writes <= 0.6 * 20 + 4
    p = await queue.get_progress(handle.id)
    assert p is not None
    assert (p.current, p.total, p.message) == (last, last, "finished")


async def test_bad_progress_values_fail_the_call_in_the_task(queue: Queue) -> None:
    @queue.task(name="p.bad", retries=0, dead_letter=False)
    async def bad() -> None:
        ctx = current_task()
        assert ctx is not None
        ctx.update_progress(float("nan"), 10)

    handle = await bad.enqueue()
    async with running(make_worker(queue)):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=10)
    assert failed.value.error_type == "blitzq.exceptions.ConfigurationError"
    assert issubclass(ConfigurationError, ValueError)


async def test_progress_on_a_memory_url() -> None:
    queue = Queue(redis_url="memory://progress-" + os.urandom(4).hex(), name="mem")
    gate = asyncio.Event()

    @queue.task(name="p.mem")
    async def mem() -> str:
        ctx = current_task()
        assert ctx is not None
        ctx.update_progress(1, 2, "one")
        await gate.wait()
        ctx.update_progress(2, 2, "two")
        return "ok"

    handle = await mem.enqueue()
    async with running(make_worker(queue)):
        seen: list[str | None] = []
        async for p in queue.watch_progress(handle.id, timeout=10):
            seen.append(p.message)
            gate.set()
        assert await handle.result(timeout=5) == "ok"
    assert seen == ["one", "two"]
    p = await queue.get_progress(handle.id)
    assert p is not None
    assert (p.current, p.total, p.message) == (2, 2, "two")


# ------------------------------------------------------------------------ CLI
def test_task_inspect_shows_progress(
    make_queue: Callable[..., Queue], mode: str, redis_url: str, namespace: str
) -> None:
    queue = make_queue(name="pq", mode=mode)
    release = threading.Event()

    @queue.task(name="p.cli")
    def cli_task() -> str:
        ctx = current_task()
        assert ctx is not None
        ctx.update_progress(2, 5, "halfway")
        release.wait(10)
        return "finished"

    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    runner = CliRunner()

    def inspect(*args: str) -> Any:
        result = runner.invoke(
            cli, ["--redis-url", redis_url, "--namespace", namespace, "task", "inspect", *args],
            env=env,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return result

    handle = cli_task.enqueue_sync()
    try:
        with worker_thread(queue):
            deadline = time.monotonic() + 10
            while queue.get_progress_sync(handle.id) is None:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            human = inspect(handle.id).stdout
            assert "progress" in human
            assert "2/5 (40%)" in human
            assert "halfway" in human
            doc = json.loads(inspect(handle.id, "--json").stdout)
            assert doc["progress"]["current"] == 2
            assert doc["progress"]["total"] == 5
            assert doc["progress"]["message"] == "halfway"
            release.set()
            assert handle.result_sync(timeout=10) == "finished"
        doc = json.loads(inspect(handle.id, "--json").stdout)
        assert doc["state"] == "succeeded"
        assert doc["progress"]["current"] == 2
    finally:
        release.set()
        queue.close_sync()
