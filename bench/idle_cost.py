"""What an idle worker costs the servers: commands per second and connections (issue 25).

For each transport, mode and number of queues (1, 4, 16 by default; every queue has its
``:high`` and ``:low`` levels) runs one ``Worker`` with default settings in a subprocess of its
own, lets it settle (``--settle`` seconds: start-up reads, registration, and the pooled
connections its start opened closing after 30 s unused), and counts the commands the servers
ran over ``--seconds`` seconds (``INFO commandstats`` on every server, read before and after;
the reads themselves are taken off) and the connections it holds on each (``CLIENT LIST``, the
measuring connection taken off). Transports (``--transports``):

- ``redis``: a private single ``redis-server``;
- ``cluster``: a private local 3-primary Redis Cluster (``bench/cluster.py``'s servers, spread
  layout, the default there); commands are summed over the three primaries, connections are
  given per node (the largest and the sum): a cluster's node-to-node bus links are not client
  connections and are not counted;
- ``amqp``: RabbitMQ (``BLITZQ_BENCH_AMQP_URL``, default ``amqp://guest:guest@127.0.0.1:5672/``,
  a fresh namespace whose queues are deleted afterwards; skipped when it does not answer) with
  the state store on the private single server. The Redis columns are the state store's; the
  AMQP connections are counted from the worker's side (its TCP sockets to the broker's port,
  ``/proc``) and its open channels as the worker's aio-pika connection reports them (the
  management API is not needed). AMQP frames (heartbeats, ``basic.get``) are not Redis
  commands and are not in the commands column.

Prints a Markdown table, and per run the busiest commands on stderr.

    .venv/bin/python bench/idle_cost.py                  # every transport, ~90 min
    .venv/bin/python bench/idle_cost.py --seconds 60     # quicker, may miss periodic steps
    .venv/bin/python bench/idle_cost.py --transports cluster --queues 16 --modes reliable
    .venv/bin/python bench/idle_cost.py --before ../main/src   # each row: another tree, then this
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (its private single server; capacity.py uses it too)
import cluster as cluster_bench  # noqa: E402  (its private single server and cluster)

from blitzq.broker.redis.doorbell import IDLE_BLOCK  # noqa: E402
from blitzq.worker.pruning import PRUNE_EVERY  # noqa: E402

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

#: Seconds measured per run by default: the longest period of an idle worker's periodic
#: steps (a stream's pruning, ``PRUNE_EVERY``; a cluster's safety look of a queue,
#: ``IDLE_BLOCK``), so every run counts each step at least once. A 60 s span missed them and
#: read low (2.72 commands/s on a 1-queue cluster where 300 s gave 2.84, bench/README.md).
DEFAULT_SECONDS = max(PRUNE_EVERY, IDLE_BLOCK)

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from blitzq import Queue, Worker

    url, amqp, ns, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    queue = Queue("q0", redis_url=url, amqp_url=amqp or None, namespace=ns, mode=mode)

    @queue.task(name="noop")
    async def noop() -> int:
        return 1

    def channels(worker) -> int:
        try:
            conn = worker.broker.transport.link._conn
            return len(conn.transport.connection.channels)
        except AttributeError:
            return -1

    async def main() -> None:
        worker = Worker(queue, queues=[f"q{i}" for i in range(n)])
        runner = asyncio.create_task(worker.run())
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "stats":
            print(json.dumps({"channels": channels(worker)}), flush=True)
        worker.stop()
        await runner

    asyncio.run(main())
    """
)


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _amqp_sockets(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` to remote ``port`` (its socket descriptors matched
    against ``/proc/<pid>/net/tcp``; IPv4 and IPv6)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                remote, state, inode = fields[2], fields[3], fields[9]
                if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def measure(
    ports: list[int],
    url: str,
    amqp: str,
    mode: str,
    queues: int,
    seconds: float,
    settle: float,
    source: str | None = None,
) -> dict[str, float]:
    """Run one idle worker on ``queues`` queues in ``mode``; the commands/s the servers on
    ``ports`` ran and the connections it holds there.

    Args:
        ports: the Redis servers to count on (one, or the cluster's primaries).
        url: the worker's ``redis_url``.
        amqp: its ``amqp_url`` (``""``: the Redis transport).
        source: a ``src`` directory the worker imports blitzq from (another tree, for a
            before/after pair in one run); ``None``: this process's.

    Returns:
        ``commands_per_s`` (all servers), ``busiest_node_per_s``, ``connections`` (the sum
        over the servers), ``connections_max`` (the most on one server), for AMQP
        ``amqp_connections`` and ``amqp_channels``, and the busiest commands' rates.
    """
    ns = f"idle-{uuid.uuid4().hex[:8]}"
    clients = [redis.Redis(port=p) for p in ports]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, amqp, ns, mode, str(queues)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    out: dict[str, float] = {}
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        child.stdout.readline()
        time.sleep(settle)
        before = [_commands(c) for c in clients]
        start = time.monotonic()
        time.sleep(seconds)
        after = [_commands(c) for c in clients]
        span = time.monotonic() - start
        lists = [c.client_list() for c in clients]
        held = [len(found) - 1 for found in lists]
        for port, found in zip(ports, lists, strict=True):
            seen = ", ".join(f"{c['cmd']} (age {c['age']} s, idle {c['idle']} s)" for c in found)
            print(f"{mode} x{queues} on {port}: {seen}", file=sys.stderr)
        if amqp:
            child.stdin.write(b"stats\n")
            child.stdin.flush()
            out["amqp_channels"] = json.loads(child.stdout.readline())["channels"]
            out["amqp_connections"] = _amqp_sockets(child.pid, urlsplit(amqp).port or 5672)
        child.stdin.write(b"\n")
        child.stdin.flush()
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    total: dict[str, int] = {}
    per_node = []
    for b, a in zip(before, after, strict=True):
        deltas = {k: a.get(k, 0) - b.get(k, 0) for k in a}
        deltas["info"] = deltas.get("info", 0) - 1  # the "after" read; "before" counted itself
        per_node.append(sum(v for v in deltas.values() if v > 0))
        for k, v in deltas.items():
            total[k] = total.get(k, 0) + v
    out["commands_per_s"] = sum(per_node) / span
    out["busiest_node_per_s"] = max(per_node) / span
    out["connections"] = float(sum(held))
    out["connections_max"] = float(max(held))
    for name, calls in sorted(total.items(), key=lambda kv: -kv[1])[:12]:
        if calls > 0:
            out[name] = calls / span
    for c in clients:
        keys = list(c.scan_iter(match=f"*{ns}*", count=1000))
        for key in keys:
            c.delete(key)  # one key per call: a cluster node refuses a cross-slot DEL
        c.close()
    if amqp:
        _delete_amqp_queues(amqp, ns, queues)
    return out


def _delete_amqp_queues(amqp: str, ns: str, queues: int) -> None:
    """Delete the RabbitMQ queues of namespace ``ns`` (only the run's own)."""
    import asyncio

    from blitzq.broker.amqp.channels import DEAD_LETTER_SUFFIX, AmqpLink

    async def go() -> None:
        link = AmqpLink(amqp, "bench-cleanup", 1)
        names = [f"{ns}.q{i}{lvl}" for i in range(queues) for lvl in ("", ":high", ":low")]
        try:
            await link.delete([*names, f"{ns}.{DEAD_LETTER_SUFFIX}"])
        finally:
            await link.close()

    asyncio.run(go())


def _answers(url: str) -> bool:
    """Whether something accepts TCP connections at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 1.0):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _servers(need_cluster: bool) -> Iterator[tuple[int, list[int]]]:
    """(single server's port, the cluster's primaries' ports or none)."""
    if need_cluster:
        with cluster_bench.servers() as (single, nodes):
            yield single, nodes
        return
    with harness.private_redis() as url:
        yield urlsplit(url).port or 6379, []


def parser() -> argparse.ArgumentParser:
    """The command line's options (``--seconds`` defaults to :data:`DEFAULT_SECONDS`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transports", default="redis,cluster,amqp")
    parser.add_argument("--queues", default="1,4,16", help="numbers of queues, comma-separated")
    parser.add_argument("--modes", default="reliable,fast", help="Redis modes (amqp: reliable)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"measured span per run (default {DEFAULT_SECONDS:g}: one whole period of "
        "each periodic step, each stream's pruning every 300 s and a cluster's safety look "
        "of each queue every 120 s with a few queues, one per 30 s / 15 s with many; a "
        "shorter span may miss them)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=40.0,
        help="seconds before measuring (start-up's extra "
        "pooled connections close after 30 s unused)",
    )
    parser.add_argument(
        "--before",
        metavar="SRC",
        help="also run each row with blitzq imported from this src directory (another "
        "tree), just before this tree's run of the row",
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    transports = args.transports.split(",")
    amqp = os.environ.get("BLITZQ_BENCH_AMQP_URL", DEFAULT_AMQP_URL)
    if "amqp" in transports and not _answers(amqp):
        print(f"RabbitMQ does not answer at {amqp}: no amqp rows", file=sys.stderr)
        transports.remove("amqp")
    rows = []
    with _servers("cluster" in transports) as (single, nodes):
        for transport in transports:
            ports = nodes if transport == "cluster" else [single]
            url = (
                f"redis+cluster://127.0.0.1:{nodes[0]}/0"
                if transport == "cluster"
                else f"redis://127.0.0.1:{single}/0"
            )
            modes = ["reliable"] if transport == "amqp" else args.modes.split(",")
            for mode in modes:
                for n in (int(x) for x in args.queues.split(",")):
                    trees = [("before", args.before), ("", None)] if args.before else [("", None)]
                    for label, source in trees:
                        got = measure(
                            ports,
                            url,
                            amqp if transport == "amqp" else "",
                            mode,
                            n,
                            args.seconds,
                            args.settle,
                            source,
                        )
                        busiest = ", ".join(
                            f"{k} {v:.2f}/s" for k, v in got.items() if k not in _COLUMNS
                        )
                        name = f"{transport} {label}".strip()
                        print(f"{name} {mode} x{n}: {busiest}", file=sys.stderr)
                        rows.append((name, mode, n, got))
    print(
        "| transport | mode | queues (x3 levels) | commands/s (all servers) | busiest server "
        "| connections (per server, max / total) | AMQP connections / channels |"
    )
    print("|---|---|---|---|---|---|---|")
    for transport, mode, n, got in rows:
        amqp_cell = (
            f"{int(got['amqp_connections'])} / {int(got['amqp_channels'])}"
            if "amqp_channels" in got
            else "-"
        )
        print(
            f"| {transport} | {mode} | {n} | {got['commands_per_s']:.2f} "
            f"| {got['busiest_node_per_s']:.2f} "
            f"| {int(got['connections_max'])} / {int(got['connections'])} | {amqp_cell} |"
        )


_COLUMNS = (
    "commands_per_s",
    "busiest_node_per_s",
    "connections",
    "connections_max",
    "amqp_connections",
    "amqp_channels",
)


if __name__ == "__main__":
    main()
