"""One drain of N no-op tasks (reliable mode, results stored) with the blitzq the interpreter
imports, printing tasks/s and process CPU microseconds per task; ``METRICS=1`` turns the
worker's Prometheus metrics on. Run it alternately with ``PYTHONPATH=<tree>/src`` for the
round-1 tree (0ee3fda, which has no metrics) and this one, to pair them in one run
(bench/README.md, "Metrics cost").
"""

import asyncio
import os
import time
import uuid

from blitzq import Queue, Worker

N = int(os.environ.get("N", "20000"))
METRICS = os.environ.get("METRICS") == "1"


async def main() -> None:
    ns = "pair-" + uuid.uuid4().hex[:8]
    q = Queue(redis_url="redis://127.0.0.1:6379/0", namespace=ns)

    @q.task(name="noop")
    async def noop() -> None:
        return None

    for start in range(0, N, 1000):
        await noop.enqueue_many([() for _ in range(min(1000, N - start))])
    kw = {"metrics_port": 0, "ops_host": "127.0.0.1"} if METRICS else {}
    w = Worker(q, concurrency=100, block_timeout=0.05, **kw)
    t0 = time.perf_counter()
    c0 = time.process_time()
    task = asyncio.create_task(w.run())
    while w.processed < N:
        await asyncio.sleep(0.005)
    t1 = time.perf_counter()
    c1 = time.process_time()
    w.stop()
    await task
    r = q.broker  # this tree: broker.state.client; round 1: broker.client
    client = r.state.client if hasattr(r, "state") else r.client
    keys = [k async for k in client.scan_iter(match="{" + ns + "}*")]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await q.close()
    print(f"{N / (t1 - t0):.0f} {1e6 * (c1 - c0) / N:.2f}")


asyncio.run(main())
