"""A completion that meets a failover is retried until applied, never turned into a failure.

Issue 25, item 3: on a Redis Cluster a SIGKILL of the state node's primary left a task whose
body had succeeded marked ``failed`` ("the broker refused this task's completion:
ClusterDownError"): the flusher took an error for a refusal because another node answered PING.
Here a private ``redis-server`` is demoted while a task runs (``REPLICAOF`` a master that does
not exist: every write is answered ``READONLY``, PING still answers, as a primary demoted by a
Sentinel failover), the task ends, and its completion is held and retried; once the server is
promoted again (``REPLICAOF NO ONE``) the completion is applied: the record is ``succeeded``,
the body ran once, nothing was recorded as failed.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from blitzq import Queue, Worker
from tests.conftest import free_port

from .conftest import PrivateRedis


def role(client: redis.Redis) -> str:
    """The server's replication role (``master`` or ``slave``)."""
    return str(client.info("replication")["role"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_completion_refused_readonly_is_retried_until_the_server_takes_it(
    private_redis: PrivateRedis, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blitzq")
    queue = Queue("fo", redis_url=private_redis.url, namespace="fo", mode=mode)
    gate = asyncio.Event()
    runs: list[int] = []

    @queue.task(name="fo.body")
    async def body(x: int) -> int:
        runs.append(x)
        await gate.wait()
        return x * 2

    admin = redis.Redis.from_url(private_redis.url)
    worker = Worker(queue, block_timeout=0.2)
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    try:
        handle = await body.enqueue(21)
        deadline = loop.time() + 60
        while not runs:
            assert loop.time() < deadline, "the task did not start"
            assert not task.done(), task
            await asyncio.sleep(0.02)
        # Demoted: every write is refused with READONLY, PING answers.
        await asyncio.to_thread(admin.replicaof, "127.0.0.1", free_port())
        assert await asyncio.to_thread(role, admin) == "slave"
        gate.set()
        flusher = worker._flusher
        # The completion is held and retried (the flusher pauses the fetches meanwhile).
        while not (flusher.backlog and not flusher.writable.is_set()):
            assert loop.time() < deadline, "the completion was not held for a retry"
            await asyncio.sleep(0.02)
        await asyncio.to_thread(admin.replicaof, "NO", "ONE")
        assert await handle.result(timeout=60) == 42
        record = await handle.status()
        assert record is not None
        assert record.state == "succeeded"
        assert runs == [21]
        assert worker.failed == 0
        assert worker.stale_completions == 0
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert not refused, [r.getMessage() for r in refused]
    finally:
        gate.set()
        if role(admin) != "master":
            admin.replicaof("NO", "ONE")
        worker.stop()
        await asyncio.wait_for(task, 60)
        await queue.close()
        admin.close()
