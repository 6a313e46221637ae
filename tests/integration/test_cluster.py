"""blitzq on a Redis Cluster (the session's local 3-primary cluster, ``redis_cluster``).

- A Queue given the plain ``redis://`` URL (``?layout=slot``) of a node that does not own
  the namespace's slot detects cluster mode and runs tasks end to end: results, a delayed
  task, a retry, a chord, progress pushed over pub/sub, a cancel announced on the events
  channel.
- Worker processes SIGKILLed mid-run on a cluster (``redis+cluster://`` URL) lose no task,
  on the spread layout (the default) and the one-slot layout (``?layout=slot``).
- A script sent while its slot migrates is refused before its first write and waits: it
  runs wholly on the new owner once the migration ends.
- The namespace's slot is migrated to another node mid-run (``SETSLOT MIGRATING/IMPORTING``,
  ``MIGRATE`` key by key, ``SETSLOT NODE``, as ``redis-cli --cluster reshard`` does): the
  clients follow ``ASK`` and ``MOVED`` and no task is lost.
"""

from __future__ import annotations

import asyncio
import random
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError

from blitzq import Queue, RetryPolicy, TaskState, chord, current_task
from blitzq.broker.factory import resolve_url
from blitzq.broker.redis import ReliableRedisBroker
from blitzq.broker.redis.client import broker_error
from blitzq.broker.redis.cluster import plain_url, wants_cluster
from blitzq.exceptions import ConfigurationError
from tests.cluster_server import LocalCluster, SlotMigration, migrate_slot
from tests.polling import wait_until
from tests.reliability.conftest import Harness
from tests.reliability.reliability_app import WORK

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster_ns(redis_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace on the cluster; its keys are deleted afterwards (on every node)."""
    ns = "cl-" + uuid.uuid4().hex[:12]
    yield ns
    with redis.RedisCluster.from_url(redis_cluster.url()) as client:
        for pattern in ("{" + ns + "}:*", "{" + ns + ":q:*"):  # the spread layout's queues
            for key in client.scan_iter(match=pattern, target_nodes="all"):
                client.delete(key)


def elsewhere(cluster: LocalCluster, ns: str) -> int:
    """Port of a node that does NOT own the namespace's slot."""
    owner = cluster.owner("{" + ns + "}:")
    return next(p for p in cluster.ports if p != owner)


@pytest.fixture
async def queue(redis_cluster: LocalCluster, cluster_ns: str) -> AsyncIterator[Queue]:
    """A reliable-mode Queue on the one-slot layout (``?layout=slot``) through a node that
    does not own the namespace's slot."""
    url = redis_cluster.url(elsewhere(redis_cluster, cluster_ns)) + "?layout=slot"
    q = Queue(redis_url=url, namespace=cluster_ns)
    yield q
    await q.close()


def test_cluster_urls_are_told_apart(redis_cluster: LocalCluster, redis_url: str) -> None:
    assert wants_cluster(redis_cluster.url())
    assert wants_cluster("redis+cluster://127.0.0.1:1/0")  # named: no probe
    assert not wants_cluster(redis_url)  # the single test server
    assert not wants_cluster("unix:///nonexistent.sock")
    assert plain_url("rediss+cluster://u:p@h:7000/0") == "rediss://u:p@h:7000/0"
    assert resolve_url("redis+cluster://h:7000/0") == "redis+cluster://h:7000/0"
    # Errors a slot migration or a failover raises are transient; a refused command is not.
    assert broker_error(TryAgainError("TRYAGAIN")).transient
    assert broker_error(ClusterError("TTL exhausted.")).transient
    assert not broker_error(RedisClusterException("keys in request don't hash")).transient
    with pytest.raises(ConfigurationError, match="database"):
        ReliableRedisBroker(redis_cluster.url().replace("/0", "/3"), "x")
    with pytest.raises(ConfigurationError, match="timeout"):
        ReliableRedisBroker(redis_cluster.url() + "?timeout=0", "x")


async def test_load_waits_for_a_connection_on_a_cluster(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    """50 enqueues at once through a client allowed 2 commands in flight all succeed (the
    callers past 2 wait their turn, as on a single server)."""
    url = redis_cluster.url() + "?max_connections=2&timeout=20"
    queue = Queue(redis_url=url, namespace=cluster_ns)
    try:

        @queue.task(name="c.nothing")
        async def nothing() -> None:
            return None

        handles = await asyncio.gather(*(nothing.enqueue() for _ in range(50)))
        assert len({h.id for h in handles}) == 50
        assert queue.broker.transport.client.max_connections == 2  # type: ignore[attr-defined]
    finally:
        await queue.close()


async def test_a_worker_runs_through_a_node_that_does_not_own_the_namespace(
    queue: Queue, redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    runs: dict[str, int] = {}

    @queue.task(name="c.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="c.total")
    async def total(values: list[int]) -> int:
        return sum(values)

    @queue.task(name="c.flaky", retries=2, retry_policy=RetryPolicy(base=0.05, jitter="none"))
    async def flaky() -> str:
        runs["flaky"] = runs.get("flaky", 0) + 1
        if runs["flaky"] == 1:
            raise RuntimeError("first run fails")
        return "ok"

    @queue.task(name="c.report")
    async def report(gate: str) -> int:
        current_task().update_progress(1, 2, "half")
        while not await queue.broker.get_record(gate):  # the test reads progress first
            await asyncio.sleep(0.02)
        return 2

    broker: Any = queue.broker
    assert isinstance(broker.transport.client, RedisCluster)
    async with running(make_worker(queue, concurrency=8)):
        handles = [await add.enqueue(i, i) for i in range(20)]
        delayed = await add.options(delay=0.3).enqueue(100, 1)
        retried = await flaky.enqueue()
        joined = await queue.apply(chord([add.s(i, 1) for i in range(5)], total.s()))
        reporting = await report.enqueue("gate-" + cluster_ns)
        progress = await eventually(lambda: queue.get_progress(reporting.id), bool, 30.0)
        assert progress is not None
        assert progress.current == 1
        await queue.broker.set_record("gate-" + cluster_ns, b"1", 60)
        cancelled = await add.options(delay=600).enqueue(0, 0)
        await cancelled.cancel()
        assert [await h.result(timeout=30) for h in handles] == [2 * i for i in range(20)]
        assert await delayed.result(timeout=30) == 101
        assert await retried.result(timeout=30) == "ok"
        assert await joined.get(timeout=30) == sum(i + 1 for i in range(5))
        assert await reporting.result(timeout=30) == 2
    assert runs["flaky"] == 2
    record = await cancelled.status()
    assert record is not None
    assert record.state is TaskState.CANCELLED
    # Every key of the namespace is on the slot's owner, none on the node of the URL.
    owner = redis_cluster.owner("{" + cluster_ns + "}:")
    for port in redis_cluster.ports:
        with redis_cluster.node(port) as node:
            found = list(node.scan_iter(match="{" + cluster_ns + "}:*"))
        assert bool(found) == (port == owner), port


@pytest.mark.parametrize("layout", ["spread", "slot"])
def test_sigkilled_workers_on_a_cluster_lose_no_task(
    redis_cluster: LocalCluster, cluster_ns: str, tmp_path: Path, layout: str
) -> None:
    """The reliability suite's crash pattern on the cluster, on each layout: 120 tasks in two
    halves, two workers, one SIGKILLed mid-task after each half is enqueued; every task
    succeeds, the interrupted ones ran again."""
    port = elsewhere(redis_cluster, cluster_ns)
    harness = Harness(f"redis+cluster://127.0.0.1:{port}/0", cluster_ns, tmp_path)
    harness.worker_url = f"redis+cluster://127.0.0.1:{port}/0?layout={layout}"
    try:
        queue = harness.queue(vt=1.5)
        rng = random.Random(11)
        labels = [f"k{i}" for i in range(120)]
        workers = [harness.spawn(concurrency=3, vt=1.5) for _ in range(2)]
        interrupted: list[str] = []
        for batch in (labels[:60], labels[60:]):
            # Each kill's half is enqueued before it: on a busy machine the first half may
            # be done before the second victim is looked at.
            harness.enqueue(queue, WORK, [(label, rng.uniform(0.02, 0.15)) for label in batch])
            victim = workers[0]
            wait_until(lambda v=victim: harness.in_flight(v.pid), 30.0, "a busy victim")
            assert victim.kill() == -signal.SIGKILL
            # Started by the victim and never returned: killed mid-run (read before the
            # visibility timeout lets another worker start them again).
            interrupted += harness.in_flight(victim.pid)
            workers = [*workers[1:], harness.spawn(concurrency=3, vt=1.5)]
        wait_until(lambda: harness.all_final(labels), 60.0, "every task final")
        states = harness.states(labels)
        assert all(r is not None and r.state is TaskState.SUCCEEDED for r in states.values())
        runs = harness.runs()
        assert interrupted
        assert all(runs[label] >= 2 for label in interrupted), (interrupted, runs)
    except BaseException:
        print(harness.logs())
        raise
    finally:
        harness.close()


async def test_a_resharded_namespace_slot_is_followed_mid_run(
    queue: Queue, redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    """The namespace's slot moves to another node while a worker drains 300 tasks and a
    producer adds more: every task succeeds once the move is over."""

    @queue.task(name="c.slow")
    async def slow(i: int) -> int:
        await asyncio.sleep(0.002)
        return i

    prefix = "{" + cluster_ns + "}:"
    source = redis_cluster.owner(prefix)
    target = next(p for p in redis_cluster.ports if p != source)
    with redis_cluster.node(source) as node:
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", prefix))
    async with running(make_worker(queue, concurrency=4)):
        handles = [await slow.enqueue(i) for i in range(300)]
        await eventually(lambda: handles[20].status(), lambda r: r is not None and r.state.is_final)
        moving = asyncio.get_running_loop().run_in_executor(
            None, migrate_slot, redis_cluster, slot, target
        )
        while not moving.done():  # produce while the keys move
            handles.append(await slow.enqueue(len(handles)))
        moved = await moving
        assert moved > 0
        for _ in range(20):
            handles.append(await slow.enqueue(len(handles)))
        results = [await h.result(timeout=60) for h in handles]
    assert results == list(range(len(handles)))
    assert redis_cluster.owner(prefix) == target


def failed_scripts(cluster: LocalCluster, port: int) -> int:
    """EVALSHA calls the node on ``port`` failed or rejected so far."""
    with cluster.node(port) as node:
        stats = node.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("failed_calls", 0)) + int(stats.get("rejected_calls", 0))


async def test_a_script_waits_for_its_slot_migration_to_end(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    """Sent while the slot is MIGRATING, the publish script is refused on the source before
    it writes anything, waits, and runs once on the target after the migration."""
    prefix = "{" + cluster_ns + "}:"
    stream = prefix + "s:q"
    broker = ReliableRedisBroker(redis_cluster.url(), cluster_ns)
    loop = asyncio.get_running_loop()
    try:
        await broker.publish("q", [b"first"])  # the stream exists, on the source
        source = redis_cluster.owner(prefix)
        target = next(p for p in redis_cluster.ports if p != source)
        with redis_cluster.node(source) as node:
            slot = int(node.execute_command("CLUSTER", "KEYSLOT", prefix))
        migration = SlotMigration(redis_cluster, slot, target)
        refused_before = failed_scripts(redis_cluster, source)
        migration.begin()
        try:
            publishing = asyncio.ensure_future(broker.publish("q", [b"a", b"b"]))
            await eventually(
                lambda: loop.run_in_executor(None, failed_scripts, redis_cluster, source),
                lambda n: n > refused_before,
            )
            assert not publishing.done()
            with redis_cluster.node(source) as node:
                assert node.xlen(stream) == 1  # nothing half-written on the source
        finally:
            await loop.run_in_executor(None, migration.move_keys)
            await loop.run_in_executor(None, migration.end)
        await asyncio.wait_for(publishing, 30)
        with redis_cluster.node(target) as node:
            assert node.xlen(stream) == 3
    finally:
        await broker.close()


async def test_an_evicting_primary_that_does_not_own_the_namespace_is_found(
    redis_cluster: LocalCluster, queue: Queue, cluster_ns: str
) -> None:
    """The memory policy of a cluster is every primary's: a queue's slot (the spread
    layout's homes) may live on a primary that does not own the namespace, and one that can
    evict is what `blitzq check` and a worker's start must see (tester finding: `check`
    read the namespace's primary alone and answered ok)."""
    namespace_owner = redis_cluster.owner("{" + cluster_ns + "}:")
    other = next(p for p in redis_cluster.primaries() if p != namespace_owner)
    await queue.broker.ping()  # connected, as `blitzq check` and a worker are first
    assert await queue.broker.memory_policy() == ("noeviction", 0)
    with redis_cluster.node(other) as node:
        node.config_set("maxmemory", str(1 << 30))
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            assert await queue.broker.memory_policy() == ("allkeys-lru", 1 << 30)
        finally:
            node.config_set("maxmemory-policy", "noeviction")
            node.config_set("maxmemory", "0")
    assert await queue.broker.memory_policy() == ("noeviction", 0)
