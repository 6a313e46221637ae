"""One drain of N pre-enqueued tasks whose body does one Redis ``INCR``, with one in-process
``Worker(concurrency=C)``, printing tasks/s as JSON (issue 13's concurrency-10 target).

Runs with whichever ``blitzq`` the interpreter imports (this checkout, or blitzq 1.1.0 in the
venv ``../shared/bench-anchor/compare.sh`` makes), so the same script measures both; only the
API the two share is used. The clock runs from ``worker.run()`` until the last task body has
run (blitzq 1.1.0 offers no way to see its completions written); every body's ``INCR`` is
checked against ``N`` at the end; the process's CPU time over the same span is printed per
task beside the rate (steadier than the rate on a loaded machine). Results are stored (both
libraries' default) unless argv[4] is ``0``.

argv: mode (reliable|fast|bare), N, concurrency[, store (1|0)]. ``bare``: no queue, the
same N INCRs made by ``concurrency`` coroutines on one client (the body's own ceiling).
Env: ``BARS_REDIS_URL`` (the private server).
"""

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid

import redis.asyncio as aioredis

from blitzq import Queue, Worker

mode, n, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = len(sys.argv) < 5 or sys.argv[4] == "1"
URL = os.environ["BARS_REDIS_URL"]
NS = "incr" + uuid.uuid4().hex[:8]
COUNTER = f"{NS}:counter"
queue = Queue(
    name="default",
    redis_url=URL,
    namespace=NS,
    mode="reliable" if mode == "bare" else mode,
    store_results=store,
)
client = aioredis.Redis.from_url(URL)
done = 0
finished = asyncio.Event()


@queue.task
async def bump() -> None:
    global done
    await client.incr(COUNTER)
    done += 1
    if done == n:
        finished.set()


async def bare() -> None:
    """The reference without a queue: ``conc`` coroutines sharing ``n`` INCRs on one client."""
    await client.ping()
    left = [n]

    async def loop() -> None:
        while left[0] > 0:
            left[0] -= 1
            await client.incr(COUNTER)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(conc)))
    elapsed = time.perf_counter() - t0
    await client.delete(COUNTER)
    await client.aclose()
    print(json.dumps({"mode": "bare", "n": n, "drain_per_s": round(n / elapsed)}))


async def main() -> None:
    for i in range(0, n, 1000):
        await bump.enqueue_many([() for _ in range(min(1000, n - i))])
    await client.ping()  # the body's client connected before the clock starts
    worker = Worker(queue, concurrency=conc)
    task = asyncio.create_task(worker.run())
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.wait_for(finished.wait(), timeout=120)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stopped = worker.stop() if hasattr(worker, "stop") else task.cancel()
    if asyncio.iscoroutine(stopped):
        await stopped
    with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
        await asyncio.wait_for(task, timeout=30)
    count = int(await client.get(COUNTER) or 0)
    keys = [k async for k in client.scan_iter(match=f"*{NS}*", count=5000)]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await client.aclose()
    if count != n:
        raise SystemExit(f"{count} INCRs for {n} tasks")
    rate, cpu_us = round(n / elapsed), round(cpu / n * 1e6, 2)
    print(json.dumps({"mode": mode, "n": n, "drain_per_s": rate, "cpu_us_per_task": cpu_us}))


asyncio.run(bare() if mode == "bare" else main())
