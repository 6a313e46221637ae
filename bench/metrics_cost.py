"""What Prometheus metrics cost a worker per task: paired drains, a profile, the observer alone.

Usage::

    .venv/bin/python bench/metrics_cost.py [--tasks 20000] [--pairs 7] [--profile] [--micro]

Starts a private ``redis-server`` like ``bench.py`` (never the shared 6379). Modes:

- paired (default): ``--pairs`` times, one in-process ``Worker(concurrency=200)`` drains
  ``--tasks`` pre-enqueued no-op async tasks (reliable mode, results stored) with metrics off,
  then the same with metrics on (``Worker(metrics_port=0)``); the order inside each pair
  alternates (off-on, on-off, ...). Reported: the median of the per-pair on/off ratios of
  tasks/s (wall time) and of CPU seconds of this process (``time.process_time``: the worker
  runs in it), the median CPU per task of each side and their difference, and the load
  average (the machine is shared).
- ``--profile``: one drain of each under ``cProfile``; prints the top frames by own time and
  every frame of ``blitzq/worker/metrics.py``, ``tally.py`` and ``outcomes.outcome_kind``.
- ``--micro``: the observer alone, timed with ``timeit``: the per-task cost without the rest
  of the worker around it. Two paths: a completion without a delivery token (fast mode:
  ``started`` + ``committed``, counted at once) and a fenced one (reliable mode: ``started`` +
  ``committed``, which marks it, + ``written`` of its batch, which counts it once the broker
  applied it, called here per batch of 100 as the flusher does).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as harness  # the sibling script: its server and drain

from blitzq import Queue, Worker
from blitzq.broker import Completion
from blitzq.broker.transport import Delivery
from blitzq.serialization import Envelope
from blitzq.worker.execution import Job

MODE, STORE = "reliable", True


async def paired(url: str, tasks: int, pairs: int) -> None:
    """Alternate drains with metrics off and on; print the medians."""
    client = harness.aioredis.Redis.from_url(url)
    rate_ratios, cpu_ratios, cpu_on, cpu_off, rates_on, rates_off = [], [], [], [], [], []
    loads = [os.getloadavg()[0]]
    try:
        await harness.drain_measured(url, client, MODE, STORE, 2000, True)  # warm-up
        for pair in range(pairs):
            got: dict[bool, tuple[float, float]] = {}
            for metrics in (False, True) if pair % 2 == 0 else (True, False):
                got[metrics] = await harness.drain_measured(
                    url, client, MODE, STORE, tasks, metrics
                )
            (r_on, c_on), (r_off, c_off) = got[True], got[False]
            rate_ratios.append(r_on / r_off)
            cpu_ratios.append(c_on / c_off)
            cpu_on.append(c_on / tasks * 1e6)
            cpu_off.append(c_off / tasks * 1e6)
            rates_on.append(r_on)
            rates_off.append(r_off)
            loads.append(os.getloadavg()[0])
            print(
                f"  pair {pair + 1}: on {r_on:,.0f}/s {c_on / tasks * 1e6:.2f} us/task, "
                f"off {r_off:,.0f}/s {c_off / tasks * 1e6:.2f} us/task",
                file=sys.stderr,
            )
    finally:
        await client.aclose()
    diffs = [a - b for a, b in zip(cpu_on, cpu_off, strict=True)]
    med = statistics.median
    print(f"drain {tasks:,} no-op, {MODE}, results stored, {pairs} pairs")
    print(f"load average (1 min) during the run: {min(loads):.1f} - {max(loads):.1f}")
    print(f"tasks/s: on {med(rates_on):,.0f}, off {med(rates_off):,.0f}")
    print(f"wall: median on/off ratio of tasks/s {med(rate_ratios):.3f}")
    print(f"CPU: on {med(cpu_on):.2f} us/task, off {med(cpu_off):.2f} us/task")
    print(f"CPU: median on/off ratio {med(cpu_ratios):.3f}, median difference "
          f"{med(diffs):+.2f} us/task")  # fmt: skip


async def profile(url: str, tasks: int) -> None:
    """One cProfiled drain with metrics off and one with metrics on; print the top frames."""
    client = harness.aioredis.Redis.from_url(url)
    try:
        for metrics in (False, True):
            prof = cProfile.Profile()
            prof.enable()
            await harness.drain_measured(url, client, MODE, STORE, tasks, metrics)
            prof.disable()
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
            stats.print_stats(18)
            stats.print_stats("metrics.py|tally.py|outcome_kind")
            print(f"===== metrics {'on' if metrics else 'off'} =====")
            print(out.getvalue())
    finally:
        await client.aclose()


def micro(number: int = 200_000) -> None:
    """The observer's calls per run on one real job, timed alone (both paths)."""
    from blitzq.worker.metrics import RunMetrics

    queue = Queue(redis_url="redis://127.0.0.1:1", namespace="micro")

    @queue.task(name="micro.noop")
    async def noop() -> None:
        return None

    worker = Worker(queue, metrics_port=0)
    metrics = RunMetrics(worker)
    now = time.time()
    envelope = Envelope("id-1", "micro.noop", "default", enqueued_at=now - 0.002)
    job = Job(Delivery("default", b"1-0", b"", 1), envelope, noop)
    job.started_at = now

    def unfenced() -> None:
        metrics.started(job)
        metrics.committed(job, None, None, False)

    best = min(timeit.repeat(unfenced, number=number, repeat=5))
    print(f"observer alone, no token: {best / number * 1e9:.0f} ns per run (started + committed)")
    times = []
    for _ in range(5):  # fresh completions each time: committed marks them, written counts
        batch = [Completion("default", b"1-0", "id-1", b"record") for _ in range(number)]
        t0 = time.perf_counter()
        for i in range(0, number, 100):  # the flusher's batches (up to 100 when busy)
            part = batch[i : i + 100]
            for c in part:
                metrics.started(job)
                metrics.committed(job, c, None, False)
            metrics.written(part, [])
        times.append(time.perf_counter() - t0)
    print(f"observer alone, fenced: {min(times) / number * 1e9:.0f} ns per run (started + "
          "committed, written per batch of 100; the batch loop included)")  # fmt: skip


def main() -> None:
    """Parse arguments, start the private server, run the chosen mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile one drain of each")
    parser.add_argument("--micro", action="store_true", help="time the observer alone")
    args = parser.parse_args()
    if args.micro:
        micro()
        return
    with harness.private_redis() as url:
        if args.profile:
            asyncio.run(profile(url, args.tasks))
        else:
            asyncio.run(paired(url, args.tasks, args.pairs))


if __name__ == "__main__":
    main()
