"""An idle worker's cost on a Redis Cluster's spread layout does not grow with its queues
(issue 25: "an idle worker costs the server <= 5 commands/s whatever the number of queues").

On a private local 3-primary cluster (its command counts are this test's alone), one worker
on 4 queues, then one on 64, each with default settings but short periods: a maintenance
round every 0.3 s (``visibility_timeout`` 0.9 s) and the doorbell's safety looks every 0.3 s
(``IDLE_BLOCK`` = ``REVISIT_GAP``, so both workers are in the regime where one look per gap
is made, whatever the number of queues). Once each settles into its idle wait, the
servers' commands (``INFO commandstats``, every node, commands run by scripts included) are
counted over a number of maintenance rounds (each registers the worker: its ``HSET``), in a
few windows one after the other, and the fewest commands per round of the 64-queue worker
are compared with the 4-queue worker's: a look at every queue per period (as before) makes
it several times as many; a flat cost about the same. Counting per round, not per second,
keeps the comparison fair on a loaded machine (both periods stretch alike), and the fewest
of a few windows leaves out the one-off work of a start (the first recovery round, before
the looks tell which queues are empty; the first sample of the dashboard's series, which
reads every level's depth once).

Then a task enqueued on the last of the 64 queues (the safety looks made hours apart, so
only its enqueue's ring can wake the worker in time) starts: awaited on an event.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from blitzq import Queue, Worker
from blitzq.broker.redis import doorbell
from tests.cluster_server import LocalCluster

from .proc_tasks import eventually, running

pytestmark = pytest.mark.timeout(300)

#: ``HSET`` calls (registrations: one or two a maintenance round) a window counts over.
ROUNDS = 12
#: Windows counted one after the other (the fewest commands per round is kept).
WINDOWS = 4
#: Commands our own reads make (left out of the counts).
PROBES = ("info", "config|resetstat", "hello", "client|setinfo", "ping")


@pytest.fixture(scope="module")
def private_cluster() -> Iterator[LocalCluster]:
    """A cluster of this module alone: no other test's commands in its counts."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("redis-server and redis-cli are needed to start a local Redis Cluster")
    cluster = LocalCluster(server, cli)
    try:
        if not cluster.start():
            pytest.fail("the local Redis Cluster did not start")
        yield cluster
    finally:
        cluster.stop()


def _calls(nodes: list[redis.Redis]) -> dict[str, int]:
    """Calls per command so far, summed over the primaries (our own reads left out)."""
    total: dict[str, int] = {}
    for node in nodes:
        for name, stats in node.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            if command not in PROBES:
                total[command] = total.get(command, 0) + int(stats["calls"])
    return total


@pytest.fixture
def namespaces(private_cluster: LocalCluster) -> Iterator[list[str]]:
    """Fresh namespaces on the cluster (append to it); their keys are deleted afterwards."""
    made: list[str] = []
    yield made
    with redis.RedisCluster.from_url(private_cluster.url()) as client:
        for ns in made:
            for pattern in ("{" + ns + "}:*", "{" + ns + ":q:*"):
                for key in client.scan_iter(match=pattern, target_nodes="all"):
                    client.delete(key)


def _settled(worker: Worker, queue: Queue, names: list[str]) -> bool:
    """Every queue's loop waits in the one shared read, on the armed doorbell."""
    fetcher = getattr(worker, "_fetcher", None)
    bell = queue.broker.transport.conn.doorbell
    return (
        fetcher is not None
        and sorted(fetcher.in_fetch()) == sorted(names)
        and bell is not None
        and bell.armed
        and bell.waiting
    )


@pytest.fixture
async def idle_workers(
    private_cluster: LocalCluster, namespaces: list[str]
) -> AsyncIterator[list[tuple[Queue, list[str]]]]:
    """Queues made by the test (``(queue, its worker's queue names)``), closed afterwards."""
    made: list[tuple[Queue, list[str]]] = []
    yield made
    for queue, _ in made:
        await queue.close()


async def _commands_per_round(
    cluster: LocalCluster, namespaces: list[str], made: list[tuple[Queue, list[str]]], n: int
) -> float:
    """Run an idle worker on ``n`` queues; the cluster's commands per maintenance round."""
    ns = "cost-" + uuid.uuid4().hex[:10]
    namespaces.append(ns)
    names = [f"c{i}" for i in range(n)]
    queue = Queue(names[0], redis_url=cluster.url(), namespace=ns, visibility_timeout=0.9)
    made.append((queue, names))
    worker = Worker(queue, queues=names)
    async with running(worker):

        async def settled() -> bool:
            return _settled(worker, queue, names)

        await eventually(settled, bool, timeout=120)
        nodes = [cluster.node(port) for port in cluster.ports]

        async def counted() -> dict[str, int]:
            return await asyncio.to_thread(_calls, nodes)

        rates = []
        try:
            for _ in range(WINDOWS):
                for node in nodes:
                    node.config_resetstat()
                calls = await eventually(counted, lambda c: c.get("hset", 0) >= ROUNDS, 120)
                rates.append(sum(calls.values()) / calls["hset"])
        finally:
            for node in nodes:
                node.close()
    return min(rates)


async def test_an_idle_workers_commands_per_round_do_not_grow_with_its_queues(
    private_cluster: LocalCluster,
    namespaces: list[str],
    idle_workers: list[tuple[Queue, list[str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doorbell, "IDLE_BLOCK", 0.3)
    monkeypatch.setattr(doorbell, "REVISIT_GAP", 0.3, raising=False)
    few = await _commands_per_round(private_cluster, namespaces, idle_workers, 4)
    many = await _commands_per_round(private_cluster, namespaces, idle_workers, 64)
    # A look at each queue per period costs 7 commands a queue: 64 queues about 450 a round
    # against some 30 for 4; a flat cost about the same on both.
    assert many < 3 * few, (few, many)


async def test_a_task_on_the_last_of_64_queues_wakes_an_idle_worker(
    private_cluster: LocalCluster, namespaces: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doorbell, "IDLE_BLOCK", 3600.0)
    monkeypatch.setattr(doorbell, "REVISIT_GAP", 3600.0, raising=False)
    monkeypatch.setattr(doorbell, "WATCH_TTL", 7200.0)
    ns = "wake-" + uuid.uuid4().hex[:10]
    namespaces.append(ns)
    names = [f"w{i}" for i in range(64)]
    url = private_cluster.url()
    served = Queue(names[0], redis_url=url, namespace=ns)
    producer = Queue(names[0], redis_url=url, namespace=ns)
    ran = asyncio.Event()
    for q in (served, producer):

        @q.task(name="idle.last")
        async def last() -> None:
            ran.set()

    worker = Worker(served, queues=names)  # default settings
    try:
        async with running(worker):

            async def settled() -> bool:
                return _settled(worker, served, names)

            await eventually(settled, bool, timeout=120)
            handle = await producer.tasks["idle.last"].options(queue=names[-1]).enqueue()
            await asyncio.wait_for(ran.wait(), 120)
            await handle.result(timeout=60)
    finally:
        await producer.close()
        await served.close()
