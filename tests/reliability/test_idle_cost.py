"""An idle worker on many queues holds few connections and still starts work at once (issue 25).

On a private ``redis-server`` (so ``CLIENT LIST`` counts this worker alone): a worker on 16
queues (each with its ``:high`` and ``:low`` levels, 48 streams or lists) at default settings
settles to at most 3 connections (its one shared blocking read, its event listener, one for
everything else), and a task enqueued on the 16th queue's high level then runs. Its commands
per second are measured in ``bench/idle_cost.py``, not here (no timed assertions).
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from blitzq import Queue, Worker
from blitzq.broker.redis import pool

from .conftest import PrivateRedis

QUEUES = [f"idle{i}" for i in range(16)]


@pytest.fixture
def quick_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pooled connections left unused 1 s are closed (30 s by default): the settling the
    test waits for comes sooner; what it counts is the same."""
    monkeypatch.setattr(pool, "IDLE_CLOSE", 1.0)


def others(client: redis.Redis) -> list[dict[str, str]]:
    """The connections of the server but ``client``'s own."""
    mine = client.client_id()
    return [c for c in client.client_list() if int(c["id"]) != mine]


def reads(worker: Worker) -> int:
    """Shared blocking reads the running worker sent so far (0 before its fetch starts)."""
    shared = getattr(getattr(worker, "_fetcher", None), "shared", None)
    return 0 if shared is None else int(shared.reads)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_an_idle_worker_on_16_queues_holds_3_connections_and_runs_the_16th(
    private_redis: PrivateRedis, quick_close: None, mode: str
) -> None:
    url = private_redis.url
    worker_queue = Queue("idle0", redis_url=url, namespace="idle", mode=mode)
    producer = Queue("idle0", redis_url=url, namespace="idle", mode=mode)
    ran = asyncio.Event()
    for q in (worker_queue, producer):

        @q.task(name="idle.mark", queue=QUEUES[-1])
        async def mark() -> None:
            ran.set()

    worker = Worker(worker_queue, queues=QUEUES)
    counter = redis.Redis.from_url(url)
    task = asyncio.create_task(worker.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        held = others(counter)
        # Settled: every fetch loop waits in the one shared read, the start-up's extra
        # connections are closed. Polled; the count is what is asserted.
        while loop.time() < deadline and (len(held) > 3 or reads(worker) < 3):
            assert not task.done(), task
            await asyncio.sleep(0.2)
            held = await asyncio.to_thread(others, counter)
        assert len(held) <= 3, [(c["cmd"], c["idle"]) for c in held]
        shared = worker._fetcher.shared
        assert shared is not None
        assert shared.reads >= 3
        # Every queue's loop is in the one read (none blocks on its own).
        assert sorted(worker._fetcher.in_fetch()) == sorted(QUEUES)

        handle = await producer.tasks["idle.mark"].options(priority="high").enqueue()
        assert handle.queue == QUEUES[-1] + ":high"
        await asyncio.wait_for(ran.wait(), 30)
        await handle.result(timeout=30)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
        await producer.close()
        await worker_queue.close()
        counter.close()
