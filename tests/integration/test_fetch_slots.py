"""A worker never holds a message it cannot start (issue 7, section 1).

A fetch loop blocks on an empty queue holding only that queue's own slot; a message that
arrives while the worker's global slots are all taken, or a second (third) message returned by
one blocking read over several priority levels (Redis >= 7.2 and Valkey return one entry per
stream that got data), is handed back to its queue at once instead of waiting, unleased, for a
slot. Deliveries that wait for start checks or before-execute hooks keep their lease renewed.
Graceful shutdown is bounded by ``shutdown_timeout`` whatever is held.

Every test runs on the session's Redis and on the embedded Valkey (``both_servers``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from blitzq import Queue, TaskContext, Worker
from blitzq.middleware import Middleware
from blitzq.routing import levels

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.both_servers


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


async def _counts(queue: Queue, name: str) -> tuple[int, int]:
    """(waiting, in flight) messages of physical queue ``name``."""
    stats = (await queue.stats([name]))["queues"][name]
    return stats["waiting"], stats["in_flight"]


async def _drained(queue: Queue, names: list[str]) -> bool:
    for name in names:
        if await _counts(queue, name) != (0, 0):
            return False
    return True


async def test_a_message_arriving_while_all_slots_are_busy_runs_exactly_once(
    make_queue: Callable[..., Queue],
) -> None:
    """Issue input: one worker on ``default`` and ``other`` with concurrency 1; a long task
    on ``default``, and while it runs a quick one on ``other``. The long task outlasts the
    visibility timeout several times over; the quick one must run exactly once, after it.
    (Reliable mode: leases; fast mode's held message is covered by the shutdown test.)"""
    queue = make_queue(visibility_timeout=1.0)
    runs: dict[str, int] = {}
    long_started = asyncio.Event()

    @queue.task(name="f.long", queue="default")
    async def long_task() -> str:
        runs["long"] = runs.get("long", 0) + 1
        long_started.set()
        await asyncio.sleep(3.0)  # three visibility timeouts
        return "long"

    @queue.task(name="f.quick", queue="other")
    async def quick() -> str:
        runs["quick"] = runs.get("quick", 0) + 1
        return "quick"

    worker = make_worker(queue, queues=["default", "other"], concurrency=1)
    async with running(worker):
        await eventually(queue.broker.workers, lambda w: worker.id in w, 10.0)
        h_long = await long_task.enqueue()
        await asyncio.wait_for(long_started.wait(), 10.0)
        h_quick = await quick.enqueue()  # arrives while every slot is busy
        # The quick message is not held by the busy worker: it waits on its queue.
        assert await eventually(lambda: _counts(queue, "other"), lambda c: c == (1, 0), 10.0)
        assert await h_long.result(timeout=20) == "long"
        assert await h_quick.result(timeout=20) == "quick"
        await eventually(lambda: _drained(queue, ["default", "other"]), bool, 10.0)
    assert runs == {"long": 1, "quick": 1}
    record = await h_quick.status()
    assert record is not None
    assert record.attempts == 1


async def test_shutdown_timeout_bounds_the_exit_while_a_message_waits_for_a_slot(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """Issue input: the same worker with ``shutdown_timeout`` 0.5 s, stopped while the long
    task runs. It stops within the timeout (plus a fetch), not when the long task ends;
    nothing is lost and the quick task later runs exactly once."""
    queue = make_queue(mode=mode, visibility_timeout=30.0)
    runs: dict[str, int] = {}
    long_started = asyncio.Event()

    @queue.task(name="f.long", queue="default")
    async def long_task() -> str:
        runs["long"] = runs.get("long", 0) + 1
        long_started.set()
        await asyncio.sleep(60.0 if runs["long"] == 1 else 0.0)
        return "long"

    @queue.task(name="f.quick", queue="other")
    async def quick() -> str:
        runs["quick"] = runs.get("quick", 0) + 1
        return "quick"

    worker = make_worker(queue, queues=["default", "other"], concurrency=1, shutdown_timeout=0.5)
    task = asyncio.create_task(worker.run())
    try:
        await eventually(queue.broker.workers, lambda w: worker.id in w, 10.0)
        h_long = await long_task.enqueue()
        await asyncio.wait_for(long_started.wait(), 10.0)
        h_quick = await quick.enqueue()  # arrives while every slot is busy
        assert await eventually(lambda: _counts(queue, "other"), lambda c: c == (1, 0), 10.0)
        stopped = time.monotonic()
        worker.stop()
        # Generous bound (0.5 s timeout + 0.2 s fetch + a loaded machine); the long task
        # would have held it 60 s.
        await asyncio.wait_for(task, 20.0)
        print(f"stopped {time.monotonic() - stopped:.2f} s after stop()")
    finally:
        if not task.done():
            task.cancel()
    # Both messages wait on their queues; no record was written.
    assert await _counts(queue, "default") == (1, 0)
    assert await _counts(queue, "other") == (1, 0)
    assert await h_quick.status() is None
    async with running(make_worker(queue, queues=["default", "other"], concurrency=1)):
        assert await h_long.result(timeout=20) == "long"
        assert await h_quick.result(timeout=20) == "quick"
        await eventually(lambda: _drained(queue, ["default", "other"]), bool, 10.0)
    assert runs == {"long": 2, "quick": 1}


@pytest.mark.parametrize(
    ("concurrency", "priorities"), [(1, ["high", "normal"]), (2, ["high", "normal", "low"])]
)
async def test_due_messages_on_several_levels_all_run(
    make_queue: Callable[..., Queue], concurrency: int, priorities: list[str]
) -> None:
    """Issue input: ``-c 1``, a high task (slow) and a normal one due at the same moment
    (the promoter moves both in one script while the worker blocks on all levels; Valkey
    answers that read with both). Also ``-c 2`` with three levels. Every task runs exactly
    once and the worker stops promptly. (Reliable mode: fast mode's BLMPOP pops from one
    list only.)"""
    queue = make_queue(name="pq")
    started: list[str] = []

    @queue.task(name="f.step")
    async def step(label: str, seconds: float) -> str:
        started.append(label)
        await asyncio.sleep(seconds)
        return label

    worker = make_worker(queue, concurrency=concurrency, shutdown_timeout=5.0)
    task = asyncio.create_task(worker.run())
    try:
        await eventually(queue.broker.workers, lambda w: worker.id in w, 10.0)
        eta = time.time() + 1.0
        handles = []
        for priority in priorities:
            seconds = 0.5 if priority == "high" else 0.0
            h = await step.options(priority=priority, eta=eta).enqueue(priority, seconds)
            handles.append(h)
        for h, priority in zip(handles, priorities, strict=True):
            assert await h.result(timeout=20) == priority
        assert sorted(started) == sorted(priorities)  # each exactly once
        await eventually(lambda: _drained(queue, levels("pq")), bool, 10.0)
        worker.stop()
        await asyncio.wait_for(task, 15.0)
    finally:
        if not task.done():
            task.cancel()


class _SlowBefore(Middleware):
    """A before-execute hook that waits for ``gate`` (set by the test)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.calls = 0

    async def before_execute(self, context: TaskContext) -> None:
        self.calls += 1
        self.entered.set()
        await self.gate.wait()


async def test_a_delivery_waiting_in_before_execute_keeps_its_lease(
    make_queue: Callable[..., Queue],
) -> None:
    """Sibling: a delivery whose before-execute hook takes longer than the visibility
    timeout is not recovered by the worker itself (its lease is renewed like a running
    task's): the task runs exactly once."""
    queue = make_queue(visibility_timeout=1.0)
    slow = _SlowBefore()
    queue.add_middleware(slow)
    runs: list[int] = []

    @queue.task(name="f.once")
    async def once() -> str:
        runs.append(1)
        return "ok"

    stream = "{" + queue.namespace + "}:s:default"
    client = queue.broker.state.client  # type: ignore[attr-defined]
    async with running(make_worker(queue, concurrency=2)):
        handle = await once.enqueue()
        await asyncio.wait_for(slow.entered.wait(), 10.0)
        # For 2.5 visibility timeouts, the delivery stays pending with this worker and its
        # lease keeps being renewed (idle time below the visibility timeout).
        held_since = time.monotonic()
        while time.monotonic() - held_since < 2.5:
            pending = await client.xpending_range(stream, "blitzq", "-", "+", 10)
            assert len(pending) == 1, pending
            assert pending[0]["time_since_delivered"] < 1000, pending
            await asyncio.sleep(0.05)
        slow.gate.set()
        assert await handle.result(timeout=10) == "ok"
        await eventually(lambda: _drained(queue, ["default"]), bool, 10.0)
    assert runs == [1]
    assert slow.calls == 1


async def test_shutdown_requeues_a_delivery_stuck_in_before_execute(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """Sibling: a before-execute hook that never returns does not hold the stop past
    ``shutdown_timeout``; its message goes back on the queue and runs on the next worker."""
    queue = make_queue(mode=mode, visibility_timeout=30.0)
    slow = _SlowBefore()
    queue.add_middleware(slow)

    @queue.task(name="f.later")
    async def later() -> str:
        return "ok"

    worker: Worker = make_worker(queue, concurrency=2, shutdown_timeout=0.5)
    task = asyncio.create_task(worker.run())
    try:
        handle = await later.enqueue()
        await asyncio.wait_for(slow.entered.wait(), 10.0)
        worker.stop()
        await asyncio.wait_for(task, 20.0)
    finally:
        if not task.done():
            task.cancel()
    assert await _counts(queue, "default") == (1, 0)
    slow.gate.set()
    async with running(make_worker(queue, concurrency=2)):
        assert await handle.result(timeout=10) == "ok"


class _SwallowingBefore(Middleware):
    """A misbehaving before-execute hook: it swallows the worker's cancellation."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def before_execute(self, context: TaskContext) -> None:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return  # and so the run starts


async def test_a_hook_swallowing_the_shutdown_cancel_does_not_duplicate_the_message(
    make_queue: Callable[..., Queue],
) -> None:
    """A start that goes on despite the shutdown's cancel is not also handed back: the task
    runs once and nothing is left in the queue."""
    queue = make_queue(visibility_timeout=30.0)
    queue.add_middleware(_SwallowingBefore())
    runs: list[int] = []

    @queue.task(name="f.once")
    async def once() -> str:
        runs.append(1)
        return "ok"

    worker: Worker = make_worker(queue, concurrency=2, shutdown_timeout=0.2)
    task = asyncio.create_task(worker.run())
    try:
        handle = await once.enqueue()
        await eventually(lambda: _counts(queue, "default"), lambda c: c == (0, 1), 10.0)
        worker.stop()
        await asyncio.wait_for(task, 20.0)
    finally:
        if not task.done():
            task.cancel()
    assert await handle.result(timeout=10) == "ok"
    assert runs == [1]
    assert await _counts(queue, "default") == (0, 0)
