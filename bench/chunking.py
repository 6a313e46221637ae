"""How long one blitzq call holds the Redis server, at any batch size (issue 8, section 1).

Starts a private ``redis-server`` on a free port (never the shared one), then runs big batch
operations of the product while a second connection PINGs the server in a tight loop. For
each operation it prints:

- ``longest mean per call``: from ``INFO commandstats``, the command with the largest mean
  server time per call, in milliseconds (``EXEC`` counts a whole transaction, whose inner
  commands the slowlog lists one by one; the chunks of one operation are the same size, so
  the mean is what each chunk costs, robust against the server being descheduled once);
- ``longest single entry``: the longest ``SLOWLOG`` entry (commands over 1 ms are logged),
  in milliseconds; on a loaded machine one entry may include time the server was
  descheduled;
- ``worst PING``: the longest a PING from another process waited, in milliseconds (a round
  trip, so on a loaded machine it includes that process's own scheduling);
- ``calls``: commands the server ran for the operation (``INFO commandstats``; a
  transaction counts its inner commands and ``EXEC``; commands run by scripts are not
  counted).

Usage::

    .venv/bin/python bench/chunking.py             # 50k and 100k items
    .venv/bin/python bench/chunking.py --sizes 10000

The bound the product aims at is about 20 ms per call at any batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from blitzq import Queue
from blitzq.broker import Completion, DeadLetterFields
from blitzq.limits import COMPLETION_BATCH_ITEMS


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server (no persistence); returns the process and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    port = free_port()
    directory = tempfile.mkdtemp(prefix="blitzq-bench-chunking-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", directory, "--slowlog-log-slower-than", "1000", "--slowlog-max-len", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        with contextlib.suppress(redis.RedisError, OSError):
            if redis.Redis.from_url(url).ping():
                return proc, url
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def probe(url: str, stop: Any, worst: Any) -> None:
    """PING in a loop (in its own process) until ``stop`` is set; keep the longest round
    trip (seconds) in ``worst.value``."""
    client = redis.Redis.from_url(url)
    while not stop.is_set():
        t = time.perf_counter()
        client.ping()
        worst.value = max(worst.value, time.perf_counter() - t)
        time.sleep(0.001)
    client.close()


async def measure(url: str, label: str, run: Callable[[], Awaitable[Any]]) -> None:
    """Run ``run`` under the PING probe and print one table row."""
    admin = redis.Redis.from_url(url)
    stop, worst = multiprocessing.Event(), multiprocessing.Value("d", 0.0)
    pinger = multiprocessing.Process(target=probe, args=(url, stop, worst), daemon=True)
    pinger.start()
    time.sleep(0.2)
    admin.slowlog_reset()
    admin.config_resetstat()
    began = time.perf_counter()
    await run()
    elapsed = time.perf_counter() - began
    stats = admin.info("commandstats")
    entries = [
        e for e in admin.slowlog_get(10_000_000) if e["command"].split(b" ")[0].upper() not in _OURS
    ]
    stop.set()
    pinger.join(10)
    longest = max(entries, key=lambda e: e["duration"]) if entries else None
    slow = longest["duration"] / 1000 if longest else 0.0
    slow_name = longest["command"].split(b" ")[0].decode().upper() if longest else "-"
    means = {
        name.removeprefix("cmdstat_").upper(): float(v["usec_per_call"]) / 1000
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").encode().upper() not in _OURS
    }
    calls = sum(
        int(v["calls"])
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").encode().upper() not in _OURS
    )
    top = max(means, key=lambda k: means[k]) if means else "-"
    print(
        f"| {label} | {means.get(top, 0.0):.1f} ({top}) | {slow:.1f} ({slow_name}) "
        f"| {worst.value * 1000:.1f} | {calls} | {elapsed:.2f} |",
        flush=True,
    )
    admin.close()


#: Commands of the measurement itself, left out of the figures.
_OURS = {b"PING", b"SLOWLOG", b"CONFIG", b"INFO", b"HELLO", b"CLIENT"}


async def main(sizes: list[int]) -> None:
    """Print the table for each batch size."""
    proc, url = start_server()
    try:
        print(
            "| operation | longest mean per call, ms | longest single entry, ms "
            "| worst PING, ms | calls | total, s |"
        )
        print("|---|---|---|---|---|---|")
        for n in sizes:
            for mode in ("reliable", "fast"):
                ns = f"bench-chunk-{uuid.uuid4().hex[:8]}"
                queue = Queue(redis_url=url, namespace=ns, mode=mode)  # type: ignore[arg-type]

                @queue.task(name="bench.noop")
                async def noop(i: int) -> None:
                    return None

                await noop.enqueue(0)
                items = [(i,) for i in range(n)]
                await measure(
                    url,
                    f"{mode}: enqueue_many {n:,} delayed",
                    lambda noop=noop, items=items: noop.options(delay=3600).enqueue_many(items),
                )
                await measure(
                    url,
                    f"{mode}: enqueue_many {n:,}",
                    lambda noop=noop, items=items: noop.enqueue_many(items),
                )
                await measure(url, f"{mode}: purge_queue {n:,}", queue.purge_queue)
                await queue.close()
            ns = f"bench-chunk-{uuid.uuid4().hex[:8]}"
            tracked = Queue(redis_url=url, namespace=ns, track_state=True)

            @tracked.task(name="bench.noop")
            async def tracked_noop(i: int) -> None:
                return None

            await tracked_noop.enqueue(0)
            await measure(
                url,
                f"track_state: enqueue_many {n:,}",
                lambda t=tracked_noop, n=n: t.enqueue_many([(i,) for i in range(n)]),
            )
            dead = [
                Completion(
                    "q", None, f"d{i}", dead_letter=DeadLetterFields(b"m" * 100, "failed", "e",
                                                                     "t", "q", time.time())
                )
                for i in range(n)
            ]  # fmt: skip
            broker = tracked.broker
            for start in range(0, n, 2000):  # as the worker's flusher would add them
                await broker.complete(dead[start : start + 2000])
            await measure(
                url, f"dead letters: list {n:,}", lambda t=tracked, n=n: t.dead_letters(n)
            )
            await measure(url, f"dead letters: purge {n:,}", tracked.purge_dead_letters)
            await tracked.close()
        ns = f"bench-chunk-{uuid.uuid4().hex[:8]}"
        flushing = Queue(redis_url=url, namespace=ns)
        records = [
            Completion("q", None, f"r{i}", record=b"\x80" + b"r" * 200, record_ttl=60)
            for i in range(COMPLETION_BATCH_ITEMS)
        ]
        await measure(
            url,
            f"flusher batch: {COMPLETION_BATCH_ITEMS:,} completions with records",
            lambda: flushing.broker.complete(records),
        )
        await flushing.close()
    finally:
        proc.kill()
        proc.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="50000,100000", help="comma-separated batch sizes")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")]))
