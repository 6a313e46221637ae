"""One round-trip measurement: enqueue a no-op task, a worker in a second process runs it, the
producer awaits its result; ``N`` times after warm-up trips. Prints p50/p99 in ms as JSON.

Uses only the API blitzq 1.1.0 shares with this tree (``Queue(name=, redis_url=,
namespace=)``, ``queue.task``, ``Worker(queue, concurrency=)``, ``task.enqueue()``,
``handle.result(timeout=)``), so ``bench/targets.py`` runs this same file under this tree and
under the blitzq 1.1.0 venv, alternately. argv: ``N`` (300), ``WARMUP`` (30). Env:
``BARS_REDIS_URL`` (the server), ``RT_NS`` (set for the worker child: the producer's
namespace). The worker child is started with this interpreter and stopped with SIGTERM; the
namespace's keys are deleted at the end. Beside p50/p99 it prints the CPU time (user +
system) per trip of the producer (this process) and of the worker child (its ``/proc``
times), over the timed trips: ``producer_cpu_us``, ``worker_cpu_us``.
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

from blitzq import Queue, Worker

URL = os.environ["BARS_REDIS_URL"]
NAMESPACE = os.environ.get("RT_NS") or "rt" + os.urandom(4).hex()
queue = Queue(name="default", redis_url=URL, namespace=NAMESPACE)


@queue.task
async def noop() -> int:
    """The measured task: returns at once."""
    return 1


async def work() -> None:
    """The worker child: run a worker until SIGTERM."""
    worker = Worker(queue, concurrency=10)
    runner = asyncio.create_task(worker.run())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    stopped = worker.stop()
    if asyncio.iscoroutine(stopped):
        await stopped
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(runner, timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (``/proc/<pid>/stat``), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def produce(n: int, warmup: int) -> None:
    """Start the worker child, time ``n`` sequential trips after ``warmup`` ones."""
    child = subprocess.Popen(
        [sys.executable, __file__, "worker"], env=dict(os.environ, RT_NS=NAMESPACE)
    )
    try:
        await asyncio.sleep(1.0)  # the worker's connections and consumer group
        samples = []
        cpu0 = (0.0, 0.0)
        for i in range(n + warmup):
            if i == warmup:
                cpu0 = (time.process_time(), cpu_seconds(child.pid))
            t0 = time.perf_counter()
            handle = await noop.enqueue()
            await handle.result(timeout=10)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
        producer_cpu, worker_cpu = time.process_time() - cpu0[0], cpu_seconds(child.pid) - cpu0[1]
        samples.sort()
        p99 = samples[max(0, int(len(samples) * 0.99) - 1)]
        figures = {"p50_ms": round(statistics.median(samples), 4), "p99_ms": round(p99, 4)}
        figures["producer_cpu_us"] = round(producer_cpu / n * 1e6, 1)
        figures["worker_cpu_us"] = round(worker_cpu / n * 1e6, 1)
        print(json.dumps(figures))
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=15)
        import redis

        client = redis.Redis.from_url(URL)
        for key in client.scan_iter(f"*{NAMESPACE}*"):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(work())
    else:
        count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
        asyncio.run(produce(count, int(sys.argv[2]) if len(sys.argv) > 2 else 30))
