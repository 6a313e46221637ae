"""Per-task state in the queue's slot on the spread layout (``broker/redis/homes.py``), on the
session's local 3-primary Redis Cluster (``redis_cluster``).

- A generated task id is homed on its queue: its record lives in the queue's slot and its
  result is found by id alone, from another Queue object too; a wait on it announces itself
  in that slot (the completion publishes a homed record only to an announced waiter).
- A batch of completions of homed tasks is one script call on the queue's node: nothing runs
  on the namespace's node, and the deliveries are acked.
- A completion that also writes namespace state (a dead letter, a retry's schedule entry) is
  split: the namespace's part there, the record in the queue's slot, then the ack.
- Ids chosen by the caller keep working: their state stays in the namespace's slot.
- Workflows (chain, chord), unique tasks, locks, progress and cancellation work with homed
  ids on the spread layout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from blitzq import Queue, TaskState, chain, chord, current_task
from blitzq.broker import Completion, DeadLetterFields
from blitzq.broker.redis.homes import home_queue, homed_id
from blitzq.broker.redis.spread import SpreadKeys
from blitzq.exceptions import TaskCancelled
from tests.broker_kinds import is_spread
from tests.cluster_server import LocalCluster
from tests.contract.test_broker_contract import message

from . import test_cluster_spread
from .proc_tasks import eventually, make_worker, running
from .test_cluster_spread import spread_queues

#: The fresh namespace of each test (the spread layout tests' fixture).
cluster_ns = test_cluster_spread.cluster_ns

pytestmark = pytest.mark.timeout(120)


def script_calls(cluster: LocalCluster) -> dict[int, int]:
    """``EVALSHA`` calls each node has served (``INFO commandstats``), by port."""
    out = {}
    for port in cluster.ports:
        with cluster.node(port) as node:
            stats: Any = node.info("commandstats")
            out[port] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return out


def owner_of_key(cluster: LocalCluster, key: str) -> int:
    """The port of the node that holds ``key`` now (``EXISTS`` on each node)."""
    for port in cluster.ports:
        with cluster.node(port) as node:
            try:
                if node.exists(key):
                    return port
            except Exception:  # MOVED: not this node's slot
                continue
    raise AssertionError(f"{key} is on no node")


async def test_a_generated_id_is_homed_and_its_result_found_by_id(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns, 2)
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)
    reader = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)

    @queue.task(name="h.add", queue=names[0])
    async def add(a: int, b: int) -> int:
        return a + b

    try:
        handle = await add.enqueue(2, 3)
        assert home_queue(handle.id) == names[0]
        broker = queue.broker
        assert is_spread(broker)
        waiting = asyncio.ensure_future(handle.result(timeout=60))
        # The wait announced itself in the task's home: its completion will publish to it.
        await eventually(
            lambda: broker.state.client.exists(broker.state.keys.waiter(handle.id)), bool, 30.0
        )
        async with running(make_worker(queue, concurrency=4)):
            assert await waiting == 5
        assert await reader.get_result(handle.id, timeout=10) == 5  # by id alone
        record = await reader.inspect(handle.id)
        assert record is not None
        assert record.state is TaskState.SUCCEEDED
        key = broker.state.keys.record(handle.id)
        assert key.startswith(SpreadKeys(cluster_ns).queue_tag(names[0]))
        queue_node = redis_cluster.owner(SpreadKeys(cluster_ns).queue_tag(names[0]))
        assert owner_of_key(redis_cluster, key) == queue_node
    finally:
        await queue.close()
        await reader.close()


async def test_a_batch_of_homed_completions_is_one_script_on_the_queue_node(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns, 2)
    q = names[0]  # a queue whose slot is not on the namespace's node
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)
    try:
        broker = queue.broker
        assert is_spread(broker)
        await broker.prepare_consumer([q], "homes-consumer")
        ids = [homed_id(q) for _ in range(21)]
        await broker.publish(q, [message(i, q) for i in ids])
        deliveries = await broker.fetch(q, 21, 0)
        assert len(deliveries) == 21
        warm = Completion(
            q, deliveries[0].token, ids[0], record=b"done " + ids[0].encode(), record_ttl=60
        )
        assert await broker.complete([warm]) == []  # the script loaded on its node
        deliveries, ids = deliveries[1:], ids[1:]
        before = script_calls(redis_cluster)
        batch = [
            Completion(q, d.token, i, record=b"done " + i.encode(), record_ttl=60)
            for d, i in zip(deliveries, ids, strict=True)
        ]
        assert await broker.complete(batch) == []
        after = script_calls(redis_cluster)
        queue_node = redis_cluster.owner(SpreadKeys(cluster_ns).queue_tag(q))
        ran = {port: after[port] - before[port] for port in after}
        assert ran == {port: 1 if port == queue_node else 0 for port in ran}
        assert await broker.queue_stats([q]) == {q: {"waiting": 0, "in_flight": 0}}
        assert await broker.get_records(ids) == [b"done " + i.encode() for i in ids]
        for i in ids[:3]:
            assert owner_of_key(redis_cluster, broker.state.keys.record(i)) == queue_node
    finally:
        await queue.close()


async def test_a_split_completion_of_a_homed_id_writes_each_part_in_its_slot(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns, 2)
    q = names[0]
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)
    try:
        broker = queue.broker
        assert is_spread(broker)
        await broker.prepare_consumer([q], "homes-split")
        dead_id, retried_id = homed_id(q), homed_id(q)
        await broker.publish(q, [message(dead_id, q), message(retried_id, q)])
        dead, retried = await broker.fetch(q, 2, 0)
        fields = DeadLetterFields(dead.payload, "failed", "boom", "tests.contract.task", q, 1.0)
        batch = [
            Completion(q, dead.token, dead_id, b"dead", 60, dead_letter=fields),
            Completion(q, retried.token, retried_id, b"retrying", 60, retried.payload, 600.0),
        ]
        assert await broker.complete(batch) == []
        assert await broker.get_records([dead_id, retried_id]) == [b"dead", b"retrying"]
        queue_node = redis_cluster.owner(SpreadKeys(cluster_ns).queue_tag(q))
        assert owner_of_key(redis_cluster, broker.state.keys.record(dead_id)) == queue_node
        letter = await broker.get_dead_letter(dead_id)  # in the namespace's slot
        assert letter is not None
        assert letter.reason == "failed"
        assert await broker.scheduled_count() == 1
        assert await broker.queue_stats([q]) == {q: {"waiting": 0, "in_flight": 0}}
    finally:
        await queue.close()


async def test_ids_chosen_by_the_caller_keep_working(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns, 2)
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)

    @queue.task(name="h.echo", queue=names[0])
    async def echo(value: str) -> str:
        return value

    try:
        async with running(make_worker(queue, concurrency=4)):
            chosen = await echo.options(task_id="order-17").enqueue("a")
            lookalike_id = homed_id(names[1])  # homed on another queue than the task's
            lookalike = await echo.options(task_id=lookalike_id).enqueue("b")
            assert chosen.id == "order-17"
            assert await chosen.result(timeout=30) == "a"
            assert await lookalike.result(timeout=30) == "b"
        assert await queue.get_result("order-17", timeout=10) == "a"
        assert await queue.get_result(lookalike_id, timeout=10) == "b"
        broker = queue.broker
        assert is_spread(broker)
        assert broker.state.keys.record("order-17").startswith("{" + cluster_ns + "}:")
        assert broker.state.keys.record(lookalike_id).startswith(
            SpreadKeys(cluster_ns).queue_tag(names[1])
        )
    finally:
        await queue.close()


async def test_workflows_unique_locks_progress_and_cancel_with_homed_ids(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns, 3)
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns, track_state=True)
    gate = asyncio.Event()

    @queue.task(name="h.add", queue=names[0])
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="h.total", queue=names[1])
    async def total(values: list[int]) -> int:
        return sum(values)

    @queue.task(name="h.double", queue=names[2])
    async def double(x: int) -> int:
        return 2 * x

    @queue.task(name="h.once", queue=names[1], unique=True)
    async def once(x: int) -> int:
        return x

    @queue.task(name="h.locked", queue=names[2], lock="res:{resource}", retries=0)
    async def locked(resource: str) -> str:
        return resource

    @queue.task(name="h.report", queue=names[0])
    async def report() -> int:
        current_task().update_progress(1, 2, "half")
        await gate.wait()
        return 2

    try:
        queued = await add.enqueue(0, 0)  # no worker yet
        assert await queued.cancel() == "queued"
        delayed = await add.options(delay=600).enqueue(0, 0)
        assert await delayed.cancel() == "scheduled"
        first = await once.enqueue(7)
        second = await once.enqueue(7)
        assert second.duplicate
        assert second.id == first.id
        async with running(make_worker(queue, concurrency=8)):
            chained = await queue.apply(chain(add.s(1, 2), double.s()))
            joined = await queue.apply(chord([add.s(i, 1) for i in range(5)], total.s()))
            reporting = await report.enqueue()
            progress = await eventually(lambda: queue.get_progress(reporting.id), bool, 30.0)
            assert progress is not None
            assert progress.current == 1
            gate.set()
            locks = [await locked.enqueue("r") for _ in range(3)]
            assert await chained.get(timeout=30) == 6
            steps = await chained.children()  # a workflow's steps are homed on their queues
            assert [home_queue(step.id) for step in steps] == [names[0], names[2]]
            assert await joined.get(timeout=30) == sum(i + 1 for i in range(5))
            assert await reporting.result(timeout=30) == 2
            assert await first.result(timeout=30) == 7
            assert [await h.result(timeout=30) for h in locks] == ["r", "r", "r"]
            with pytest.raises(TaskCancelled):
                await queued.result(timeout=30)
            assert await reporting.cancel() == "finished"
        for handle in (queued, delayed):
            record = await handle.status()
            assert record is not None
            assert record.state is TaskState.CANCELLED
        assert home_queue(reporting.id) == names[0]
    finally:
        await queue.close()
