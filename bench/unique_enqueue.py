"""Unique enqueue before/after a change: two source trees, paired runs, ratios.

Usage::

    .venv/bin/python bench/unique_enqueue.py --before /path/to/old/src --after src \\
        [--n 3000] [--pairs 5]

Starts a private ``redis-server`` (``bench.py``'s, never the shared 6379); ``--amqp URL``
runs the RabbitMQ transport (state on that Redis; the bench's queues are deleted after).
Each pair runs the same child once per tree (``PYTHONPATH`` set to that tree, the order
alternating), each child in a fresh namespace, reliable mode, one producer awaiting each
enqueue:

- ``unique new``: ``n`` calls of a ``unique=True`` task with distinct arguments (each claims);
- ``unique dup``: ``n`` calls equal to one already queued (each a duplicate);
- ``unique many``: ``enqueue_many`` of ``n`` distinct calls in batches of 100;
- ``plain, unique on the queue``: ``n`` calls of a plain task of the same Queue (a Queue with a
  unique task has the unique enqueue filter, so every enqueue goes through the filters);
- ``plain``: ``n`` calls of a plain task on a Queue without filters (the one-round-trip path).

Reported: per kind, the median over pairs of the after/before ratio of calls per second
(above 1: the after tree is faster), each side's median rate, the producer's CPU per call
(``time.process_time``, microseconds) and the commands the producer's Redis clients sent
per call (round trips: a script call is one; exact, whatever the load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ["unique new", "unique dup", "unique many", "plain, unique on the queue", "plain"]


async def child(url: str, n: int, amqp: str | None) -> dict[str, float]:
    """Rates (calls per second) of each kind, in this process's blitzq (``amqp``: the
    RabbitMQ transport at that URL, state on the Redis at ``url``)."""
    from blitzq import Queue

    ns = "bench-" + uuid.uuid4().hex[:8]
    queue = Queue("bq-" + ns, redis_url=url, namespace=ns, amqp_url=amqp)
    bare = Queue("bp-" + ns, redis_url=url, namespace=ns, amqp_url=amqp)

    @queue.task(name="b.uniq", unique=True)
    async def uniq(x: int) -> None:
        return None

    @queue.task(name="b.plain")
    async def plain(x: int) -> None:
        return None

    @bare.task(name="b.bare")
    async def bare_task(x: int) -> None:
        return None

    await uniq.enqueue(-1)  # connections, queue registration, scripts loaded
    await plain.enqueue(-1)
    await bare_task.enqueue(-1)
    client = queue.broker.state.client
    trips = _Trips(client)
    bare_trips = _Trips(bare.broker.state.client)
    runs = {
        "unique new": lambda: _each(n, lambda i: uniq.enqueue(i)),
        "unique dup": lambda: _each(n, lambda i: uniq.enqueue(0)),
        "unique many": lambda: _batches(n, uniq),
        "plain, unique on the queue": lambda: _each(n, lambda i: plain.enqueue(i)),
        "plain": lambda: _each(n, lambda i: bare_task.enqueue(i)),
    }
    out: dict[str, float] = {}
    for kind, run in runs.items():
        commands = trips.count + bare_trips.count
        cpu, start = time.process_time(), time.perf_counter()
        await run()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        out[kind] = n / wall
        out[kind + " cpu"] = cpu / n * 1e6
        out[kind + " commands"] = (trips.count + bare_trips.count - commands) / n
    client = queue.broker.state.client
    keys = [k async for k in client.scan_iter(match="{" + ns + "}*", count=1000)]
    for at in range(0, len(keys), 500):
        await client.delete(*keys[at : at + 500])
    if amqp:  # the bench's queues (and their priority levels) go with it
        from blitzq.broker.amqp.channels import AmqpLink

        link = AmqpLink(amqp, "bench-cleanup", 1)
        used = {*queue.broker.transport.link.used, *bare.broker.transport.link.used}
        names = sorted(
            {
                n.removesuffix(":high").removesuffix(":low") + lv
                for n in used
                for lv in ("", ":high", ":low")
            }
        )
        await queue.close()
        await bare.close()
        await link.delete(names)
        await link.close()
        return out
    await queue.close()
    await bare.close()
    return out


async def _each(n: int, call: Any) -> None:
    for i in range(n):
        await call(i)


async def _batches(n: int, task: Any) -> None:
    for at in range(n, 2 * n, 100):
        await task.enqueue_many([(i,) for i in range(at, min(at + 100, 2 * n))])


class _Trips:
    """Counts the commands a Redis client sends (round trips: a script call is one)."""

    def __init__(self, client: Any) -> None:
        self.count = 0
        self._real = client.execute_command
        client.execute_command = self

    async def __call__(self, *args: Any, **options: Any) -> Any:
        self.count += 1
        return await self._real(*args, **options)


def run_side(src: str, url: str, n: int, amqp: str | None) -> dict[str, float]:
    """One child on the tree ``src``; its rates."""
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    extra = ["--amqp", amqp] if amqp else []
    done = subprocess.run(
        [sys.executable, __file__, "--child", url, "--n", str(n), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rates: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return rates


def main() -> None:
    """Paired runs of both trees; print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="src directory of the tree before the change")
    parser.add_argument("--after", default="src", help="src directory of the tree after it")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--amqp", help="RabbitMQ URL: the RabbitMQ transport, state on Redis")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args.n, args.amqp))))
        return
    if not args.before:
        parser.error("--before is required")
    import bench as harness

    ratios: dict[str, list[float]] = {k: [] for k in KINDS}
    sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with harness.private_redis() as url:
        for pair in range(args.pairs):
            order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
            got = {side: run_side(getattr(args, side), url, args.n, args.amqp) for side in order}
            for kind in KINDS:
                ratios[kind].append(got["after"][kind] / got["before"][kind])
            for side in order:
                sides[side].append(got[side])

    def med(side: str, field: str) -> float:
        return statistics.median(r[field] for r in sides[side])

    print(f"load average: {os.getloadavg()[0]:.2f}; n={args.n}, pairs={args.pairs}")
    print(
        f"{'kind':<28} {'after/before':>12} {'before /s':>10} {'after /s':>9}"
        f" {'cpu us b/a':>12} {'commands b/a':>13}"
    )
    for kind in KINDS:
        cpu = f"{med('before', kind + ' cpu'):.0f}/{med('after', kind + ' cpu'):.0f}"
        cmds = f"{med('before', kind + ' commands'):.2f}/{med('after', kind + ' commands'):.2f}"
        print(
            f"{kind:<28} {statistics.median(ratios[kind]):>12.2f} {med('before', kind):>10.0f}"
            f" {med('after', kind):>9.0f} {cpu:>12} {cmds:>13}"
        )


if __name__ == "__main__":
    main()
