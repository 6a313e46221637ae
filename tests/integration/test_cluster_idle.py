"""An idle worker on a Redis Cluster is woken by its queues' doorbell (issue 25: idle is nearly
free, however many queues).

On the session's local 3-primary cluster (``redis_cluster``), a worker on 16 queues settles
into one wait for all of them. In reliable mode (spread layout: each queue in a slot of its
own, so no one command can block on all of them) it waits on its doorbell
(``broker/redis/doorbell.py``), and the idle block is made far longer than the test's timeout,
so a task can only start because its enqueue announced it; in fast mode every list is in the
namespace's slot and one ``BLMPOP`` on that node covers them (``blocking.NodePool``). A task
enqueued on each of the 16 queues in turn (a level of each), and one delayed task (moved by
the promoter; on the spread layout handed to its queue by the relay), each runs. Commands
and connections per node are measured in ``bench/idle_cost.py``, not here (no timed
assertions).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis

from blitzq import Queue, Worker
from blitzq.broker.redis import doorbell
from tests.cluster_server import LocalCluster

from .proc_tasks import eventually, running

pytestmark = pytest.mark.timeout(180)

QUEUES = [f"idle{i}" for i in range(16)]


@pytest.fixture
def cluster_ns(redis_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace on the cluster; its keys (the queues' too) are deleted afterwards."""
    ns = "idle-" + uuid.uuid4().hex[:12]
    yield ns
    with redis.RedisCluster.from_url(redis_cluster.url()) as client:
        for pattern in ("{" + ns + "}:*", "{" + ns + ":q:*"):
            for key in client.scan_iter(match=pattern, target_nodes="all"):
                client.delete(key)


@pytest.fixture
def long_idle_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle wait that outlasts the test: only a ring can end it in time."""
    monkeypatch.setattr(doorbell, "IDLE_BLOCK", 3600.0)
    monkeypatch.setattr(doorbell, "WATCH_TTL", 7200.0)


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_task_on_any_of_16_queues_wakes_an_idle_worker_on_a_cluster(
    redis_cluster: LocalCluster, cluster_ns: str, long_idle_block: None, mode: str
) -> None:
    url = redis_cluster.url()
    served = Queue(QUEUES[0], redis_url=url, namespace=cluster_ns, mode=mode)
    producer = Queue(QUEUES[0], redis_url=url, namespace=cluster_ns, mode=mode)
    ran: dict[str, asyncio.Event] = {q: asyncio.Event() for q in QUEUES}
    for q in (served, producer):

        @q.task(name="idle.mark")
        async def mark(name: str) -> None:
            ran[name].set()

    worker = Worker(served, queues=QUEUES)  # default settings (block_timeout 1 s)
    conn = served.broker.transport.conn
    bell, blocking = conn.doorbell, conn.blocking
    assert served.broker.transport.shared_block

    async def settled() -> bool:
        """Every queue's loop waits in the one shared read: reliable mode's waits on the
        doorbell (the event listener subscribed), fast mode's is one BLMPOP on the node of
        the namespace's slot."""
        fetcher = getattr(worker, "_fetcher", None)
        if fetcher is None or sorted(fetcher.in_fetch()) != sorted(QUEUES):
            return False
        if mode == "fast":
            return blocking is not None and blocking._blocked
        return bell is not None and bell.armed and bell.waiting

    async with running(worker):
        for i, q in enumerate(QUEUES):
            await eventually(settled, bool, timeout=60)
            level = ("high", "normal", "low")[i % 3]
            task = producer.tasks["idle.mark"].options(queue=q, priority=level)
            handle = await task.enqueue(q)
            await asyncio.wait_for(ran[q].wait(), 60)
            await handle.result(timeout=60)
        # A delayed task reaches its queue through the promoter and the relay's hand-off,
        # which announces it too.
        await eventually(settled, bool, timeout=60)
        ran[QUEUES[5]].clear()
        delayed = (
            await producer.tasks["idle.mark"].options(queue=QUEUES[5], delay=0.2).enqueue(QUEUES[5])
        )
        await asyncio.wait_for(ran[QUEUES[5]].wait(), 60)
        await delayed.result(timeout=60)
    await producer.close()
    await served.close()
