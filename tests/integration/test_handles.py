"""Handles answer for the task they were made for (issue 7, section 6).

- A task enqueued again under an explicit ``task_id`` starts afresh: its handle returns the
  new outcome, never the old result, ``TaskFailed`` or ``TaskCancelled`` of an earlier task
  of that id; an old cancel mark never makes the new task silently skipped.
- A task that does not store its result (``store_result=False``) makes ``result()`` raise
  :class:`~blitzq.ResultNotStored` at once instead of waiting for a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from blitzq import (
    BlitzQError,
    Queue,
    ResultNotStored,
    TaskCancelled,
    TaskFailed,
    TaskState,
)

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast", "memory"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker of the Queue under test: Redis in either mode, or ``memory://`` (reliable)."""
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["no-state", "track-state"])
async def queue(
    make_queue: Callable[..., Queue], mode: str, namespace: str, request: pytest.FixtureRequest
) -> AsyncIterator[Queue]:
    """The Queue under test, with or without ``track_state``."""
    if mode == "memory":
        q = Queue(redis_url=f"memory://{namespace}", track_state=request.param)
    else:
        q = make_queue(mode=mode, track_state=request.param)
    yield q
    await q.close()


async def test_reenqueue_under_an_explicit_id_returns_the_new_result(queue: Queue) -> None:
    @queue.task(name="h.echo", retries=0)
    async def echo(value: int) -> int:
        if value < 0:
            raise ValueError(f"negative {value}")
        return value

    async with running(make_worker(queue, concurrency=2)):
        first = await echo.options(task_id="same").enqueue(1)
        assert await first.result(timeout=10) == 1
        second = await echo.options(task_id="same").enqueue(2)
        assert await second.result(timeout=10) == 2
        # An old failure is not the new outcome either, nor an old success a new failure's.
        failing = await echo.options(task_id="same").enqueue(-3)
        with pytest.raises(TaskFailed, match="negative -3"):
            await failing.result(timeout=10)
        again = await echo.options(task_id="same").enqueue(4)
        assert await again.result(timeout=10) == 4
        # enqueue_many with per-item ids starts afresh too.
        (many,) = await echo.enqueue_many([((5,), {}, {"task_id": "same"})])
        assert await many.result(timeout=10) == 5


async def test_a_cancelled_id_enqueued_again_runs(queue: Queue) -> None:
    runs: list[int] = []

    @queue.task(name="h.count")
    async def count(value: int) -> int:
        runs.append(value)
        return value

    # Cancelled while queued, before any worker runs: workers skip it (the mark).
    doomed = await count.options(task_id="again").enqueue(1)
    assert await doomed.cancel() in ("queued", "pending")
    with pytest.raises(TaskCancelled):
        await doomed.result(timeout=10)
    async with running(make_worker(queue, concurrency=2)) as worker:
        # The worker takes the cancelled message and skips it: its own cancelled record
        # (it names the worker) replaces the one cancel() wrote.
        await eventually(lambda: queue.inspect("again"), lambda r: r is not None and r.worker)
        # It knows the mark (read at start); the same id enqueued again must run all the same.
        assert "again" in worker.runner.revoked
        fresh = await count.options(task_id="again").enqueue(2)
        assert await fresh.result(timeout=10) == 2
    assert runs == [2]
    record = await queue.inspect("again")
    assert record is not None
    assert record.state is TaskState.SUCCEEDED


async def test_a_cancelled_delayed_id_enqueued_again_returns_the_new_result(queue: Queue) -> None:
    @queue.task(name="h.later")
    async def later(value: int) -> int:
        return value

    old = await later.options(task_id="later", delay=30).enqueue(1)
    assert await old.cancel() == "scheduled"
    with pytest.raises(TaskCancelled):
        await old.result(timeout=1)
    async with running(make_worker(queue, concurrency=2)):
        new = await later.options(task_id="later").enqueue(2)
        assert await new.result(timeout=10) == 2


async def test_store_result_false_raises_result_not_stored_at_once(queue: Queue) -> None:
    done = asyncio.Event()

    @queue.task(name="h.quiet", store_result=False, retries=0)
    async def quiet(fail: bool) -> int:
        done.set()
        if fail:
            raise RuntimeError("quiet failure")
        return 42

    # Before any worker runs it, and without a timeout: no wait at all.
    handle = await quiet.enqueue(False)
    with pytest.raises(ResultNotStored) as caught:
        await asyncio.wait_for(handle.result(), 5)
    assert isinstance(caught.value, BlitzQError)
    assert caught.value.task_id == handle.id
    assert "does not store its result" in str(caught.value)
    assert handle.stores_result is False
    async with running(make_worker(queue, concurrency=2)):
        await asyncio.wait_for(done.wait(), 10)
        with pytest.raises(ResultNotStored):
            await asyncio.wait_for(handle.result(timeout=30), 5)
        with pytest.raises(ResultNotStored):
            await asyncio.wait_for(queue.get_results([handle], timeout=30), 5)
        # A recorded failure is still reported as one.
        failing = await quiet.enqueue(True)
        await eventually(
            lambda: queue.inspect(failing.id), lambda r: r is not None and r.state.is_final
        )
        with pytest.raises(TaskFailed, match="quiet failure"):
            await asyncio.wait_for(failing.result(), 5)

    # The Queue-wide default does the same.
    @queue.task(name="h.default")
    async def default() -> int:
        return 1

    queue.store_results = False
    try:
        with pytest.raises(ResultNotStored):
            await asyncio.wait_for((await default.enqueue()).result(), 5)
        with pytest.raises(ResultNotStored):
            await asyncio.wait_for((await queue.send("h.default")).result(), 5)
    finally:
        queue.store_results = True


async def test_waits_by_id_learn_from_the_record(queue: Queue) -> None:
    """``queue.get_result(id)`` has no handle: with ``track_state`` the succeeded record
    says no value was stored and it raises ResultNotStored as soon as the task ends (a
    ``None`` result is not made up); without it nothing is written and it times out."""

    @queue.task(name="h.silent", store_result=False)
    async def silent() -> int:
        return 7

    handle = await silent.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        if queue.track_state:
            with pytest.raises(ResultNotStored):
                await asyncio.wait_for(queue.get_result(handle.id, timeout=30), 10)
            record = await queue.inspect(handle.id)
            assert record is not None
            assert record.state is TaskState.SUCCEEDED
            assert record.result_stored is False
        else:
            with pytest.raises(BlitzQError):  # ResultTimeout: nothing is ever written
                await queue.get_result(handle.id, timeout=0.5)
