"""An explicit ``task_id`` enqueued again while its earlier run is still going (bug F1).

The record of an explicit id belongs to its newest enqueue: a run of an older enqueue of the
id still runs and is acknowledged, but stores no record over the newer one's (the owner mark
``tn:<id>``, compared by ``complete.lua``), in whichever order the two runs end. Every handle
of the id waits for the id's record, so the old handle answers with the new run's outcome
too. A unique task retried under its own id leaves the live task's record alone.
Redis in reliable and fast mode, and RabbitMQ (state on Redis).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import Queue, TaskFailed, TaskState, Worker
from blitzq.broker.amqp import AmqpBroker
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.broker_kinds import is_spread

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["reliable", "fast", "spread", "amqp"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker of the Queue under test (``spread``: the Redis Cluster layout of per-queue
    slots, forced on a single server)."""
    return str(request.param)


def redis_queue(make_queue: Callable[..., Queue], server_url: str, mode: str, **kw: Any) -> Queue:
    """A Queue ``idr`` on the test server in ``mode`` (not ``amqp``)."""
    if mode == "spread":
        queue = make_queue(name="idr", redis_url=server_url + "?layout=spread", **kw)
        assert is_spread(queue.broker)
        return queue
    return make_queue(name="idr", mode=mode, **kw)


@pytest.fixture(params=[False, True], ids=["no-state", "track-state"])
async def queue(
    make_queue: Callable[..., Queue],
    server_url: str,
    namespace: str,
    mode: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Queue]:
    """The Queue under test (named ``idr``), with or without ``track_state``."""
    if mode == "amqp":
        url = amqp_or_skip()
        broker = AmqpBroker(url, server_url, namespace)
        q = Queue("idr", broker=broker, track_state=request.param)
        yield q
        await q.close()
        await delete_amqp_queues(url, [broker])
        return
    q = redis_queue(make_queue, server_url, mode, track_state=request.param)
    yield q
    await q.close()


class Gates:
    """Per-value events: ``started[v]`` set when the run of ``v`` starts, ``gate[v]`` set by
    the test to let it return."""

    def __init__(self) -> None:
        self.started: dict[int, asyncio.Event] = {}
        self.gate: dict[int, asyncio.Event] = {}

    def of(self, table: dict[int, asyncio.Event], value: int) -> asyncio.Event:
        """The event of ``value`` in ``table`` (made on first use)."""
        return table.setdefault(value, asyncio.Event())

    def release(self) -> None:
        """Let every run return (a failed test must not leave one waiting)."""
        for gate in self.gate.values():
            gate.set()


def gated(queue: Queue, gates: Gates) -> Any:
    """Task ``idr.gated(v)``: announces its start, waits for its gate, returns ``v``."""

    @queue.task(name="idr.gated", retries=0)
    async def run(value: int) -> int:
        gates.of(gates.started, value).set()
        await gates.of(gates.gate, value).wait()
        return value

    return run


async def committed(worker: Worker, count: int) -> None:
    """Return once ``worker`` has ended ``count`` runs and written their completions."""
    await eventually(lambda: _processed(worker), lambda n: n >= count, timeout=60)
    await asyncio.wait_for(worker._flusher.flush(), 60)


async def _processed(worker: Worker) -> int:
    return worker.processed


async def _result(queue: Queue, task_id: str) -> Any:
    record = await queue.inspect(task_id)
    return None if record is None else (record.state, record.result)


@pytest.mark.parametrize("older_ends", ["first", "last"])
async def test_the_record_of_a_reused_id_is_the_newest_enqueues(
    queue: Queue, older_ends: str
) -> None:
    gates = Gates()
    task = gated(queue, gates).options(task_id="idr-x")
    worker = make_worker(queue, concurrency=2)
    async with running(worker):
        try:
            old = await task.enqueue(1)
            await asyncio.wait_for(gates.of(gates.started, 1).wait(), 60)
            new = await task.enqueue(2)  # the first run is still going
            await asyncio.wait_for(gates.of(gates.started, 2).wait(), 60)
            waiter = asyncio.create_task(new.result(timeout=60))
            if older_ends == "first":
                gates.of(gates.gate, 1).set()
                await committed(worker, 1)
                # The old run's completion is applied: it stored no record over the new one's.
                found = await _result(queue, "idr-x")
                assert found is None or found[0] in (TaskState.QUEUED, TaskState.RUNNING), found
                gates.of(gates.gate, 2).set()
                assert await waiter == 2  # never the old run's 1
            else:
                gates.of(gates.gate, 2).set()
                assert await waiter == 2
                gates.of(gates.gate, 1).set()
                await committed(worker, 2)  # the old run ends late
            assert await new.result(timeout=10) == 2
            # A handle of the old enqueue waits for the id's record too: the newest run's.
            assert await old.result(timeout=10) == 2
        finally:
            gates.release()
    record = await queue.inspect("idr-x")
    assert record is not None
    assert (record.state, record.result) == (TaskState.SUCCEEDED, 2)
    assert worker.processed == 2  # both runs ran and count


async def test_a_unique_retry_under_its_own_id_leaves_the_live_record_alone(
    make_queue: Callable[..., Queue], server_url: str, mode: str
) -> None:
    if mode == "amqp":
        pytest.skip("the unique step is the state store's, on Redis: as in the Redis modes")
    queue = redis_queue(make_queue, server_url, mode, track_state=True)
    gates = Gates()

    @queue.task(name="idr.once", unique=True, retries=0)
    async def once(value: int) -> int:
        gates.of(gates.started, value).set()
        await gates.of(gates.gate, value).wait()
        return value

    fixed = once.options(task_id="idr-u")
    try:
        async with running(make_worker(queue, concurrency=2)):
            try:
                first = await fixed.enqueue(7)
                await asyncio.wait_for(gates.of(gates.started, 7).wait(), 60)
                await eventually(
                    lambda: queue.inspect("idr-u"),
                    lambda r: r is not None and r.state is TaskState.RUNNING,
                )
                retry = await fixed.enqueue(7)  # the same call: its key holds this very id
                assert (retry.id, retry.duplicate) == ("idr-u", False)
                record = await queue.inspect("idr-u")
                assert record is not None
                assert record.state is TaskState.RUNNING  # not reset to queued
                gates.of(gates.gate, 7).set()
                assert await retry.result(timeout=30) == 7
                assert await first.result(timeout=10) == 7
            finally:
                gates.release()
    finally:
        await queue.close()


async def test_a_replayed_dead_letter_of_a_reused_id_writes_its_record(queue: Queue) -> None:
    failing = {"on": True}

    @queue.task(name="idr.flaky", retries=0)
    async def flaky(value: int) -> int:
        if failing["on"]:
            raise RuntimeError("not yet")
        return value

    task = flaky.options(task_id="idr-d")
    async with running(make_worker(queue, concurrency=2)):
        dead = await task.enqueue(1)
        with pytest.raises(TaskFailed):
            await dead.result(timeout=30)
        failing["on"] = False
        newer = await task.enqueue(2)  # the newest enqueue of the id, done
        assert await newer.result(timeout=30) == 2
        replayed = await queue.retry("idr-d")  # the dead letter of the first enqueue
        assert replayed is not None
        await eventually(
            lambda: _result(queue, "idr-d"), lambda found: found == (TaskState.SUCCEEDED, 1)
        )
        assert await replayed.result(timeout=30) == 1
