"""Bulk enqueue on RabbitMQ against what the machine allows: CPU per message on each side.

Usage::

    .venv/bin/python bench/amqp_enqueue_floor.py [--tasks N] [--reps N] [--no-floors]

Issue 25 asks for a bulk enqueue on RabbitMQ of at least 0.5x the Redis transport's. This
script says how much of the gap is blitzq's and how much is the server's, in one run. Each
repetition, alternating the order, measures ``task.enqueue_many`` of ``--tasks`` no-op tasks
in batches of 1,000 on a private ``redis-server`` (``bench.py``'s) and on
``BLITZQ_BENCH_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``: a fresh
namespace, a durable quorum queue, publisher confirms), and for each:

* the rate (tasks/s);
* the producer's CPU per message (this process, ``time.process_time``);
* the server's CPU per message: the private Redis's (``INFO cpu``), or the RabbitMQ node's
  (``beam.smp``'s ``/proc/<pid>/stat``: a local node only; its background work, other users'
  queues included, is in it);
* the RabbitMQ side twice: with packs (the default, several tasks per AMQP message,
  ``broker/amqp/packs.py``: batches of 1,000 travel in packs of 15) and with ``?pack=1`` (one
  AMQP message per task, as before packs);
* the machine's ceiling: ``CPUs / (producer + server CPU per message)``, the rate if both
  had the whole machine and nothing waited (on the quorum queue, the node's CPU per
  confirmed message is the larger part).

Also, for reference, the bare client (aio-pika, no blitzq) publishing the same number of
persistent 60-byte messages with confirms, 1,000 in flight, to a fresh quorum queue and to a
classic one (Celery's default kind: blitzq needs the quorum queue's delivery limit,
docs/configuration.md): the node's CPU per message on each.

Ratios are the medians of the per-repetition ratios. When RabbitMQ does not answer, the script
prints a note and exits 0. Its queues are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aio_pika
import bench as harness  # the sibling script: its private server and helpers
from amqp import BEAM_PID, DEFAULT_AMQP_URL, Side, answers, beam_cpu

#: Publishes in flight at once on the floor's channel (blitzq's enqueue_many batch).
WINDOW = 1000
#: Bytes of each floor message (about a no-argument blitzq envelope).
BODY = os.urandom(60)


async def server_cpu(client: harness.aioredis.Redis, amqp: str | None) -> float:
    """CPU seconds used so far by the private Redis, or by the RabbitMQ node (``amqp``)."""
    if amqp is not None:
        return beam_cpu()
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def blitzq_enqueue(
    url: str, amqp: str | None, client: harness.aioredis.Redis, n: int
) -> tuple[float, float, float]:
    """``task.enqueue_many`` of ``n`` no-op tasks in batches of 1,000: ``(tasks/s, producer
    CPU seconds per task, server CPU seconds per task)``."""
    side = Side(url, amqp, "floor")
    try:
        await side.task.enqueue_many([()] * 10)  # connect and declare first
        server, cpu = await server_cpu(client, amqp), time.process_time()
        started = time.perf_counter()
        for start in range(0, n, WINDOW):
            await side.task.enqueue_many([()] * min(WINDOW, n - start))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server = await server_cpu(client, amqp) - server
        return n / elapsed, cpu / n, server / n
    finally:
        await side.close(client)


async def floor(amqp: str, n: int, kind: str) -> float:
    """Bare aio-pika: ``n`` persistent publishes with confirms to a fresh durable queue of
    ``kind`` (``"quorum"`` or ``"classic"``), :data:`WINDOW` in flight: the RabbitMQ node's
    CPU seconds per message."""
    connection = await aio_pika.connect(amqp)
    name = f"bench-floor-{kind}-{uuid.uuid4().hex[:8]}"
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": kind})
        exchange = channel.default_exchange

        def message(i: int) -> aio_pika.Message:
            return aio_pika.Message(
                BODY, message_id=f"{i:024d}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )

        await asyncio.gather(*(exchange.publish(message(i), name) for i in range(10)))
        server = beam_cpu()
        for start in range(0, n, WINDOW):
            count = min(WINDOW, n - start)
            await asyncio.gather(
                *(exchange.publish(message(start + i), name) for i in range(count))
            )
        server = beam_cpu() - server
        await channel.queue_delete(name)
        return server / n
    finally:
        await connection.close()


async def run(url: str, amqp: str, tasks: int, reps: int, with_floors: bool) -> None:
    """Run the alternating repetitions and print the table."""
    client = harness.aioredis.Redis.from_url(url)
    rows: dict[str, list[tuple[float, float, float]]] = {"redis": [], "amqp": [], "single": []}
    floors: dict[str, list[float]] = {"quorum": [], "classic": []}
    single = amqp + ("&" if "?" in amqp else "?") + "pack=1"
    try:
        for rep in range(reps):
            steps = ["redis", "amqp", "single"] + (["quorum", "classic"] if with_floors else [])
            for step in steps if rep % 2 == 0 else steps[::-1]:
                if step in rows:
                    target = {"amqp": amqp, "single": single}.get(step)
                    rows[step].append(await blitzq_enqueue(url, target, client, tasks))
                else:
                    floors[step].append(await floor(amqp, tasks, step))
    finally:
        await client.aclose()
    cpus = os.cpu_count() or 1

    def ceiling(row: tuple[float, float, float]) -> float:
        return cpus / (row[1] + row[2])

    print("| enqueue_many | tasks/s | producer CPU us/task | server CPU us/task | ceiling /s |")
    print("|---|---:|---:|---:|---:|")
    labels = (
        ("redis", "Redis"),
        ("amqp", "RabbitMQ, quorum queue, packs (default)"),
        ("single", "RabbitMQ, quorum queue, `?pack=1` (one message per task)"),
    )
    for key, label in labels:
        got = rows[key]
        print(
            f"| {label} | {statistics.median(r[0] for r in got):,.0f} "
            f"| {statistics.median(r[1] for r in got) * 1e6:.1f} "
            f"| {statistics.median(r[2] for r in got) * 1e6:.1f} "
            f"| {statistics.median(ceiling(r) for r in got):,.0f} |"
        )
    print()
    for key, label in (("amqp", "packs"), ("single", "?pack=1")):
        pairs = list(zip(rows[key], rows["redis"], strict=True))
        print(
            f"RabbitMQ ({label}) / Redis, same run: rate "
            f"{statistics.median(a[0] / r[0] for a, r in pairs):.2f}"
            f", RabbitMQ's ceiling / Redis's rate "
            f"{statistics.median(ceiling(a) / r[0] for a, r in pairs):.2f}"
        )
    if BEAM_PID is None:
        print("(the RabbitMQ node is not local: its CPU is not counted)")
    for kind, got in floors.items():
        node = statistics.median(got) * 1e6
        print(f"bare aio-pika, {kind} queue: node CPU {node:.1f} us/message")
    print(f"\n(load average {os.getloadavg()[0]:.1f}, {cpus} CPUs, reps={reps})")


def main() -> None:
    """Parse arguments, skip without RabbitMQ, start the private Redis, run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=5000, help="messages per measurement")
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions")
    parser.add_argument("--no-floors", action="store_true", help="skip the bare-client rows")
    args = parser.parse_args()
    amqp = os.environ.get("BLITZQ_BENCH_AMQP_URL", DEFAULT_AMQP_URL)
    os.environ.pop("BLITZQ_AMQP_URL", None)  # the Redis side must stay on Redis
    if not answers(amqp):
        print("RabbitMQ bench skipped: nothing answers")
        return
    with harness.private_redis() as url:
        asyncio.run(run(url, amqp, args.tasks, args.reps, not args.no_floors))


if __name__ == "__main__":
    main()
