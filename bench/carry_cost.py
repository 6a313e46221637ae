"""The worker's client cost of a reliable batch: completions and a look in two round trips
(reliable mode's look carrying the completions in one was measured with this script in
session 8 and dropped: bench/README.md); and of one ``EVALSHA`` through redis-py's
``execute_command`` or sent on the pool directly (``broker/redis/pool.py``, ``run_direct``).

Runs with whichever ``blitzq`` the interpreter imports (``PYTHONPATH=src``). Prints the CPU
time per step; for steady figures run it under ``valgrind --tool=callgrind`` with two
``STEPS`` and take the difference of the instruction counts over the difference of the
steps (start-up cancels).

argv: mode, STEPS. Modes: ``two`` (``broker.complete`` of the last batch, then
``fetch_first`` of 5: two round trips), ``redis-py`` and ``direct`` (one ``EVALSHA`` of a
script returning 1, 15 arguments, each way).
Env: ``BARS_REDIS_URL`` (a private server; the keys made are deleted).
"""

import asyncio
import os
import sys
import time
import uuid

from blitzq.broker import Completion
from blitzq.broker.redis import pool as redis_pool
from blitzq.broker.redis.reliable import ReliableRedisBroker

URL = os.environ["BARS_REDIS_URL"]
mode, steps = sys.argv[1], int(sys.argv[2])
BATCH = 5


async def batches() -> None:
    """``steps`` batches of ``BATCH`` tasks: complete the last, look for the next."""
    ns = "carry" + uuid.uuid4().hex[:8]
    broker = ReliableRedisBroker(URL, ns)
    await broker.prepare_consumer(["default"], "c1")
    total = (steps + 2) * BATCH
    for i in range(0, total, 500):
        await broker.publish("default", [b"x" * 60] * min(500, total - i))
    batch: list[Completion] = []

    async def step() -> None:
        nonlocal batch
        if batch:
            await broker.complete(batch)
        got = await broker.fetch_first(["default"], BATCH, 0)
        record = b"\x81\xa5state\x01"
        batch = [Completion("default", d.token, uuid.uuid4().hex, record, 60) for d in got]

    for _ in range(2):
        await step()
    cpu = time.process_time()
    for _ in range(steps):
        await step()
    print(mode, steps, round((time.process_time() - cpu) / steps * 1e6, 1), "us CPU a batch")
    client = broker.transport.client  # type: ignore[attr-defined]
    keys = [k async for k in client.scan_iter(match=f"{ns}*", count=5000)]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await broker.close()


async def scripts() -> None:
    """``steps`` calls of one ``EVALSHA``, through redis-py or on the pool directly."""
    from blitzq.broker.redis.client import make_client

    client = make_client(URL)
    sha = await client.script_load("return 1")
    args = ("EVALSHA", sha, 3, "a", "b", "c", "x", "y", 1, 2, 3, "z", "", "1", b"m" * 200)
    pool = redis_pool.direct_pool(client, "EVALSHA")
    assert pool is not None
    cpu = time.process_time()
    for _ in range(steps):
        if mode == "direct":
            await redis_pool.run_direct(pool, args)
        else:
            await client.execute_command(*args)
    print(mode, steps, round((time.process_time() - cpu) / steps * 1e6, 1), "us CPU a call")
    await client.aclose()


asyncio.run(batches() if mode == "two" else scripts())
