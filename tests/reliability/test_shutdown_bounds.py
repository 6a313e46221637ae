"""``shutdown_timeout`` bounds a graceful stop even when the server stops answering.

The test's own ``redis-server`` is frozen with SIGSTOP while an in-process worker is blocked
in its fetch; the worker must still stop: the fetch in flight is cancelled ``block_timeout +
FETCH_GRACE`` after the stop, and unregistering gives up after ``FETCH_GRACE``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from blitzq import Queue, Worker
from blitzq.worker.shutdown import FETCH_GRACE

from .conftest import PrivateRedis


async def test_stop_returns_while_the_server_is_frozen(
    private_redis: PrivateRedis, namespace: str
) -> None:
    queue = Queue(redis_url=private_redis.url, namespace=namespace)

    @queue.task(name="b.noop")
    async def noop() -> None:
        return None

    worker = Worker(queue, concurrency=2, block_timeout=0.5, shutdown_timeout=0.5)
    task = asyncio.create_task(worker.run())
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    try:
        deadline = time.monotonic() + 20
        while worker.id not in await queue.broker.workers():
            assert time.monotonic() < deadline, "the worker did not register"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # the fetch loop is inside its blocking read
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            worker.stop()
            # Bound: fetch (0.5 + FETCH_GRACE) + unregister (FETCH_GRACE) + a loaded machine.
            await asyncio.wait_for(asyncio.shield(task), 2 * FETCH_GRACE + 15.0)
            print(f"stopped {time.monotonic() - stopped:.2f} s after stop() on a frozen server")
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        if not task.done():
            task.cancel()
        await queue.close()
