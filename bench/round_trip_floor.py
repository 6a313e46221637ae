"""The round trip's floor: what two Python processes and one Redis need for "enqueue, run
elsewhere, get the result", with no queue library. Prints p50/p99 in ms as JSON, like
``round_trip_one.py``, so ``bench/targets.py`` runs the two side by side.

The producer writes ``XADD`` and ``BLPOP`` (its reply key) in one pipeline: one write, then
it sleeps until the reply comes. The worker blocks in ``XREADGROUP``, and on each entry
writes ``LPUSH`` (the reply) with ``XACK`` in one pipeline. Four hand-overs between
processes per trip (producer -> Redis -> worker -> Redis -> producer) and nothing else:
every queue that runs the task in another process pays at least these. Plain
``redis.asyncio`` clients (hiredis), no timeouts beyond redis-py's defaults.

argv: ``N`` (300), ``WARMUP`` (30). Env: ``BARS_REDIS_URL``; ``FLOOR_KEY`` (set for the worker
child). The worker child is stopped with SIGTERM; its keys are deleted at the end. Also
prints the CPU time per trip of the producer and of the worker child, as
``round_trip_one.py`` does (``producer_cpu_us``, ``worker_cpu_us``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import redis.asyncio as aioredis

URL = os.environ["BARS_REDIS_URL"]
PREFIX = os.environ.get("FLOOR_KEY") or "floor" + os.urandom(4).hex()
STREAM, GROUP = f"{PREFIX}:s", "g"


async def work() -> None:
    """The worker child: answer every entry until SIGTERM."""
    client = aioredis.Redis.from_url(URL)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with contextlib.suppress(aioredis.ResponseError):  # the group exists already
        await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    while not stop.is_set():
        reply = await client.xreadgroup(GROUP, "c", {STREAM: ">"}, count=10, block=200)
        for _stream, entries in reply or []:
            pipe = client.pipeline(transaction=False)
            for entry_id, fields in entries:
                pipe.lpush(f"{PREFIX}:r:".encode() + fields[b"id"], b"1")
                pipe.xack(STREAM, GROUP, entry_id)
            await pipe.execute()
    await client.aclose()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (``/proc/<pid>/stat``), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def produce(n: int, warmup: int) -> None:
    """Start the worker child, time ``n`` sequential trips after ``warmup`` ones."""
    client = aioredis.Redis.from_url(URL)
    with contextlib.suppress(aioredis.ResponseError):
        await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    child = subprocess.Popen(
        [sys.executable, __file__, "worker"], env=dict(os.environ, FLOOR_KEY=PREFIX)
    )
    try:
        await asyncio.sleep(1.0)  # the worker's connection
        samples = []
        cpu0 = (0.0, 0.0)
        for i in range(n + warmup):
            if i == warmup:
                cpu0 = (time.process_time(), cpu_seconds(child.pid))
            trip_id = os.urandom(16).hex().encode()
            t0 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            pipe.xadd(STREAM, {"id": trip_id})
            pipe.blpop([f"{PREFIX}:r:".encode() + trip_id], timeout=10)
            _, got = await pipe.execute()
            elapsed = time.perf_counter() - t0
            if got is None:
                raise RuntimeError("no reply within 10 s")
            if i >= warmup:
                samples.append(elapsed * 1000)
        producer_cpu, worker_cpu = time.process_time() - cpu0[0], cpu_seconds(child.pid) - cpu0[1]
        samples.sort()
        print(
            json.dumps(
                {
                    "p50_ms": round(statistics.median(samples), 4),
                    "p99_ms": round(samples[max(0, int(len(samples) * 0.99) - 1)], 4),
                    "producer_cpu_us": round(producer_cpu / n * 1e6, 1),
                    "worker_cpu_us": round(worker_cpu / n * 1e6, 1),
                }
            )
        )
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=15)
        await client.delete(STREAM)
        await client.aclose()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(work())
    else:
        asyncio.run(
            produce(
                int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                int(sys.argv[2]) if len(sys.argv) > 2 else 30,
            )
        )
