"""Server CPU per task, for sizing shards (docs/operations.md, "Capacity model").

Usage::

    .venv/bin/python bench/capacity.py [--tasks 3000] [--queues 6] [--reps 3] [--no-amqp]

Starts its own servers on free ports (``bench/cluster.py``'s ``servers()``: one
``redis-server`` and a local 3-primary Redis Cluster, ``--save '' --appendonly no``; never
the shared 6379) and, for each case below, in a fresh namespace: enqueues ``--tasks`` no-op
tasks on each of ``--queues`` queues (``enqueue_many``, batches of 1000), then runs one
in-process ``Worker(concurrency=200)`` over all the queues until every task ran and the
broker shows nothing waiting or in flight (and the last task's record exists, when results
are stored). Around each phase it reads ``INFO cpu`` (``used_cpu_user + used_cpu_sys``) and
``INFO commandstats`` of every server the case uses, so the figures are what the *servers*
spent (the Python processes are not counted):

- ``enqueue us``, ``drain us``: server CPU microseconds per task of each phase;
- ``total us``: their sum, and its ratio to the first case's (same run, paired per round);
- ``cmds/task``: server commands per task, both phases;
- ``k tasks/s per core``: ``1000 / total us``, what one fully busy server core would carry.

Cases: Redis single server (reliable and fast mode, results stored or not), Redis Cluster
spread layout (reliable, results stored or not: the CPU of the three primaries summed), and
RabbitMQ as transport with the state on the single Redis (results stored or not: only the
Redis side's CPU; RabbitMQ's own is not read). The RabbitMQ cases use
``BLITZQ_BENCH_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``) with queue names of
a fresh namespace, deleted afterwards; they are left out (with a note) when nothing answers
there or with ``--no-amqp``.

Rounds run every case once in turn (A B C ... A B C), so a slow moment of a shared machine
hits every case; compare the ratios of one run.

Then, unless ``--no-idle``, what an idle worker process costs the server, by
``bench/idle_cost.py``'s ``measure`` (one ``Worker`` with default settings in a subprocess
on 1, 4 and 16 queues, ``--idle-queues``, both modes; commands/s over ``--idle-seconds``
after it settled, and the connections it holds): about a minute per row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster as cluster_bench  # the sibling script: its servers
import idle_cost
from amqp import DEFAULT_AMQP_URL, answers

from blitzq import Queue, Worker
from blitzq.broker.amqp.channels import DEAD_LETTER_SUFFIX, AmqpLink

CONCURRENCY = 200
BATCH = 1000
DEADLINE = 600.0


@dataclass(frozen=True)
class Case:
    """One configuration measured.

    Attributes:
        label: its name in the table.
        transport: ``single``, ``cluster`` or ``amqp`` (RabbitMQ, state on the single server).
        mode: ``reliable`` or ``fast``.
        store: ``store_results``.
    """

    label: str
    transport: str
    mode: str
    store: bool


@dataclass
class Totals:
    """What one case used over all the rounds."""

    tasks: int = 0
    enqueue_cpu: float = 0.0
    drain_cpu: float = 0.0
    commands: int = 0
    per_round: list[float] = field(default_factory=list)
    """Server CPU seconds per task in each round (for the paired ratios)."""


def usage(ports: list[int]) -> tuple[float, int]:
    """CPU seconds (user + system) and commands the servers on ``ports`` used so far."""
    cpu, calls = 0.0, 0
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("cpu")
            stats = client.info("commandstats")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        calls += sum(int(v["calls"]) for v in stats.values())
    return cpu, calls


async def settled(queue: Queue, names: list[str], last_id: str, store: bool) -> bool:
    """Whether nothing waits or is in flight on ``names`` and, with results, the last
    task's record exists."""
    stats = await queue.broker.queue_stats(names)
    if any(s["waiting"] or s["in_flight"] for s in stats.values()):
        return False
    return not store or await queue.inspect(last_id) is not None


async def measure(
    case: Case, url: str, amqp: str | None, ports: list[int], queues: int, tasks: int
) -> tuple[float, float, int]:
    """Run ``case`` once; return the servers' (enqueue CPU s, drain CPU s, commands)."""
    namespace = f"cap-{uuid.uuid4().hex[:8]}"
    names = [f"q{i}" for i in range(queues)]
    queue = Queue(
        names[0],
        redis_url=url,
        amqp_url=amqp if case.transport == "amqp" else None,
        namespace=namespace,
        mode=case.mode,
        store_results=case.store,
    )
    total = tasks * queues
    ran = [0]
    all_ran = asyncio.Event()

    @queue.task(name="noop")
    async def noop() -> int:
        ran[0] += 1
        if ran[0] == total:
            all_ran.set()
        return 1

    try:
        cpu0, calls0 = usage(ports)
        last_id = ""
        for name in names:
            for start in range(0, tasks, BATCH):
                sent = await noop.options(queue=name).enqueue_many([()] * min(BATCH, tasks - start))
                last_id = sent[-1].id
        cpu1, _ = usage(ports)
        worker = Worker(queue, queues=names, concurrency=CONCURRENCY)
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(all_ran.wait(), DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while not await settled(queue, names, last_id, case.store):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{case.label}: the broker never showed every task done")
            await asyncio.sleep(0.01)
        cpu2, calls2 = usage(ports)
        worker.stop()
        await asyncio.wait_for(runner, 60)
        return cpu1 - cpu0, cpu2 - cpu1, calls2 - calls0
    finally:
        await queue.close()
        amqp_used = amqp if case.transport == "amqp" else None
        await cleanup(url, namespace, names, amqp_used, case.transport == "cluster")


async def cleanup(
    url: str, namespace: str, names: list[str], amqp: str | None, cluster: bool
) -> None:
    """Delete the namespace's keys (on every node of a ``cluster``) and its RabbitMQ queues."""
    pattern_ns = ["{" + namespace + "}:*", "{" + namespace + ":q:*"]
    if cluster:
        with redis.RedisCluster.from_url(url.replace("redis+cluster", "redis")) as rc:
            for pattern in pattern_ns:
                for key in rc.scan_iter(match=pattern, target_nodes="all"):
                    rc.delete(key)
    else:
        with redis.Redis.from_url(url) as plain:
            for pattern in pattern_ns:
                for key in plain.scan_iter(match=pattern, count=1000):
                    plain.delete(key)
    if amqp is not None:
        link = AmqpLink(amqp, "capacity-cleanup", 1)
        try:
            await link.delete(
                [f"{namespace}.{q}" for q in names] + [f"{namespace}.{DEAD_LETTER_SUFFIX}"]
            )
        finally:
            await link.close()


def cases(with_amqp: bool) -> list[Case]:
    """Every case measured, the reference (single server, reliable, results) first."""
    made = [
        Case("Redis, reliable, results", "single", "reliable", True),
        Case("Redis, reliable, no results", "single", "reliable", False),
        Case("Redis, fast, results", "single", "fast", True),
        Case("Redis, fast, no results", "single", "fast", False),
        Case("Cluster spread (3 primaries), reliable, results", "cluster", "reliable", True),
        Case("Cluster spread (3 primaries), reliable, no results", "cluster", "reliable", False),
    ]
    if with_amqp:
        made += [
            Case("RabbitMQ + Redis state, results (Redis side)", "amqp", "reliable", True),
            Case("RabbitMQ + Redis state, no results (Redis side)", "amqp", "reliable", False),
        ]
    return made


def main() -> None:
    """Run every case ``--reps`` times in turn and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per queue")
    parser.add_argument("--queues", type=int, default=6)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-amqp", action="store_true", help="leave the RabbitMQ cases out")
    parser.add_argument("--no-idle", action="store_true", help="leave the idle cost out")
    parser.add_argument("--idle-queues", default="1,4,16", help="queues of the idle workers")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    amqp_url = os.environ.get("BLITZQ_BENCH_AMQP_URL", DEFAULT_AMQP_URL)
    with_amqp = not args.no_amqp and answers(amqp_url)
    if not args.no_amqp and not with_amqp:
        print(f"note: nothing answers at {amqp_url}: the RabbitMQ cases are left out")
    todo = cases(with_amqp)
    totals = [Totals() for _ in todo]
    with cluster_bench.servers() as (single, nodes):
        urls = {
            "single": (f"redis://127.0.0.1:{single}/0", [single]),
            "amqp": (f"redis://127.0.0.1:{single}/0", [single]),
            "cluster": (f"redis+cluster://127.0.0.1:{nodes[0]}/0", nodes),
        }
        for _ in range(args.reps):
            for case, total in zip(todo, totals, strict=True):
                url, ports = urls[case.transport]
                enq, drain, calls = asyncio.run(
                    measure(case, url, amqp_url, ports, args.queues, args.tasks)
                )
                n = args.tasks * args.queues
                total.tasks += n
                total.enqueue_cpu += enq
                total.drain_cpu += drain
                total.commands += calls
                total.per_round.append((enq + drain) / n)
    print(
        f"{args.queues} queues x {args.tasks} no-op tasks, {args.reps} rounds, "
        f"Worker(concurrency={CONCURRENCY}) in this process; server CPU only"
    )
    print()
    print(
        "| case | enqueue us/task | drain us/task | total us/task (x reference, paired median) "
        "| cmds/task | k tasks/s per server core |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    reference = totals[0]
    for case, total in zip(todo, totals, strict=True):
        enq = 1e6 * total.enqueue_cpu / total.tasks
        drain = 1e6 * total.drain_cpu / total.tasks
        both = enq + drain
        paired = statistics.median(
            a / b for a, b in zip(total.per_round, reference.per_round, strict=True)
        )
        print(
            f"| {case.label} | {enq:.1f} | {drain:.1f} | {both:.1f} ({paired:.2f}x) | "
            f"{total.commands / total.tasks:.2f} | {1000 / both:.0f} |"
        )
    if not args.no_idle:
        idle(args.idle_queues, args.idle_seconds)


def idle(queues: str, seconds: float) -> None:
    """Print what one idle worker process costs the server (``idle_cost.measure``)."""
    print()
    print("| idle worker, mode | queues (x3 levels) | commands/s | connections |")
    print("|---|---:|---:|---:|")
    with idle_cost.harness.private_redis() as url:
        port = idle_cost.urlsplit(url).port or 6379
        for mode in ("reliable", "fast"):
            for n in (int(x) for x in queues.split(",")):
                got = idle_cost.measure([port], url, "", mode, n, seconds, settle=35.0)
                print(f"| {mode} | {n} | {got['commands_per_s']:.2f} | {got['connections']:.0f} |")


if __name__ == "__main__":
    main()
