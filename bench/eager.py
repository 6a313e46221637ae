"""The eager test mode's cost in a user's test: one ``enqueue`` + ``result``, and a retried task.

What a user's test does under the ``blitzq_eager`` fixture, timed in one process (the eager
mode needs no server: the memory backend is this process's private Valkey, started on the
first enqueue, which the warm-up pays for):

- ``async``: ``handle = await task.enqueue(i); await handle.result(timeout=5)`` of an async
  task that returns its argument, ``--n`` times in a row after ``--warmup`` trips;
- ``sync``: ``task.enqueue_sync(i).result_sync(timeout=5)``, the same (the sync API's loop);
- ``track_state``: the async trip on a Queue with ``track_state=True`` (records written at
  enqueue and at start too, as the dashboard needs);
- ``retried``: a task with the default retry policy (3 retries, backoff 1, 2, 4 s with full
  jitter) that fails three times and then succeeds: the time from ``enqueue`` to its result,
  ``--retried`` times (in production that waits the backoff: about 3.5 s on average);
- ``failed``: a task that raises at once with ``retries=0``: ``enqueue`` + ``result()``
  raising the task's exception (``TaskFailed`` on a tree without propagation).

Each row shows the median, p90 and the slowest trip in milliseconds, and the wall time the
trips would cost a suite of 1,000 enqueues (the mean times 1,000). Run::

    .venv/bin/python bench/eager.py [--n 300] [--warmup 20] [--retried 5]

The Markdown table goes to stdout, progress to stderr. Figures are in bench/README.md
("Eager test mode") and docs/testing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import blitzq
from blitzq import Queue, TaskFailed
from blitzq.testing import eager


class Boom(Exception):
    """The failing task's own exception."""


def summary(label: str, samples: list[float]) -> str:
    """One Markdown row: median, p90, max (ms) and the cost of 1,000 such trips (s)."""
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    mean = statistics.fmean(ordered)
    return (
        f"| {label} | {len(ordered)} | {statistics.median(ordered):.2f} | {p90:.2f} | "
        f"{ordered[-1]:.2f} | {mean:.1f} |"
    )


async def timed(n: int, warmup: int, trip: Callable[[int], Awaitable[None]]) -> list[float]:
    """Run ``trip(i)`` ``warmup + n`` times; the last ``n`` durations in ms."""
    samples = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        await trip(i)
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1000)
    return samples


def make_queue(namespace: str, **options: bool) -> tuple[Queue, dict[str, object]]:
    """A Queue as a user's app has it (no URL), with the measured tasks."""
    queue = Queue(namespace=namespace, **options)  # type: ignore[arg-type]
    calls: dict[str, int] = {}

    @queue.task(name="bench.echo")
    async def echo(i: int) -> int:
        return i

    @queue.task(name="bench.echo_sync")
    def echo_sync(i: int) -> int:
        return i

    @queue.task(name="bench.flaky")  # the default retries: 3, backoff 1, 2, 4 s (full jitter)
    async def flaky(key: str) -> str:
        calls[key] = calls.get(key, 0) + 1
        if calls[key] <= 3:
            raise Boom(f"attempt {calls[key]}")
        return key

    @queue.task(name="bench.boom", retries=0)
    async def boom() -> None:
        raise Boom("no")

    return queue, {"echo": echo, "echo_sync": echo_sync, "flaky": flaky, "boom": boom}


async def measure(args: argparse.Namespace) -> list[str]:
    """Every row of the table (see the module docstring)."""
    rows = []
    with eager():
        queue, tasks = make_queue("bench-eager")
        echo, flaky, boom = tasks["echo"], tasks["flaky"], tasks["boom"]

        async def trip(i: int) -> None:
            handle = await echo.enqueue(i)  # type: ignore[attr-defined]
            assert await handle.result(timeout=5) == i

        started = time.perf_counter()
        await trip(-1)
        print(
            f"first enqueue (starts the private Valkey): {time.perf_counter() - started:.2f} s",
            file=sys.stderr,
        )
        rows.append(summary("async: enqueue + result", await timed(args.n, args.warmup, trip)))
        print("async done", file=sys.stderr)

        echo_sync = tasks["echo_sync"]

        def sync_trips() -> list[float]:
            samples = []  # the sync API from plain code: the portal's loop does the work
            for i in range(args.warmup + args.n):
                t0 = time.perf_counter()
                assert echo_sync.enqueue_sync(i).result_sync(timeout=5) == i  # type: ignore[attr-defined]
                if i >= args.warmup:
                    samples.append((time.perf_counter() - t0) * 1000)
            return samples

        rows.append(
            summary("sync: enqueue_sync + result_sync", await asyncio.to_thread(sync_trips))
        )
        print("sync done", file=sys.stderr)

        tracked, tracked_tasks = make_queue("bench-eager-tracked", track_state=True)
        tracked_echo = tracked_tasks["echo"]

        async def tracked_trip(i: int) -> None:
            handle = await tracked_echo.enqueue(i)  # type: ignore[attr-defined]
            assert await handle.result(timeout=5) == i

        rows.append(
            summary("async, track_state=True", await timed(args.n, args.warmup, tracked_trip))
        )
        print("track_state done", file=sys.stderr)

        async def failed_trip(i: int) -> None:
            handle = await boom.enqueue()  # type: ignore[attr-defined]
            try:
                await handle.result(timeout=5)
            except (Boom, TaskFailed):
                return
            raise AssertionError("the task did not fail")

        rows.append(
            summary(
                "failed task: enqueue + result raises",
                await timed(args.n, args.warmup, failed_trip),
            )
        )
        print("failed done", file=sys.stderr)

        async def retried_trip(i: int) -> None:
            handle = await flaky.enqueue(f"k{i}")  # type: ignore[attr-defined]
            assert await handle.result(timeout=30) == f"k{i}"

        rows.append(
            summary(
                "3 retries (default policy), then success",
                await timed(args.retried, 0, retried_trip),
            )
        )
        await queue.close()
        await tracked.close()
        queue.close_sync()
        tracked.close_sync()
    return rows


def main() -> None:
    """Parse the options, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=300, help="timed trips per row")
    parser.add_argument("--warmup", type=int, default=20, help="untimed trips first")
    parser.add_argument("--retried", type=int, default=5, help="retried tasks timed")
    args = parser.parse_args()
    print(
        f"blitzq {getattr(blitzq, '__version__', '?')} from {os.path.dirname(blitzq.__file__)}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    rows = asyncio.run(measure(args))
    print("| trip | n | median ms | p90 ms | max ms | 1,000 trips (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
