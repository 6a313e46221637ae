"""Drain throughput of N queues on one Redis node vs a local 3-primary Redis Cluster.

Usage::

    .venv/bin/python bench/cluster.py [--queues 6] [--tasks 2000] [--reps 3] [--namespaces]

Starts its own servers on free ports (never the shared 6379): one ``redis-server`` and a
3-primary cluster (``--cluster-enabled yes`` x3, ``redis-cli --cluster create``), all with
``--save '' --appendonly no``, and stops them at the end. For each layout, ``--tasks`` no-op
tasks are enqueued on each of ``--queues`` queues (reliable mode), then workers in this
process drain them all; the figure is tasks/s from the workers' start to the last record.

Layouts (run in turn within each round, so the rounds pair them):

- ``1 node``: one namespace, N queues, one Worker serving them all, on the single server;
- ``cluster, spread layout``: the same on the cluster (the default there: each queue in a
  slot of its own, the state store in the namespace's; ``broker/redis/spread.py``);
- ``cluster, slot layout``: the same with ``?layout=slot`` (every key in one slot, so one
  shard does all the work);
- with ``--namespaces``, ``cluster, slot layout, N namespaces``: one namespace (one Queue,
  one Worker) per queue, whose slots fall on the shards in turn.

Beside each rate, the split of the Redis commands over the shards (``INFO commandstats``
calls, deltas) and the CPU seconds each shard's server used (``INFO cpu``), over all the
runs; each shard's share of the namespace's queue streams (by the slot of each queue's tag)
and of the servers' CPU, and the largest gap between the two (points); the servers' CPU per
task (all shards, microseconds) and its ratio to the single server's; and the CPU the
benchmark's own process (producers and workers) used while draining, as a share of one
core. The
machine and the client process are shared by every server, so expect the CPU to cap the
figures: compare the splits more than the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis
from redis.crc import key_slot

from blitzq import Queue, Worker

CONCURRENCY = 200


def _port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = random.randrange(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def _server(workdir: Path, port: int, cluster: bool) -> subprocess.Popen[bytes]:
    args = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    args += ["--appendonly", "no", "--dir", str(workdir), "--logfile", str(workdir / f"{port}.log")]
    if cluster:
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(port: int, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with redis.Redis(port=port, socket_timeout=2) as client:
                text = client.execute_command("CLUSTER", "INFO") if what == "cluster" else "ok"
                if what != "cluster" and client.ping():
                    return
                if b"cluster_state:ok" in text:
                    return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} not ready ({what})")


@contextlib.contextmanager
def servers() -> Iterator[tuple[int, list[int]]]:
    """(single server's port, the cluster's ports), stopped on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="blitzq-bench-cluster-"))
    ports = [_port() for _ in range(4)]
    procs = [_server(workdir, ports[0], False)] + [_server(workdir, p, True) for p in ports[1:]]
    try:
        for port in ports:
            _wait(port, "ping")
        nodes = [f"127.0.0.1:{p}" for p in ports[1:]]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *nodes,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
        )
        for port in ports[1:]:
            _wait(port, "cluster")
        yield ports[0], ports[1:]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def command_calls(port: int) -> tuple[int, float]:
    """Commands the server on ``port`` has run so far (sum of INFO commandstats calls) and
    the CPU seconds it used (user + system)."""
    with redis.Redis(port=port) as client:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
    calls = sum(int(v["calls"]) for v in stats.values())
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def drain(url: str, layout: Layout, tasks: int, wait: int = 0) -> tuple[float, float]:
    """Tasks/s draining ``tasks`` no-op tasks per queue, and the CPU this process used
    meanwhile as a share of one core; ``layout``: (namespace, queues); ``wait``: every
    ``wait``-th task's result is waited on (``result()``) while the workers drain (0: none).
    """
    queues, workers, handles = [], [], []
    total = tasks * sum(len(names) for _, names in layout)
    ran = [0]
    all_ran = asyncio.Event()
    for namespace, names in layout:
        queue = Queue(names[0], redis_url=url, namespace=namespace)

        @queue.task(name="noop")
        async def noop() -> None:
            ran[0] += 1
            if ran[0] == total:
                all_ran.set()

        for name in names:
            for start in range(0, tasks, 1000):
                sent = await noop.options(queue=name).enqueue_many([()] * min(1000, tasks - start))
                handles += sent[::wait] if wait else []
        queues.append((queue, noop, names))
        workers.append(Worker(queue, queues=names, concurrency=CONCURRENCY // len(layout) or 1))
    t0, cpu0 = time.perf_counter(), time.process_time()
    runners = [asyncio.create_task(w.run()) for w in workers]
    if handles:
        await asyncio.wait_for(asyncio.gather(*(h.result(timeout=600) for h in handles)), 600)
    await asyncio.wait_for(all_ran.wait(), 600)
    for w in workers:
        w.stop()  # a graceful stop flushes the last completions
    await asyncio.gather(*runners)
    elapsed = time.perf_counter() - t0
    busy = (time.process_time() - cpu0) / elapsed
    for queue, _, _ in queues:
        await queue.close()
    return total / elapsed, busy


Layout = list[tuple[str, list[str]]]


def spread(ports: list[int], count: int) -> list[str]:
    """``count`` fresh namespace names whose slots fall on the nodes in turn (one node only:
    any names)."""
    if len(ports) == 1:
        return [f"b-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    with redis.Redis(port=ports[0]) as client:
        owners = {
            (int(start), int(end)): int(primary[1])
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS")
        }
    names: list[str] = []
    while len(names) < count:
        name = f"b-{uuid.uuid4().hex[:8]}"
        slot = key_slot(("{" + name + "}:").encode())
        owner = next(p for (a, b), p in owners.items() if a <= slot <= b)
        if owner == ports[len(names) % len(ports)]:
            names.append(name)
    return names


Row = tuple[str, str, list[int], bool]
"""(label, URL, the ports of its servers, one namespace per queue)."""


def slot_owners(ports: list[int]) -> dict[tuple[int, int], int]:
    """The cluster's slot ranges and the port of each range's primary (``CLUSTER SLOTS``)."""
    with redis.Redis(port=ports[0]) as client:
        return {
            (int(start), int(end)): int(primary[1])
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS")
        }


def stream_nodes(url: str, ports: list[int], layout: Layout) -> list[int]:
    """How many of the layout's queue streams each of ``ports`` holds (in ``ports``' order):
    on the spread layout a queue's streams are under ``{<ns>:q:<queue>}``, else ``{<ns>}``."""
    if len(ports) == 1:
        return [sum(len(names) for _, names in layout)]
    owners = slot_owners(ports)
    counts = [0] * len(ports)
    for namespace, names in layout:
        for name in names:
            tag = (
                "{" + namespace + "}"
                if "layout=slot" in url
                else "{" + namespace + ":q:" + name + "}"
            )
            slot = key_slot(tag.encode())
            owner = next(p for (a, b), p in owners.items() if a <= slot <= b)
            counts[ports.index(owner)] += 1
    return counts


def run_rows(rows: list[Row], names: list[str], args: argparse.Namespace) -> list[str]:
    """``--reps`` rounds, each running every row once in turn (A B C A B C: paired and
    interleaved, so a slower moment of the shared machine hits every row); one Markdown line
    per row: median tasks/s, its ratio to the first row, each shard's share of the commands
    (%) and the CPU seconds each shard's server used, over all the rounds."""
    rates: list[list[float]] = [[] for _ in rows]
    client: list[list[float]] = [[] for _ in rows]
    calls = [[0] * len(ports) for _, _, ports, _ in rows]
    cpu = [[0.0] * len(ports) for _, _, ports, _ in rows]
    streams = [[0] * len(ports) for _, _, ports, _ in rows]
    ran = [0] * len(rows)
    for _ in range(args.reps):
        for i, (_, url, ports, per_queue) in enumerate(rows):
            before = [command_calls(p) for p in ports]
            if per_queue:
                layout = list(zip(spread(ports, len(names)), [[n] for n in names], strict=True))
            else:
                layout = [(spread(ports, 1)[0], names)]
            rate, busy = asyncio.run(drain(url, layout, args.tasks, args.wait))
            ran[i] += args.tasks * len(names)
            for j, n in enumerate(stream_nodes(url, ports, layout)):
                streams[i][j] += n
            rates[i].append(rate)
            client[i].append(busy)
            after = [command_calls(p) for p in ports]
            for j, (a, b) in enumerate(zip(after, before, strict=True)):
                calls[i][j] += a[0] - b[0]
                cpu[i][j] += a[1] - b[1]
    lines, base = [], statistics.median(rates[0])
    base_cpu = 1e6 * sum(cpu[0]) / ran[0]
    for i, (label, _, _, _) in enumerate(rows):
        rate = statistics.median(rates[i])
        ratios = [r / b for r, b in zip(rates[i], rates[0], strict=True)]
        total = sum(calls[i]) or 1
        shares = " / ".join(f"{round(100 * c / total)}%" for c in calls[i])
        cpus = " / ".join(f"{c:.1f}" for c in cpu[i])
        cpu_total = sum(cpu[i]) or 1.0
        cpu_shares = " / ".join(f"{round(100 * c / cpu_total)}%" for c in cpu[i])
        stream_total = sum(streams[i]) or 1
        stream_shares = " / ".join(f"{round(100 * n / stream_total)}%" for n in streams[i])
        gap = max(
            abs(100 * c / cpu_total - 100 * n / stream_total)
            for c, n in zip(cpu[i], streams[i], strict=True)
        )
        per_task = 1e6 * sum(cpu[i]) / ran[i]
        lines.append(
            f"| {label} | {rate:,.0f} | {rate / base:.2f} (paired median "
            f"{statistics.median(ratios):.2f}) | {shares} | {cpus} | {stream_shares} | "
            f"{cpu_shares} | {gap:.0f} | {per_task:.1f} ({per_task / base_cpu:.2f}x) | "
            f"{statistics.median(client[i]):.0%} |"
        )
    return lines


def main() -> None:
    """Run every layout for each number of queues and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", default="6", help="numbers of queues, comma-separated")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per queue")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--namespaces", action="store_true", help="add one namespace per queue")
    parser.add_argument(
        "--wait", type=int, default=0, help="wait on every N-th task's result (0: none)"
    )
    args = parser.parse_args()
    with servers() as (single, cluster):
        node, first = f"redis://127.0.0.1:{single}/0", f"redis://127.0.0.1:{cluster[0]}/0"
        rows: list[Row] = [
            ("1 node", node, [single], False),
            ("cluster, spread layout", first, cluster, False),
            ("cluster, slot layout", first + "?layout=slot", cluster, False),
        ]
        if args.namespaces:
            rows.append(
                ("cluster, slot layout, N namespaces", first + "?layout=slot", cluster, True)
            )
        print(
            "| queues | layout | drain tasks/s (median) | vs 1 node | commands per shard "
            "| server CPU s per shard | queue streams per shard | server CPU per shard "
            "| largest gap (points) | server CPU us per task (vs 1 node) "
            "| client CPU (of one core) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for count in (int(n) for n in args.queues.split(",")):
            print(f"{count} queues x {args.tasks} no-op tasks, reliable mode", file=sys.stderr)
            for line in run_rows(rows, [f"q{i}" for i in range(count)], args):
                print(f"| {count} {line}", flush=True)


if __name__ == "__main__":
    main()
