"""What a worker's durable fetches and completions cost on a Redis Cluster with replicas.

Starts a private 3-primary cluster with one replica per primary (six ``redis-server`` on free
ports, stopped at the end), then drains N pre-enqueued no-op tasks (results stored) with one
in-process ``Worker``, in rounds that alternate two settings in the same process:

- ``durable``: what a worker does now: each fetch and each completion on a shard is followed by
  ``WAIT`` for that shard's replicas that exist (``broker/redis/cluster_replicas.py``);
- ``unwaited``: the same code with :meth:`ShardReplicas.wanted` answering 0 (no ``WAIT``): the
  worker of before, which a failover could leave with tasks that ran and no record.

Prints each round's tasks/s and the worker process's CPU per task, then the ratio
durable/unwaited of the medians (the figure bench/README.md quotes: side by side, one run).

argv: N (default 3000), concurrency (default 50), rounds per setting (default 3), layout
(``spread``, the default, or ``slot``).
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
from blitzq.broker.redis.cluster_replicas import ShardReplicas

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
CONCURRENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 50
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
LAYOUT = sys.argv[4] if len(sys.argv) > 4 else "spread"
QUIET = subprocess.DEVNULL


def free_port() -> int:
    """A port free on 127.0.0.1 whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536:
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


def wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def cluster_ok(port: int) -> bool:
    try:
        info = redis.Redis(port=port).execute_command("CLUSTER", "INFO")
    except (redis.RedisError, OSError):
        return False
    return b"cluster_state:ok" in info


def start(directory: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    ports: list[int] = []
    while len(ports) < 6:
        port = free_port()
        if all(abs(port - p) > 1 for p in ports):
            ports.append(port)
    procs = [
        subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(p),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(directory / f"nodes-{p}.conf"),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
            ],
            stdout=QUIET,
        )
        for p in ports
    ]
    for p in ports:
        wait_for(lambda p=p: _pings(p), f"server {p}")
    subprocess.run(
        ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
         "--cluster-replicas", "1", "--cluster-yes"],
        check=True, stdout=QUIET,
    )  # fmt: skip
    wait_for(lambda: all(cluster_ok(p) for p in ports), "cluster_state:ok")
    wait_for(lambda: _linked(ports), "every replica in sync")
    query = "?layout=slot" if LAYOUT == "slot" else ""
    return procs, f"redis://127.0.0.1:{ports[0]}/0{query}"


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except (redis.RedisError, OSError):
        return False


def _linked(ports: list[int]) -> bool:
    up = 0
    for p in ports:
        info = redis.Redis(port=p).info("replication")
        up += info.get("master_link_status") == "up"
    return up == 3


async def drain(url: str) -> tuple[float, float]:
    """One drain of N no-op tasks; (tasks/s, CPU us per task of this process)."""
    namespace = "cdur" + uuid.uuid4().hex[:8]
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
    directory = Path(tempfile.mkdtemp(prefix="blitzq-bench-cluster-dur-"))
    procs, url = start(directory)
    durable_wanted = ShardReplicas.wanted

    async def unwaited(self: ShardReplicas, node: Any) -> int:
        return 0

    rates: dict[str, list[float]] = {"durable": [], "unwaited": []}
    cpus: dict[str, list[float]] = {"durable": [], "unwaited": []}
    try:
        for _ in range(ROUNDS):
            for setting in ("durable", "unwaited"):
                ShardReplicas.wanted = durable_wanted if setting == "durable" else unwaited  # type: ignore[method-assign]
                rate, cpu = await drain(url)
                rates[setting].append(rate)
                cpus[setting].append(cpu)
                print(json.dumps({"setting": setting, "drain_per_s": round(rate),
                                  "cpu_us_per_task": round(cpu, 1)}), flush=True)  # fmt: skip
    finally:
        ShardReplicas.wanted = durable_wanted  # type: ignore[method-assign]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
    ratio = statistics.median(rates["durable"]) / statistics.median(rates["unwaited"])
    cpu_ratio = statistics.median(cpus["durable"]) / statistics.median(cpus["unwaited"])
    print(json.dumps({"n": N, "concurrency": CONCURRENCY, "rounds": ROUNDS, "layout": LAYOUT,
                      "drain_ratio_durable_over_unwaited": round(ratio, 2),
                      "cpu_ratio_durable_over_unwaited": round(cpu_ratio, 2)}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
