"""Every signal fires from a real run: a real worker (or scheduler, or producer) against the
real Redis, never ``emit`` called by hand.

One scenario per group of signals: a task's path before it runs (received, rejected for each
reason, expired, revoked), a worker's life (starting, stopping, and the heartbeat of another
worker process that was SIGKILLed), a scheduler's (started, dispatched, missed, stopped), and
a workflow's (started, step done, completed, failed). Handlers that raise are logged and
change nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from blitzq import Queue, Signal, SignalEvent, TaskCancelled, TaskExpired, TaskFailed
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every
from blitzq.serialization import Envelope, encode_envelope
from blitzq.workflow import chord, group

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


class Events:
    """Collects the events of the signals it is connected to, in order."""

    def __init__(self, queue: Queue, *signals: Signal) -> None:
        self.events: list[SignalEvent] = []
        for sig in signals:
            queue.on(sig)(self.events.append)

    def of(self, sig: Signal, task_id: str | None = None) -> list[SignalEvent]:
        """The events of ``sig`` (about ``task_id`` when given)."""
        return [
            e for e in self.events if e.signal is sig and (task_id is None or e.task_id == task_id)
        ]

    async def wait(self, accept: Callable[[list[SignalEvent]], bool]) -> None:
        """Poll until ``accept`` holds for the events seen so far."""
        await eventually(lambda: asyncio.sleep(0, result=list(self.events)), accept)


async def server_now(raw_redis: Any) -> float:
    """The Redis server's clock (what decides when periodic occurrences are due)."""
    seconds, micros = await raw_redis.time()
    return float(seconds) + micros / 1e6


# --------------------------------------------------------------------------- tasks
async def test_received_rejected_expired_and_revoked_from_a_real_worker(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(name="sigs", mode=mode, max_message_size=2048)
    seen = Events(
        queue,
        Signal.TASK_RECEIVED,
        Signal.TASK_REJECTED,
        Signal.TASK_EXPIRED,
        Signal.TASK_REVOKED,
        Signal.TASK_CANCELLED,
        Signal.TASK_SUCCEEDED,
    )

    @queue.on(Signal.TASK_RECEIVED)
    def broken(event: SignalEvent) -> None:  # raises for every delivery: the worker goes on
        raise RuntimeError("handler broke")

    coroutine_saw: list[str | None] = []

    @queue.on(Signal.TASK_EXPIRED)
    async def awaited(event: SignalEvent) -> None:  # a coroutine handler: a background task
        await asyncio.sleep(0)
        coroutine_saw.append(event.task_id)

    @queue.task(name="sigs.ok")
    async def ok(x: int) -> int:
        return x * 2

    @queue.task(name="sigs.fresh", max_age=0.05)
    async def fresh() -> None:
        raise AssertionError("an expired task must not run")

    @queue.task(name="sigs.never")
    async def never() -> None:
        raise AssertionError("a cancelled task must not run")

    keys = Keys(namespace)

    async def plant(payload: bytes) -> None:
        if mode == "reliable":
            await raw_redis.xadd(keys.stream(queue.name), {MESSAGE_FIELD: payload})
        else:
            await raw_redis.rpush(keys.list(queue.name), payload)

    done = await ok.enqueue(21)
    stale = await fresh.options(delay=0.3).enqueue()  # older than max_age once it is due
    revoked = await never.enqueue()
    was = await revoked.cancel()
    unknown = await queue.send("sigs.no_such_task", [1])
    await plant(msgspec.msgpack.encode(["bad-1", "sigs.ok", queue.name, "not a list"]))
    await plant(encode_envelope(Envelope("big-1", "sigs.ok", queue.name, ["x" * 5000]), 1 << 20))

    (revoke,) = seen.of(Signal.TASK_REVOKED)  # producer side: emitted by cancel() itself
    assert (revoke.task_id, revoke.extra["was"], revoke.worker) == (revoked.id, was, None)
    async with running(make_worker(queue, concurrency=4, unknown_task_grace=0)) as worker:
        assert await done.result(timeout=10) == 42
        with pytest.raises(TaskExpired):
            await stale.result(timeout=10)
        with pytest.raises(TaskCancelled):
            await revoked.result(timeout=10)
        await seen.wait(
            lambda es: (
                sum(e.signal is Signal.TASK_REJECTED for e in es) == 3
                and any(e.signal is Signal.TASK_EXPIRED for e in es)
                and any(e.signal is Signal.TASK_CANCELLED for e in es)
            )
        )
        assert not worker.stopping

    (received,) = seen.of(Signal.TASK_RECEIVED, done.id)
    assert (received.task, received.queue, received.attempt) == ("sigs.ok", "sigs", 1)
    assert received.worker == worker.id
    (succeeded,) = seen.of(Signal.TASK_SUCCEEDED, done.id)
    assert seen.events.index(received) < seen.events.index(succeeded)
    # Received before its start checks and before the worker skips a cancelled one.
    assert len(seen.of(Signal.TASK_RECEIVED, stale.id)) == 1
    assert len(seen.of(Signal.TASK_RECEIVED, revoked.id)) == 1
    # Malformed and too large are rejected before they are received; unknown after.
    assert seen.of(Signal.TASK_RECEIVED, "bad-1") == []
    assert seen.of(Signal.TASK_RECEIVED, "big-1") == []
    rejected = {e.extra["reason"]: e for e in seen.of(Signal.TASK_REJECTED)}
    assert set(rejected) == {"unknown task", "malformed message", "message too large"}
    assert rejected["unknown task"].task_id == unknown.id
    assert rejected["unknown task"].task == "sigs.no_such_task"
    assert rejected["malformed message"].task_id == "bad-1"
    assert rejected["message too large"].task_id == "big-1"
    for event in rejected.values():
        assert event.queue == "sigs"
        assert event.worker == worker.id
        assert event.error_type == event.extra["reason"]
        assert event.error_message
        assert event.extra["deliveries"] >= 1
    (expired,) = seen.of(Signal.TASK_EXPIRED)
    assert (expired.task_id, expired.task, expired.queue) == (stale.id, "sigs.fresh", "sigs")
    assert expired.error_type == "TaskExpired"
    assert expired.extra["max_age"] == 0.05
    assert expired.extra["age"] > 0.05
    assert coroutine_saw == [stale.id]
    (cancelled,) = seen.of(Signal.TASK_CANCELLED)
    assert cancelled.task_id == revoked.id
    assert {d.reason for d in await queue.dead_letters()} == {
        "expired",
        "unknown task",
        "malformed message",
        "message too large",
    }
    await queue.close()


# -------------------------------------------------------------------------- workers
async def test_worker_starting_started_stopping_stopped_in_order(
    make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(name="sigs")
    order: list[tuple[str, str | None]] = []
    life = (
        Signal.WORKER_STARTING,
        Signal.WORKER_STARTED,
        Signal.WORKER_STOPPING,
        Signal.WORKER_STOPPED,
    )
    seen = Events(queue, *life)

    @queue.on_startup
    async def startup() -> None:
        order.append(("startup hook", None))

    @queue.on(Signal.WORKER_STARTING)
    async def broken(event: SignalEvent) -> None:
        order.append(("starting", event.worker))
        raise RuntimeError("starting handler broke")

    @queue.task(name="sigs.slow")
    async def slow() -> str:
        return "done"

    caplog.set_level(logging.ERROR, logger="blitzq.signals")
    handle = await slow.enqueue()
    async with running(make_worker(queue)) as worker:
        assert await handle.result(timeout=10) == "done"
        assert [e.signal for e in seen.events] == [Signal.WORKER_STARTING, Signal.WORKER_STARTED]
    assert [e.signal for e in seen.events] == list(life)
    assert {e.worker for e in seen.events} == {worker.id}
    assert all(e.extra["queues"] == ["sigs"] for e in seen.events)
    assert seen.of(Signal.WORKER_STOPPING)[0].extra["running"] == 0
    # STARTING comes before the startup hooks; its raising handler was logged, no more.
    assert order == [("starting", worker.id), ("startup hook", None)]
    assert "starting handler broke" in caplog.text
    await queue.close()


async def test_heartbeat_lost_of_a_killed_worker_process(
    make_queue: Callable[..., Queue], server_url: str, namespace: str
) -> None:
    """A worker SIGKILLed in another process stops renewing its registration; a live
    worker of the namespace notices the lapse and emits WORKER_HEARTBEAT_LOST, once."""
    queue = make_queue(name="sigs", visibility_timeout=1.0)
    seen = Events(queue, Signal.WORKER_HEARTBEAT_LOST)
    script = textwrap.dedent(
        f"""
        import asyncio
        from blitzq import Queue, Worker
        queue = Queue(name="sigs", redis_url={server_url!r}, namespace={namespace!r},
                      visibility_timeout=1.0)
        asyncio.run(Worker(queue, block_timeout=0.2).run())
        """
    )
    other = await asyncio.create_subprocess_exec(sys.executable, "-c", script, env=dict(os.environ))
    try:
        registered = await eventually(queue.broker.workers, lambda w: len(w) == 1, timeout=60)
        (lost_id,) = registered
        async with running(make_worker(queue)) as watcher:
            await eventually(queue.broker.workers, lambda w: len(w) == 2)
            other.send_signal(signal.SIGKILL)
            await asyncio.wait_for(other.wait(), 30)
            await seen.wait(lambda es: len(es) >= 1)
            assert watcher.id in await queue.broker.workers()
    finally:
        if other.returncode is None:
            other.kill()
            await asyncio.wait_for(other.wait(), 30)
    (event,) = seen.events
    assert event.worker == watcher.id
    assert event.extra["lost_worker"] == lost_id
    assert event.extra["pid"] == other.pid
    assert event.extra["queues"] == ["sigs"]
    assert event.extra["heartbeat_at"] > 0
    assert lost_id not in await queue.broker.workers()
    await queue.close()


# ------------------------------------------------------------------------ scheduler
async def test_scheduler_started_dispatched_missed_and_stopped(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(name="sigs")
    seen = Events(
        queue,
        Signal.SCHEDULER_STARTED,
        Signal.SCHEDULER_DISPATCHED,
        Signal.SCHEDULER_MISSED,
        Signal.SCHEDULER_STOPPED,
    )
    now = await server_now(raw_redis)
    # Daily entries whose occurrences fall 12 h either side of now: nothing comes due while
    # the test runs; their history, planted three days back, leaves occurrences missed.
    offset = (now + 43200.0) % 86400.0
    daily = Every(86400, offset=offset)
    newest = daily.next_after(now) - 86400.0
    periodic = "{" + namespace + "}:periodic"
    await raw_redis.hset(periodic, mapping={"catchup": repr(newest - 3 * 86400)})
    await raw_redis.hset(periodic, mapping={"late": repr(newest - 3 * 86400)})

    @queue.periodic(daily, name="catchup", missed="run_once")
    async def catchup() -> str:
        return "caught up"

    @queue.periodic(daily, name="late", missed="skip")
    async def late() -> None:
        raise AssertionError("a skipped occurrence must not run")

    scheduler = Scheduler(queue, poll_interval=0.1)
    runner = asyncio.create_task(scheduler.run())
    try:
        await seen.wait(lambda es: len(es) >= 4)  # started, dispatched, two missed
    finally:
        scheduler.stop()
        await asyncio.wait_for(runner, 10)
    assert seen.events[0].signal is Signal.SCHEDULER_STARTED
    assert seen.events[0].extra["periodic"] == ["catchup", "late"]
    (dispatched,) = seen.of(Signal.SCHEDULER_DISPATCHED)
    assert dispatched.task_id == f"periodic:catchup:{int(newest)}"
    assert (dispatched.task, dispatched.queue) == ("catchup", "sigs")
    assert dispatched.extra == {"periodic": "catchup", "occurrence": newest}
    missed = {e.extra["periodic"]: e for e in seen.of(Signal.SCHEDULER_MISSED)}
    assert set(missed) == {"catchup", "late"}
    # run_once: the newest occurrence ran, the one before it (and older) did not.
    assert missed["catchup"].extra["occurrence"] == newest - 86400
    assert missed["catchup"].extra["dispatched"] == newest
    assert missed["catchup"].extra["policy"] == "run_once"
    # skip: the due occurrence is 12 h late, so it is dropped, nothing dispatched.
    assert missed["late"].extra["occurrence"] == newest
    assert missed["late"].extra["dispatched"] is None
    assert missed["late"].extra["policy"] == "skip"
    assert seen.events[-1].signal is Signal.SCHEDULER_STOPPED
    assert seen.events[-1].extra["dispatched"] == 1
    assert len(seen.of(Signal.SCHEDULER_MISSED)) == 2  # once each, however many ticks
    await queue.close()


# ------------------------------------------------------------------------ workflows
async def test_workflow_started_steps_done_completed_and_failed(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="sigs", mode=mode)
    seen = Events(
        queue,
        Signal.WORKFLOW_STARTED,
        Signal.WORKFLOW_STEP_DONE,
        Signal.WORKFLOW_COMPLETED,
        Signal.WORKFLOW_FAILED,
    )

    @queue.task(name="sigs.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="sigs.total")
    async def total(values: list[int]) -> int:
        return sum(values)

    @queue.task(name="sigs.boom", retries=0, dead_letter=False)
    async def boom(value: int) -> None:
        raise ValueError(f"boom at {value}")

    async with running(make_worker(queue, concurrency=4)) as worker:
        chained = await queue.apply(add.s(1, 2) | add.s(10))
        assert await chained.get(timeout=10) == 13
        fanned = await queue.apply(chord(group(add.s(i, i) for i in range(3)), total.s()))
        assert await fanned.get(timeout=10) == 6
        broken = await queue.apply(add.s(1, 1) | boom.s() | add.s(5))
        with pytest.raises(TaskFailed):
            await broken.get(timeout=10)
        # A workflow that ends with a plain group: its last member in completes it.
        grouped = await queue.apply(add.s(0, 1) | group(add.s(i) for i in range(3)))
        assert await grouped.get(timeout=10) == [1, 2, 3]
        # Several members fail: the workflow fails once, by the first failure written.
        failing = await queue.apply(group(boom.s(i) for i in range(3)))
        with pytest.raises(TaskFailed):
            await failing.get(timeout=10)
        ids = (chained.id, fanned.id, broken.id, grouped.id, failing.id)
        await seen.wait(
            lambda es: (
                {e.extra["workflow_id"] for e in es if e.signal is Signal.WORKFLOW_COMPLETED}
                == {chained.id, fanned.id, grouped.id}
                and {e.extra["workflow_id"] for e in es if e.signal is Signal.WORKFLOW_FAILED}
                == {broken.id, failing.id}
                and sum(e.extra["workflow_id"] == failing.id for e in es) == 1 + 3 + 1
            )
        )

    def of(sig: Signal, workflow_id: str) -> list[SignalEvent]:
        return [e for e in seen.of(sig) if e.extra["workflow_id"] == workflow_id]

    for workflow_id, steps in zip(ids, (2, 4, 3, 4, 3), strict=True):
        (started,) = of(Signal.WORKFLOW_STARTED, workflow_id)
        assert started.extra["steps"] == steps  # every step the user wrote
        assert started.worker is None  # the producer emits it
        assert started.queue == "sigs"
    # A chain: each step done once, then completed with the result of the last one.
    done = of(Signal.WORKFLOW_STEP_DONE, chained.id)
    assert [(e.task, e.result, e.extra["state"]) for e in done] == [
        ("sigs.add", 3, "succeeded"),
        ("sigs.add", 13, "succeeded"),
    ]
    (completed,) = of(Signal.WORKFLOW_COMPLETED, chained.id)
    assert (completed.task_id, completed.result) == (done[-1].task_id, 13)
    assert completed.worker == worker.id
    assert seen.events.index(done[-1]) < seen.events.index(completed)
    # A chord: three members and the callback; completed by the callback.
    assert len(of(Signal.WORKFLOW_STEP_DONE, fanned.id)) == 4
    (fan_done,) = of(Signal.WORKFLOW_COMPLETED, fanned.id)
    assert (fan_done.task, fan_done.result) == ("sigs.total", 6)
    # A failing step: done as failed, the workflow failed with its error; nothing after it.
    failed_steps = [
        (e.task, e.extra["state"], e.error_type) for e in of(Signal.WORKFLOW_STEP_DONE, broken.id)
    ]
    assert failed_steps == [("sigs.add", "succeeded", None), ("sigs.boom", "failed", "ValueError")]
    (failed,) = of(Signal.WORKFLOW_FAILED, broken.id)
    assert failed.task == "sigs.boom"
    assert failed.extra["state"] == "failed"
    assert failed.error_type == "ValueError"
    assert failed.error_message == "boom at 2"
    assert isinstance(failed.error, ValueError)
    assert of(Signal.WORKFLOW_COMPLETED, broken.id) == []
    # A plain group at the end: completed once, with the list, by its last member.
    (group_done,) = of(Signal.WORKFLOW_COMPLETED, grouped.id)
    assert group_done.result == [1, 2, 3]
    assert group_done.task_id in {e.task_id for e in of(Signal.WORKFLOW_STEP_DONE, grouped.id)}
    # Three members failed: three steps done, one WORKFLOW_FAILED.
    assert len(of(Signal.WORKFLOW_STEP_DONE, failing.id)) == 3
    (group_failed,) = of(Signal.WORKFLOW_FAILED, failing.id)
    assert group_failed.task == "sigs.boom"
    assert group_failed.error_message is not None
    assert group_failed.error_message.startswith("boom at ")
    await queue.close()
