"""Client CPU instructions per enqueued no-argument message, counted by callgrind (steady on a
loaded machine, unlike the wall clock), for one or more source trees side by side.

For each tree (``--src``, default this one's ``src``) and each way of enqueueing -- ``one``
(``await task.enqueue()`` one at a time) and ``many`` (``enqueue_many`` of 1,000 calls) --
a child Python runs under ``valgrind --tool=callgrind`` twice, with a small and a large count,
and the difference of the two totals over the difference of the counts is the cost of one
message: start-up, imports and connecting cancel out. ``PYTHONHASHSEED=0`` makes the runs
repeatable. The server is a private ``redis-server`` (``bench.py``'s) unless ``--redis-url``.

    python bench/enqueue_instructions.py --src /work/main/src --src src

Prints one row per tree and way: instructions per message, and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (the sibling script: its private server)

#: The child: enqueue ``n`` messages of a no-argument task in a fresh namespace.
CHILD = """
import asyncio, sys, uuid
import redis
from blitzq import Queue

how, n, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]

async def main():
    namespace = "instr-" + uuid.uuid4().hex[:8]
    queue = Queue("default", redis_url=url, namespace=namespace)

    @queue.task(name="bench.noop")
    async def noop():
        return None

    await noop.enqueue()  # connect and register the queue outside the difference
    if how == "one":
        for _ in range(n):
            await noop.enqueue()
    else:
        for _ in range(n // 1000):
            await noop.enqueue_many([()] * 1000)
    await queue.close()
    client = redis.Redis.from_url(url)  # this run's keys only
    for key in list(client.scan_iter(match="{" + namespace + "}*", count=1000)):
        client.delete(key)
    client.close()

asyncio.run(main())
"""

#: (small count, large count) per way.
COUNTS = {"one": (200, 2200), "many": (1000, 21000)}


def instructions(src: str, how: str, n: int, url: str) -> int:
    """Instructions callgrind counts for one child run.

    Raises:
        RuntimeError: the child failed, or callgrind printed no total.
    """
    env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
    valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*valgrind, sys.executable, "-c", CHILD, how, str(n), url],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def per_message(src: str, how: str, url: str) -> float:
    """Instructions of one message enqueued ``how`` by the tree at ``src``."""
    small, large = COUNTS[how]
    return (instructions(src, how, large, url) - instructions(src, how, small, url)) / (
        large - small
    )


def main() -> None:
    """Parse the arguments, measure, print the table (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", help="a tree's src directory (repeatable)")
    parser.add_argument("--redis-url", help="use this server instead of a private one")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    trees = args.src or [str(HERE.parent / "src")]

    def run(url: str) -> None:
        print("| tree | way | instructions per message | over the first tree |")
        print("|---|---|---:|---:|")
        for how in COUNTS:
            first = None
            for src in trees:
                cost = per_message(src, how, url)
                first = first or cost
                print(f"| {src} | {how} | {cost:,.0f} | {cost / first:.3f} |", flush=True)

    if args.redis_url:
        run(args.redis_url)
    else:
        with harness.private_redis() as url:
            run(url)


if __name__ == "__main__":
    main()
