"""What durable writes cost on ``redis+sentinel://`` (issue 25): a worker's, or a producer's.

Starts a private primary, one replica and one sentinel (free ports, stopped at the end).

Worker mode (the default) drains N pre-enqueued no-op tasks (results stored) with one
in-process ``Worker``, in rounds that alternate two settings in the same process:

- ``durable``: what a worker does now: each fetch and each completion batch is followed by
  ``WAIT`` for the replicas that exist (``broker/redis/sentinel.py``);
- ``unwaited``: the same code with :meth:`ReplicatedRedis.wanted` answering 0 (no ``WAIT``):
  the worker of before the fix, which a failover could leave with tasks that ran and no record.

Prints each round's tasks/s and the worker process's CPU per task, then the ratio
durable/unwaited of the medians (the figure bench/README.md quotes: side by side, one run).

Enqueue mode (``enqueue`` as the first argument) times a producer instead, in rounds that
alternate a URL naming no ``wait_replicas`` (``durable``: each enqueue is followed by ``WAIT``
for the replica, the default now) and one saying ``wait_replicas=0`` (``unwaited``: the
producer's opt-out, the default of before), each round on a fresh Queue: N enqueues one
after another (``sequential``: the latency a caller sees), N enqueues from ``concurrency``
callers at once (``concurrent``), and N tasks in ``enqueue_many`` batches of 100
(``batched``). Prints each round's enqueues/s and CPU per enqueue, then the ratios of the
medians.

argv: [enqueue] N (default 3000), concurrency (default 50), rounds per setting (default 3).
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

ENQUEUE = len(sys.argv) > 1 and sys.argv[1] == "enqueue"
ARGS = sys.argv[2:] if ENQUEUE else sys.argv[1:]
N = int(ARGS[0]) if len(ARGS) > 0 else 3000
CONCURRENCY = int(ARGS[1]) if len(ARGS) > 1 else 50
ROUNDS = int(ARGS[2]) if len(ARGS) > 2 else 3
#: The producer's ways of sending, timed in enqueue mode.
STYLES = ("sequential", "concurrent", "batched")
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


def stop(procs: list[subprocess.Popen[bytes]], directory: Path) -> None:
    """Stop the servers and remove their directory."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)
    shutil.rmtree(directory, ignore_errors=True)


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


async def enqueues(url: str, style: str) -> tuple[float, float]:
    """N enqueues of a no-op task in ``style`` (:data:`STYLES`) on a fresh Queue; (enqueues/s,
    CPU us per enqueue of this process). The Queue's first enqueue (its connections, the
    replicas' first ``ROLE``) is made before the clock starts."""
    queue = Queue(redis_url=url, namespace="enq" + uuid.uuid4().hex[:8])

    @queue.task(name="bench.noop")
    async def noop() -> None:
        return None

    await noop.enqueue()
    t0, cpu0 = time.perf_counter(), time.process_time()
    if style == "sequential":
        for _ in range(N):
            await noop.enqueue()
    elif style == "concurrent":
        per = N // CONCURRENCY

        async def caller() -> None:
            for _ in range(per):
                await noop.enqueue()

        await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    else:
        for _ in range(0, N, 100):
            await noop.enqueue_many([() for _ in range(100)])
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await queue.close()
    return N / elapsed, cpu / N * 1e6


async def enqueue_main(url: str) -> None:
    """Enqueue mode (module docstring): ``url`` names no ``wait_replicas``."""
    urls = {"durable": url, "unwaited": url + "?wait_replicas=0"}
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for style in STYLES:
            for setting, where in urls.items():
                rate, cpu = await enqueues(where, style)
                rates.setdefault((style, setting), []).append(rate)
                cpus.setdefault((style, setting), []).append(cpu)
                print(json.dumps({"style": style, "setting": setting, "enqueue_per_s": round(rate),
                                  "cpu_us_per_enqueue": round(cpu, 1)}), flush=True)  # fmt: skip
    summary: dict[str, Any] = {"n": N, "concurrency": CONCURRENCY, "rounds": ROUNDS}
    for style in STYLES:
        med = {k: statistics.median(v) for k, v in rates.items() if k[0] == style}
        cpu = {k: statistics.median(v) for k, v in cpus.items() if k[0] == style}
        summary[style] = {
            "durable_per_s": round(med[(style, "durable")]),
            "unwaited_per_s": round(med[(style, "unwaited")]),
            "rate_ratio_durable_over_unwaited": round(
                med[(style, "durable")] / med[(style, "unwaited")], 2
            ),
            "cpu_ratio_durable_over_unwaited": round(
                cpu[(style, "durable")] / cpu[(style, "unwaited")], 2
            ),
        }
    print(json.dumps(summary))


async def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="blitzq-bench-sentinel-"))
    procs, url = start(directory)
    if ENQUEUE:
        try:
            await enqueue_main(url)
        finally:
            stop(procs, directory)
        return
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
        stop(procs, directory)
    ratio = statistics.median(rates["durable"]) / statistics.median(rates["unwaited"])
    cpu_ratio = statistics.median(cpus["durable"]) / statistics.median(cpus["unwaited"])
    print(json.dumps({"n": N, "concurrency": CONCURRENCY, "rounds": ROUNDS,
                      "drain_ratio_durable_over_unwaited": round(ratio, 2),
                      "cpu_ratio_durable_over_unwaited": round(cpu_ratio, 2)}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
