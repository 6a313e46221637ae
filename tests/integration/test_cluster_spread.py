"""The spread layout on the session's local 3-primary Redis Cluster (``redis_cluster``).

- The layout is chosen by the URL: the spread layout by default on a cluster, the one-slot
  layout with ``?layout=slot``, the one-slot layout on a single server.
- One namespace with several queues has its keys on more than one node, and a worker runs
  tasks across those queues with results, a retry, a delayed task, a chain's next step on
  another queue and a dead-letter replay: every cross-slot step arrives.
- The relay's hand-off is idempotent: a batch taken, published and never released (the
  relay died) is kept whole when its lease lapses, and the relay that takes it over
  publishes nothing more; a batch older than ``MAX_AGE`` is refused.

- A queue's own slot is resharded mid-run: the clients and the scripts follow it.

The SIGKILL crash test runs on both layouts in test_cluster.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from blitzq import Queue, RetryPolicy, TaskState, chain
from blitzq.broker.redis.handoff import MAX_AGE, SpreadOutbox
from blitzq.broker.redis.spread import SpreadKeys, SpreadRedisBroker
from blitzq.broker.values import Scheduled
from blitzq.exceptions import ConfigurationError
from tests.broker_kinds import is_reliable_redis, is_spread
from tests.cluster_server import LocalCluster, migrate_slot
from tests.contract.test_broker_contract import message

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster_ns(redis_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace on the cluster; its keys (the queues' too) are deleted afterwards."""
    ns = "sp-" + uuid.uuid4().hex[:12]
    yield ns
    with redis.RedisCluster.from_url(redis_cluster.url()) as client:
        for pattern in ("{" + ns + "}:*", "{" + ns + ":q:*"):
            for key in client.scan_iter(match=pattern, target_nodes="all"):
                client.delete(key)


def spread_queues(cluster: LocalCluster, ns: str, n: int = 4) -> list[str]:
    """``n`` queue names whose slots are on at least two nodes, one of them not the node of
    the namespace's own slot (the store's)."""
    keys = SpreadKeys(ns)
    store = cluster.owner(keys.prefix)
    names = [f"q{i}" for i in range(64)]
    owners = {name: cluster.owner(keys.queue_tag(name)) for name in names}
    away = next(name for name in names if owners[name] != store)
    other = next(name for name in names if owners[name] not in (owners[away],))
    rest = [name for name in names if name not in (away, other)]
    return [away, other, *rest[: n - 2]]


def keys_per_node(cluster: LocalCluster, ns: str) -> dict[int, int]:
    """How many keys of ``ns`` (the store's and the queues') each node holds."""
    out = {}
    for port in cluster.ports:
        with cluster.node(port) as node:
            out[port] = len(list(node.scan_iter(match="{" + ns + "*", count=1000)))
    return out


async def test_the_url_chooses_the_layout(redis_cluster: LocalCluster, redis_url: str) -> None:
    spread = Queue(redis_url=redis_cluster.url(), namespace="sp-choice")
    slot = Queue(redis_url=redis_cluster.url() + "?layout=slot", namespace="sp-choice")
    single = Queue(redis_url=redis_url, namespace="sp-choice")
    forced = Queue(redis_url=redis_url + "?layout=spread", namespace="sp-choice")
    try:
        assert is_spread(spread.broker)
        assert is_reliable_redis(slot.broker)
        assert is_reliable_redis(single.broker)
        assert is_spread(forced.broker)
        with pytest.raises(ConfigurationError, match="layout"):
            _ = Queue(redis_url=redis_cluster.url() + "?layout=wide", namespace="x").broker
    finally:
        for q in (spread, slot, single, forced):
            await q.close()


async def test_one_namespace_on_several_nodes_runs_every_cross_slot_step(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    names = spread_queues(redis_cluster, cluster_ns)
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)
    runs: dict[str, int] = {}

    def adder(i: int, name: str) -> object:
        @queue.task(name=f"sp.add{i}", queue=name)
        async def add(a: int, b: int) -> int:
            return a + b

        return add

    adders = [adder(i, name) for i, name in enumerate(names)]

    @queue.task(name="sp.double", queue=names[1])
    async def double(x: int) -> int:
        return 2 * x

    @queue.task(
        name="sp.flaky",
        queue=names[2],
        retries=2,
        retry_policy=RetryPolicy(base=0.05, jitter="none"),
    )
    async def flaky() -> str:
        runs["flaky"] = runs.get("flaky", 0) + 1
        if runs["flaky"] == 1:
            raise RuntimeError("first run fails")
        return "ok"

    @queue.task(name="sp.poison", queue=names[3], retries=0)
    async def poison() -> str:
        runs["poison"] = runs.get("poison", 0) + 1
        if runs["poison"] == 1:
            raise RuntimeError("dead-lettered on its first run")
        return "replayed"

    try:
        assert is_spread(queue.broker)
        async with running(make_worker(queue, concurrency=8)):
            handles = [
                await adders[i % len(adders)].enqueue(i, i)  # type: ignore[attr-defined]
                for i in range(40)
            ]
            delayed = await adders[0].options(delay=0.3).enqueue(100, 1)  # type: ignore[attr-defined]
            retried = await flaky.enqueue()
            chained = await queue.apply(chain(adders[0].s(1, 2), double.s()))  # type: ignore[attr-defined]
            poisoned = await poison.enqueue()
            assert [await h.result(timeout=30) for h in handles] == [2 * i for i in range(40)]
            assert await delayed.result(timeout=30) == 101
            assert await retried.result(timeout=30) == "ok"
            assert await chained.get(timeout=30) == 6
            await eventually(lambda: queue.broker.get_dead_letter(poisoned.id), bool)
            outcomes = await queue.retry_dead_letters(task="sp.poison")
            assert len(outcomes) == 1
            assert await poisoned.result(timeout=30) == "replayed"
        assert runs == {"flaky": 2, "poison": 2}
        record = await delayed.status()
        assert record is not None
        assert record.state is TaskState.SUCCEEDED
    finally:
        await queue.close()
    per_node = keys_per_node(redis_cluster, cluster_ns)
    assert sum(1 for n in per_node.values() if n) >= 2, per_node
    keys = SpreadKeys(cluster_ns)
    for name in names:  # each queue's stream is on the node owning its own slot
        owner = redis_cluster.owner(keys.queue_tag(name))
        with redis_cluster.node(owner) as node:
            slot = int(node.execute_command("CLUSTER", "KEYSLOT", keys.stream(name)))
            assert int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) >= 1
            assert node.exists(keys.stream(name))


async def test_a_relay_that_died_after_publishing_publishes_nothing_twice(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    broker = SpreadRedisBroker(redis_cluster.url(), cluster_ns)
    try:
        relay = broker.relay
        assert relay is not None
        outbox = relay.outbox
        assert isinstance(outbox, SpreadOutbox)
        items = [Scheduled(f"h{i}", "hq", message(f"h{i}", "hq")) for i in range(3)]
        await broker.state.scheduling.schedule(items)
        promoted = await broker.state.scheduling.promote_due(
            100
        )  # the store's step alone: no relay
        assert promoted[0] == 3
        # A relay takes the batch and publishes it, then dies before releasing it.
        taken = await outbox.take_batch("dead-relay", "hq", 100, lease=0.2)
        assert taken is not None
        queue, batch, taken_at, messages = taken
        assert (queue, len(messages)) == ("hq", 3)
        assert await broker.transport.publish_once(queue, batch, taken_at, messages) == 3
        stream = broker.transport.keys.stream("hq")
        assert await broker.state.client.xlen(stream) == 3
        # Its lease lapses: the batch is kept whole, with its id, for another relay.
        await asyncio.sleep(0.3)
        assert await outbox.restore(10) == 3
        assert await relay.drain() == 0  # taken over under the same id: nothing added
        assert await broker.state.client.xlen(stream) == 3
        assert await outbox.take_batch(relay.id, "hq", 100, 60.0) is None
        # A fresh batch goes through once.
        await broker.state.scheduling.schedule([Scheduled("h9", "hq", message("h9", "hq"))])
        await broker.state.scheduling.promote_due(100)
        assert await relay.drain() == 1
        assert await broker.state.client.xlen(stream) == 4
        # A batch older than MAX_AGE is refused (its mark may be gone).
        old = time.time() - MAX_AGE - 5
        assert await broker.transport.publish_once("hq", "old-batch", old, [b"x"]) == -1
        assert await broker.state.client.xlen(stream) == 4
    finally:
        await broker.close()


async def test_a_batch_too_old_to_publish_safely_is_dead_lettered(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    """A batch a relay could not publish for MAX_AGE seconds is refused by the queue's slot
    and dead-lettered through the store (reason ``expired``), not published."""
    broker = SpreadRedisBroker(redis_cluster.url(), cluster_ns)
    try:
        relay = broker.relay
        assert relay is not None
        keys = broker.state.keys
        header = f"77 {time.time() - MAX_AGE - 5:.6f}"  # taken long ago, never published
        await broker.state.client.rpush(keys.relay(relay.id), "hq", header, message("old", "hq"))
        await broker.state.client.zadd(keys.relays, {relay.id: time.time() + 60})
        assert await relay.drain(["hq"]) == 0
        assert await broker.state.client.xlen(broker.transport.keys.stream("hq")) == 0
        fields = await broker.get_dead_letter("old")
        assert fields is not None
        assert (fields.reason, fields.queue) == ("expired", "hq")
        assert await broker.state.client.exists(keys.relay(relay.id)) == 0  # released
    finally:
        await broker.close()


async def test_a_resharded_queue_slot_is_followed_mid_run(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    """A queue's own slot (its streams and hand-off marks) moves to another node while a
    worker drains 200 tasks, some of them delayed (relayed from the store's slot), and a
    producer adds more: every task succeeds once."""
    queue = Queue(redis_url=redis_cluster.url(), namespace=cluster_ns)
    keys = SpreadKeys(cluster_ns)

    @queue.task(name="sp.slow")
    async def slow(i: int) -> int:
        await asyncio.sleep(0.002)
        return i

    tag = keys.queue_tag("default")
    source = redis_cluster.owner(tag)
    target = next(p for p in redis_cluster.ports if p != source)
    with redis_cluster.node(source) as node:
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", tag))
    try:
        async with running(make_worker(queue, concurrency=4)):
            handles = [await slow.enqueue(i) for i in range(200)]
            handles += [await slow.options(delay=0.2).enqueue(200 + i) for i in range(20)]
            await eventually(
                lambda: handles[20].status(), lambda r: r is not None and r.state.is_final
            )
            moving = asyncio.get_running_loop().run_in_executor(
                None, migrate_slot, redis_cluster, slot, target
            )
            while not moving.done():  # produce while the keys move
                handles.append(await slow.enqueue(len(handles)))
            assert await moving > 0
            for _ in range(20):
                handles.append(await slow.enqueue(len(handles)))
            results = [await h.result(timeout=60) for h in handles]
        assert results == list(range(len(handles)))
        assert redis_cluster.owner(tag) == target
    finally:
        await queue.close()


async def test_a_delivery_is_handed_to_another_consumer_in_its_queue_slot(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    # Rolling deploys (worker/unknown.py): the handed set lives in the queue's own slot.
    name = spread_queues(redis_cluster, cluster_ns)[0]
    old, new = (Queue(redis_url=redis_cluster.url(), namespace=cluster_ns) for _ in range(2))
    try:
        await old.broker.prepare_consumer([name], "w-old")
        await new.broker.prepare_consumer([name], "w-new")
        await old.broker.publish(name, [message("handed")])
        [delivery] = await old.broker.fetch(name, 10, 0)
        assert delivery.token is not None
        assert await old.broker.transport.hand_over(name, delivery.token, "w-new", 60)
        [taken] = await new.broker.transport.take_handed(name, 10)
        assert (taken.token, taken.payload) == (delivery.token, delivery.payload)
        assert await new.broker.transport.take_handed(name, 10) == []
    finally:
        await old.close()
        await new.close()
