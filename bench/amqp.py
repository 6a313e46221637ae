"""blitzq on RabbitMQ beside blitzq on Redis: drain and round trip, paired in the same run.

Usage::

    .venv/bin/python bench/amqp.py [--quick] [--tasks N] [--trips N] [--reps N]

Starts a private ``redis-server`` like ``bench.py`` (the state store of both sides, and the
transport of the Redis side); the RabbitMQ side uses ``BLITZQ_BENCH_AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``) with a fresh namespace, and deletes its RabbitMQ
queues afterwards. When RabbitMQ does not answer, the script prints a note and exits 0.

Rows (each repetition runs Redis then RabbitMQ, alternating which goes first):

* ``enqueue_many``: ``--tasks`` no-op tasks enqueued with ``task.enqueue_many`` in batches of
  1,000 (publisher confirms on RabbitMQ), tasks/s.
* ``drain``: one in-process ``Worker(concurrency=200)`` runs ``--tasks`` pre-enqueued no-op
  tasks (reliable mode, results stored); the clock stops when every task ran, the last
  task's record exists and the queue shows nothing waiting or in flight.
* ``worker CPU per task``: this process's CPU time (``time.process_time``) over that drain,
  divided by ``--tasks`` (the worker runs in this process; the servers' CPU is not in it).
* ``server CPU per task``: the servers' CPU over each phase (enqueue, then drain), per task:
  the private ``redis-server``'s (``INFO cpu``) on both sides, plus, on the RabbitMQ side,
  the RabbitMQ node's (``beam.smp``'s ``/proc/<pid>/stat``) when it runs on this machine and
  its process can be read (else the row says so). The node's background work during the
  phase is in it (other users' queues too, on a shared server).
* ``round trip``: ``--trips`` sequential ``enqueue`` then ``await handle.result()`` with an
  idle in-process worker; p50 and p99 (the first 20 warm up and are not counted).

The ratio column is ``RabbitMQ / Redis``, the median of the per-repetition ratios (the
machine may be shared: only the ratios of one run are comparable).

With ``BLITZQ_BENCH_CELERY_PYTHON`` set to a Python that has Celery (kept out of blitzq's
lock, e.g. a separate virtualenv with ``pip install celery redis``), each repetition also
runs Celery's drain of the same number of no-op tasks on the same RabbitMQ and Redis
(``bench/celery_amqp.py``: late acks, results in Redis; the ``threads`` pool with 200 slots
and the ``prefork`` pool with 4 processes), and a second table shows blitzq's RabbitMQ drain
against each (the median of the per-repetition ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as harness  # the sibling script: its private server and helpers

from blitzq import Queue, Worker
from blitzq.broker.amqp.channels import DEAD_LETTER_SUFFIX, AmqpLink

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _beam_pid() -> int | None:
    """The pid of a local RabbitMQ node (``beam.smp`` running ``rabbit``) whose CPU times
    this user can read, or ``None``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            (entry / "stat").read_text()
        except OSError:
            continue
        if b"beam.smp" in cmdline and b"rabbit" in cmdline:
            return int(entry.name)
    return None


BEAM_PID = _beam_pid() if sys.platform == "linux" else None


def beam_cpu() -> float:
    """CPU seconds (user + system) the local RabbitMQ node has used, 0.0 when unknown."""
    if BEAM_PID is None:
        return 0.0
    try:
        fields = Path(f"/proc/{BEAM_PID}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def server_cpu(client: harness.aioredis.Redis, amqp: str | None) -> float:
    """CPU seconds used so far by the private Redis, plus the RabbitMQ node's (``amqp``)."""
    info = await client.info("cpu")
    used = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return used + (beam_cpu() if amqp is not None else 0.0)


def answers(url: str) -> bool:
    """Whether something accepts TCP connections at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 1.0):
            return True
    except OSError:
        return False


class Side:
    """A Queue with one counting no-op task, on Redis (``amqp`` None) or RabbitMQ."""

    def __init__(self, url: str, amqp: str | None, label: str) -> None:
        self.amqp = amqp
        self.namespace = harness.new_namespace(label)
        self.queue = Queue(
            harness.QUEUE,
            redis_url=url,
            amqp_url=amqp,
            namespace=self.namespace,
            store_results=True,
        )
        self.ran = 0
        self.target = 0
        self.all_ran = asyncio.Event()

        async def noop() -> int:
            self.ran += 1
            if self.ran == self.target:
                self.all_ran.set()
            return 1

        self.task = self.queue.task(name=harness.TASK_NAME)(noop)

    async def close(self, client: harness.aioredis.Redis) -> None:
        """Close the Queue, delete the namespace's keys and RabbitMQ queues."""
        await self.queue.close()
        await harness.delete_matching(client, "{" + self.namespace + "}:*")
        if self.amqp is not None:
            link = AmqpLink(self.amqp, "bench-cleanup", 1)
            try:
                await link.delete(
                    [f"{self.namespace}.{q}" for q in (harness.QUEUE, DEAD_LETTER_SUFFIX)]
                )
            finally:
                await link.close()


async def _settled(side: Side, last_id: str) -> bool:
    stats = (await side.queue.broker.queue_stats([harness.QUEUE]))[harness.QUEUE]
    if stats["waiting"] or stats["in_flight"]:
        return False
    return await side.queue.inspect(last_id) is not None


async def drain(
    url: str, amqp: str | None, client: harness.aioredis.Redis, n: int
) -> tuple[float, float, float, float]:
    """``(enqueue tasks/s, drain tasks/s, worker CPU seconds per task, server CPU seconds
    per task)`` of ``n`` no-op tasks enqueued in batches, then drained by one in-process
    worker."""
    side = Side(url, amqp, "adrain")
    try:
        await side.task.enqueue_many([()])  # connect and declare before the clock starts
        handles = []
        server0 = await server_cpu(client, amqp)
        t0 = time.perf_counter()
        for start in range(0, n, harness.BATCH):
            handles += await side.task.enqueue_many([()] * min(harness.BATCH, n - start))
        enqueued = n / (time.perf_counter() - t0)
        side.target = n + 1
        worker = Worker(side.queue, concurrency=harness.DRAIN_CONCURRENCY)
        t0, cpu0 = time.perf_counter(), time.process_time()
        runner = await harness._run_worker(worker)
        await asyncio.wait_for(side.all_ran.wait(), harness.DEADLINE)
        await harness.wait_until(lambda: _settled(side, handles[-1].id), "completions", 0.005)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server = await server_cpu(client, amqp) - server0
        await harness._stop_worker(worker, runner)
        return enqueued, n / elapsed, cpu / n, server / n
    finally:
        await side.close(client)


async def round_trips(
    url: str, amqp: str | None, client: harness.aioredis.Redis, n: int
) -> list[float]:
    """Seconds per round trip (enqueue, then await the result) with an idle worker."""
    side = Side(url, amqp, "alat")
    try:
        worker = Worker(side.queue, concurrency=10)
        runner = await harness._run_worker(worker)
        samples = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            await (await side.task.enqueue()).result(timeout=10)
            if i >= 20:
                samples.append(time.perf_counter() - t0)
        await harness._stop_worker(worker, runner)
        return samples
    finally:
        await side.close(client)


CELERY_POOLS = (("threads", 200), ("prefork", 4))


def celery_drain(python: str, url: str, amqp: str, tasks: int, pool: str, slots: int) -> float:
    """Tasks/s of Celery's drain (``bench/celery_amqp.py`` run by ``python``)."""
    script = Path(__file__).resolve().parent / "celery_amqp.py"
    cmd = [python, str(script), "--amqp", amqp, "--redis", url, "--tasks", str(tasks)]
    cmd += ["--pool", pool, "--concurrency", str(slots)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return float(done.stdout.strip().splitlines()[-1])


async def run(url: str, amqp: str, tasks: int, trips: int, reps: int) -> None:
    """Run the paired repetitions and print the table."""
    client = harness.aioredis.Redis.from_url(url)
    rates: dict[str, list[float]] = {"redis": [], "amqp": []}
    enqueues: dict[str, list[float]] = {"redis": [], "amqp": []}
    cpus: dict[str, list[float]] = {"redis": [], "amqp": []}
    servers: dict[str, list[float]] = {"redis": [], "amqp": []}
    celery = os.environ.get("BLITZQ_BENCH_CELERY_PYTHON")
    celeries: dict[str, list[float]] = {pool: [] for pool, _ in CELERY_POOLS}
    p50s: dict[str, list[float]] = {"redis": [], "amqp": []}
    p99s: dict[str, list[float]] = {"redis": [], "amqp": []}
    try:
        for rep in range(reps):
            order = [("redis", None), ("amqp", amqp)]
            for side, target in order if rep % 2 == 0 else order[::-1]:
                enqueued, rate, cpu, server = await drain(url, target, client, tasks)
                enqueues[side].append(enqueued)
                rates[side].append(rate)
                cpus[side].append(cpu * 1e6)
                servers[side].append(server * 1e6)
                p50, p99 = harness._percentiles(await round_trips(url, target, client, trips))
                p50s[side].append(p50)
                p99s[side].append(p99)
            if celery:
                for pool, slots in CELERY_POOLS:
                    rate = await asyncio.to_thread(
                        celery_drain, celery, url, amqp, tasks, pool, slots
                    )
                    celeries[pool].append(rate)
    finally:
        await client.aclose()
    print("| measurement | Redis | RabbitMQ | RabbitMQ / Redis |")
    print("|---|---:|---:|---:|")
    server_row = "server CPU per task (enqueue + drain"
    server_row += ", RabbitMQ's included)" if BEAM_PID is not None else ", Redis only)"
    for name, got, unit in (
        (f"enqueue_many x{tasks}", enqueues, "/s"),
        (f"drain x{tasks}", rates, "/s"),
        ("worker CPU per task (drain)", cpus, " us"),
        (server_row, servers, " us"),
        ("round trip p50", p50s, " ms"),
        ("round trip p99", p99s, " ms"),
    ):
        ratio = statistics.median(a / r for a, r in zip(got["amqp"], got["redis"], strict=True))
        redis_v, amqp_v = statistics.median(got["redis"]), statistics.median(got["amqp"])
        print(f"| {name} | {redis_v:,.1f}{unit} | {amqp_v:,.1f}{unit} | {ratio:.2f} |")
    if celery:
        print("\n| drain on RabbitMQ | tasks/s | blitzq / this |")
        print("|---|---:|---:|")
        print(
            f"| blitzq, Worker(concurrency=200) | {statistics.median(rates['amqp']):,.1f} | 1.00 |"
        )
        for pool, slots in CELERY_POOLS:
            got = celeries[pool]
            ratio = statistics.median(b / c for b, c in zip(rates["amqp"], got, strict=True))
            print(f"| Celery, {pool} pool x{slots} | {statistics.median(got):,.1f} | {ratio:.2f} |")
    print(f"\n(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, reps={reps})")


def main() -> None:
    """Parse arguments, skip without RabbitMQ, start the private Redis, run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--tasks", type=int, default=5000, help="tasks per drain")
    parser.add_argument("--trips", type=int, default=200, help="round trips per repetition")
    parser.add_argument("--reps", type=int, default=3, help="paired repetitions")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.trips, args.reps = 1000, 50, 1
    amqp = os.environ.get("BLITZQ_BENCH_AMQP_URL", DEFAULT_AMQP_URL)
    os.environ.pop("BLITZQ_AMQP_URL", None)  # the Redis side must stay on Redis
    if not answers(amqp):
        print(
            f"RabbitMQ bench skipped: nothing answers at {urlsplit(amqp).netloc.rpartition('@')[2]}"
        )
        return
    with harness.private_redis() as url:
        asyncio.run(run(url, amqp, args.tasks, args.trips, args.reps))


if __name__ == "__main__":
    main()
