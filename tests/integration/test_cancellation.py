"""Cancellation against a real Redis, in both modes.

``cancel()`` answers what the task was: a scheduled task is taken off the schedule, a queued
one is skipped by every worker, a running one is stopped by its worker (async tasks at once,
thread tasks through ``current_task().cancelled``, process tasks terminated), and a finished
one is left alone. The record becomes ``cancelled`` and ``result()`` raises TaskCancelled.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import Queue, TaskCancelled, TaskFailed, TaskState, current_task
from blitzq.cli import cli

from ..procfs import pid_gone
from . import proc_tasks
from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``cq`` in ``mode``, closed after the test."""
    q = make_queue(name="cq", mode=mode)
    yield q
    await q.close()


async def final_state(queue: Queue, task_id: str, timeout: float = 30.0) -> TaskState:
    """Wait until the task has a final record; return its state."""
    record = await eventually(
        lambda: queue.inspect(task_id), lambda r: r is not None and r.state.is_final, timeout
    )
    assert record is not None
    return record.state


async def test_cancel_a_delayed_task_before_it_is_due(queue: Queue) -> None:
    ran: list[str] = []

    @queue.task(name="c.later")
    async def later(label: str) -> None:
        ran.append(label)

    handle = await later.options(delay=0.5).enqueue("cancelled")
    kept = await later.options(delay=0.5).enqueue("kept")
    async with running(make_worker(queue)):
        assert await handle.cancel() == "scheduled"
        assert await queue.broker.scheduled_count() == 1
        await kept.result(timeout=5)  # past the due time of both
        with pytest.raises(TaskCancelled) as info:
            await handle.result(timeout=1)
        assert isinstance(info.value, TaskFailed)
    assert ran == ["kept"]
    record = await handle.status()
    assert record is not None
    assert record.state is TaskState.CANCELLED
    assert await handle.cancel() == "finished"


@pytest.mark.parametrize("track_state", [False, True])
async def test_cancel_a_queued_task_before_any_worker_runs(
    make_queue: Callable[..., Queue], mode: str, track_state: bool
) -> None:
    queue = make_queue(name="cq", mode=mode, track_state=track_state)
    ran: list[str] = []

    @queue.task(name="c.job")
    async def job(label: str) -> None:
        ran.append(label)

    doomed = await job.enqueue("doomed")
    after = await job.enqueue("after")
    assert await doomed.cancel() == ("queued" if track_state else "pending")
    async with running(make_worker(queue)):
        await after.result(timeout=5)  # the worker got past the cancelled message
        with pytest.raises(TaskCancelled):
            await doomed.result(timeout=2)
    assert ran == ["after"]
    assert await final_state(queue, doomed.id) is TaskState.CANCELLED
    stats = await queue.stats(["cq"])
    assert stats["queues"]["cq"] == {"waiting": 0, "in_flight": 0}
    await queue.close()


@pytest.mark.parametrize("track_state", [False, True])
async def test_cancel_a_running_async_task_stops_it_at_once(
    make_queue: Callable[..., Queue], mode: str, track_state: bool
) -> None:
    queue = make_queue(name="cq", mode=mode, track_state=track_state)
    events: dict[str, float] = {}

    @queue.task(name="c.sleepy")
    async def sleepy() -> None:
        events["started"] = time.time()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events["cancelled"] = time.time()
            raise

    @queue.task(name="c.other")
    async def other(x: int) -> int:
        return x * 2

    async with running(make_worker(queue, concurrency=2)):
        handle = await sleepy.enqueue()
        await eventually(lambda: asyncio.sleep(0, events), lambda e: "started" in e, 30.0)
        if track_state:
            await eventually(
                handle.status, lambda r: r is not None and r.state is TaskState.RUNNING, 30.0
            )
        sent = time.time()
        assert await handle.cancel() == ("running" if track_state else "pending")
        await eventually(lambda: asyncio.sleep(0, events), lambda e: "cancelled" in e, 30.0)
        delay = events["cancelled"] - sent
        print(f"running async task cancelled {delay * 1000:.1f} ms after cancel()")
        assert delay < 5.0, delay  # generous: the task would sleep far longer
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=5)
        # The worker goes on with other work, the slot of the cancelled task is free.
        results = [await h.result(timeout=5) for h in await other.enqueue_many([(1,), (2,)])]
        assert results == [2, 4]
    record = await handle.status()
    assert record is not None
    assert record.state is TaskState.CANCELLED
    assert record.error_type == "TaskCancelled"
    await queue.close()


async def test_an_async_task_that_asks_for_its_context_after_the_cancel_sees_it(
    queue: Queue,
) -> None:
    # An async run's TaskContext is made when first asked for: one that never asked
    # before its cancel still finds ``cancelled`` set, on the one object of its run.
    seen: dict[str, Any] = {}

    @queue.task(name="c.late")
    async def late() -> None:
        seen["started"] = True
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ctx = current_task()
            seen["cancelled"] = ctx is not None and ctx.cancelled
            seen["same"] = ctx is current_task()
            seen["id"] = ctx.id if ctx is not None else None
            raise

    async with running(make_worker(queue)):
        handle = await late.enqueue()
        await eventually(lambda: asyncio.sleep(0, seen), lambda e: "started" in e, 30.0)
        await handle.cancel()
        await eventually(lambda: asyncio.sleep(0, seen), lambda e: "cancelled" in e, 30.0)
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=5)
    assert seen == {"started": True, "cancelled": True, "same": True, "id": handle.id}


async def test_cancel_a_running_thread_task_sets_cancelled(queue: Queue) -> None:
    seen: dict[str, Any] = {}
    started = threading.Event()

    @queue.task(name="c.loop")
    def loop_until_cancelled() -> str:
        ctx = current_task()
        assert ctx is not None
        seen["before"] = ctx.cancelled
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["after"] = ctx.cancelled
        seen["stopped"] = time.time()
        return "stopped"

    async with running(make_worker(queue, concurrency=2)):
        handle = await loop_until_cancelled.enqueue()
        await asyncio.to_thread(started.wait, 5)
        sent = time.time()
        await handle.cancel()
        await eventually(lambda: asyncio.sleep(0, seen), lambda s: "stopped" in s, 30.0)
        print(f"thread task saw cancelled {(seen['stopped'] - sent) * 1000:.1f} ms after cancel()")
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=5)
    assert seen["before"] is False
    assert seen["after"] is True
    assert seen["stopped"] - sent < 5.0  # generous: the loop itself gives up after 20 s


async def test_cancel_a_running_process_task_terminates_it(queue: Queue, tmp_path: Path) -> None:
    sleeper = queue.task(name="c.proc", executor="process")(proc_tasks.sleep_with_pid_file)
    square = queue.task(name="c.square", executor="process")(proc_tasks.square)
    pid_file = tmp_path / "pid"
    async with running(make_worker(queue, concurrency=2, process_pool_size=1)):
        handle = await sleeper.enqueue(str(pid_file), 30.0)
        await eventually(lambda: asyncio.sleep(0, pid_file.exists()), bool, 30.0)
        pid = int(pid_file.read_text())
        assert await handle.cancel() == "pending"
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=5)

        await eventually(lambda: asyncio.sleep(0, pid_gone(pid)), bool, 30.0)
        # The worker starts a fresh pool for the next process task.
        assert await (await square.enqueue(7)).result(timeout=30) == 49
    assert pid != os.getpid()


async def test_cancel_a_finished_task_changes_nothing(queue: Queue) -> None:
    @queue.task(name="c.done")
    async def done() -> int:
        return 42

    async with running(make_worker(queue)):
        handle = await done.enqueue()
        assert await handle.result(timeout=5) == 42
    before = await handle.status()
    assert await handle.cancel() == "finished"
    assert await queue.cancel(handle.id) == "finished"
    after = await handle.status()
    assert before == after
    assert after is not None
    assert after.state is TaskState.SUCCEEDED
    assert await handle.result(timeout=1) == 42
    assert await queue.broker.revoked() == {}


def test_cancel_sync_twin(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="cq")

    @queue.task(name="c.sync")
    def job() -> None:
        return None

    try:
        handle = job.options(delay=60).enqueue_sync()
        assert handle.cancel_sync() == "scheduled"
        assert queue.cancel_sync(handle.id) == "finished"
        with pytest.raises(TaskCancelled):
            handle.result_sync(timeout=1)
    finally:
        queue.close_sync()


def test_cli_task_cancel(make_queue: Callable[..., Queue], redis_url: str, namespace: str) -> None:
    queue = make_queue(name="cq")

    @queue.task(name="c.cli")
    def job() -> None:
        return None

    runner = CliRunner()
    env: dict[str, str | None] = {
        "BLITZQ_REDIS_URL": None,
        "BLITZQ_NAMESPACE": None,
        "BLITZQ_MODE": None,
    }

    def invoke(*args: str) -> Any:
        return runner.invoke(
            cli, ["--redis-url", redis_url, "--namespace", namespace, *args], env=env,
            catch_exceptions=False,
        )  # fmt: skip

    try:
        later = job.options(delay=60).enqueue_sync()
        queued = job.enqueue_sync()
        result = invoke("task", "cancel", later.id, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"id": later.id, "was": "scheduled", "cancelled": True}
        human = invoke("task", "cancel", queued.id)
        assert human.exit_code == 0, human.output
        # No record of it (no state tracking): the answer says what that can mean.
        assert f"task {queued.id} has no record: queued without state tracking" in human.output
        again = invoke("--json", "task", "cancel", later.id)
        assert json.loads(again.stdout)["was"] == "finished"
        assert json.loads(again.stdout)["cancelled"] is False
        assert "already finished" in invoke("task", "cancel", later.id).output
        inspected = invoke("task", "inspect", later.id, "--json")
        assert json.loads(inspected.stdout)["state"] == "cancelled"
        assert queue.inspect_sync(queued.id).state is TaskState.CANCELLED  # type: ignore[union-attr]
    finally:
        queue.close_sync()
