"""What a worker's durable fetches and completions cost on ``redis+sentinel://`` (issue 25).

Starts a private primary, one replica and one sentinel (free ports, stopped at the end), then
drains N pre-enqueued no-op tasks (results stored) with one in-process ``Worker``, in rounds
that alternate two settings in the same process:

- ``durable``: what a worker does now: each fetch and each completion batch is followed by
  ``WAIT`` for the replicas that exist (``broker/redis/sentinel.py``);
- ``unwaited``: the same code with :meth:`ReplicatedRedis.wanted` answering 0 (no ``WAIT``):
  the worker of before the fix, which a failover could leave with tasks that ran and no record.

Prints each round's tasks/s and the worker process's CPU per task, then the ratio
durable/unwaited of the medians (the figure bench/README.md quotes: side by side, one run).

argv: N (default 3000), concurrency (default 50), rounds per setting (default 3).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from blitzq import Queue, Worker
from blitzq.broker.redis.sentinel import ReplicatedRedis

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
CONCURRENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 50
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
SERVICE = "benchsentinel"
QUIET = subprocess.DEVNULL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def answers(call: Any) -> Any:
    try:
        return call()
    except (redis.RedisError, OSError):
        return None


def start(directory: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    primary, replica, sentinel = free_port(), free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    procs = [
        subprocess.Popen(["redis-server", "--port", str(primary), *common], stdout=QUIET),
        subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(replica),
                *common,
                "--replicaof",
                "127.0.0.1",
                str(primary),
            ],
            stdout=QUIET,
        ),
    ]
    link = redis.Redis(port=replica)
    wait_for(
        lambda: (answers(lambda: link.info("replication")) or {}).get("master_link_status") == "up",
        "the replica in sync",
    )
    conf = directory / "sentinel.conf"
    conf.write_text(
        f"port {sentinel}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n"
    )
    procs.append(subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=QUIET))
    ask = redis.Redis(port=sentinel)
    wait_for(lambda: answers(lambda: ask.sentinel_masters()), "the sentinel")
    return procs, f"redis+sentinel://127.0.0.1:{sentinel}/{SERVICE}"


async def drain(url: str) -> tuple[float, float]:
    """One drain of N no-op tasks; (tasks/s, CPU us per task of this process)."""
    namespace = "dur" + uuid.uuid4().hex[:8]
    queue = Queue(redis_url=url, namespace=namespace)
    done = 0
    finished = asyncio.Event()

    @queue.task(name="bench.noop")
    async def noop() -> None:
        nonlocal done
        done += 1
        if done == N:
            finished.set()

    for i in range(0, N, 1000):
        await noop.enqueue_many([() for _ in range(min(1000, N - i))])
    worker = Worker(queue, concurrency=CONCURRENCY)
    running = asyncio.create_task(worker.run())
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.wait_for(finished.wait(), 300)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    worker.stop()
    await running
    await queue.close()
    return N / elapsed, cpu / N * 1e6


async def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="blitzq-bench-sentinel-"))
    procs, url = start(directory)
    durable_wanted = ReplicatedRedis.wanted

    async def unwaited(self: ReplicatedRedis, asked: int) -> int:
        return 0

    rates: dict[str, list[float]] = {"durable": [], "unwaited": []}
    cpus: dict[str, list[float]] = {"durable": [], "unwaited": []}
    try:
        for _ in range(ROUNDS):
            for setting in ("durable", "unwaited"):
                ReplicatedRedis.wanted = durable_wanted if setting == "durable" else unwaited  # type: ignore[method-assign]
                rate, cpu = await drain(url)
                rates[setting].append(rate)
                cpus[setting].append(cpu)
                print(json.dumps({"setting": setting, "drain_per_s": round(rate),
                                  "cpu_us_per_task": round(cpu, 1)}), flush=True)  # fmt: skip
    finally:
        ReplicatedRedis.wanted = durable_wanted  # type: ignore[method-assign]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
    ratio = statistics.median(rates["durable"]) / statistics.median(rates["unwaited"])
    cpu_ratio = statistics.median(cpus["durable"]) / statistics.median(cpus["unwaited"])
    print(json.dumps({"n": N, "concurrency": CONCURRENCY, "rounds": ROUNDS,
                      "drain_ratio_durable_over_unwaited": round(ratio, 2),
                      "cpu_ratio_durable_over_unwaited": round(cpu_ratio, 2)}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
