"""What the dashboard's index of ended tasks costs a worker per task: paired drains with
``Queue(recent_index=10_000)`` (the default) against ``recent_index=0``.

Usage::

    .venv/bin/python bench/recent_index.py [--tasks 20000] [--pairs 7] [--micro]

Starts a private ``redis-server`` like ``bench.py`` (never the shared 6379). Two set-ups:
reliable mode with results stored and fast mode with ``store_results=False`` (nothing else is
written per task: the notes are then the only write); either way the notes are written once
a second, one entry per queue, off the completions' batches. For each, ``--pairs`` times,
one in-process ``Worker(concurrency=200)`` drains ``--tasks`` pre-enqueued no-op async
tasks with the index on, then off (the order alternating inside each pair). A drain ends
when the broker shows every task done; the index is then checked full (not timed: the
once-a-second notes may still be on their way).
Reported per set-up: the median of the per-pair on/off ratios of tasks/s and of this
process's CPU seconds (the worker runs in it), the median CPU per task of each side, and the
index's memory in Redis (``MEMORY USAGE`` of one full queue's index and its notes, bytes per
note). The server's instructions per note: ``bench/server_instructions.py --notes``.

``--micro`` times the worker's two parts alone (best of 5): the note of one run
(``EndNotes.note``, ``timeit``) and the once-a-second write of 20,000 pending notes
(``EndNotes.flush``: this process's CPU per note, and the call's wall time).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as harness  # the sibling script: its server, Bench and worker helpers

from blitzq import Worker

SETUPS = (("reliable", True), ("fast", False))


async def drain(url: str, mode: str, store: bool, n: int, index: bool) -> tuple[float, float, int]:
    """One drain: tasks/s, CPU seconds of this process, and the index's bytes in Redis."""
    bench = harness.Bench(url, mode, store, "recent")
    bench.queue.recent_index = 10_000 if index else 0
    redis = harness.aioredis.Redis.from_url(url)
    try:
        handles = []
        for start in range(0, n, harness.BATCH):
            handles += await bench.task.enqueue_many([()] * min(harness.BATCH, n - start))
        last_id = handles[-1].id
        bench.target = n
        index_key = bench.keys.ended(harness.QUEUE)
        notes_key = bench.keys.ended_notes(harness.QUEUE)
        worker = Worker(bench.queue, concurrency=harness.DRAIN_CONCURRENCY)
        cpu0, t0 = time.process_time(), time.perf_counter()
        runner = await harness._run_worker(worker)
        await asyncio.wait_for(bench.all_ran.wait(), harness.DEADLINE)

        async def done() -> bool:
            return await harness._broker_done(redis, bench, store, last_id)

        async def indexed() -> bool:  # the index's '#' is scored minus the notes it holds
            return -(await redis.zscore(index_key, "#") or 0) >= min(n, 10_000)

        await harness.wait_until(done, "completions", 0.001)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        size = 0
        if index:  # not timed: notes without a completion are written once a second
            await harness.wait_until(indexed, "the index", 0.01)
            for key in (index_key, notes_key):
                size += int(await redis.memory_usage(key, samples=0) or 0)
        await harness._stop_worker(worker, runner)
        return n / elapsed, cpu, size
    finally:
        await redis.aclose()
        await bench.close(redis)


async def paired(url: str, tasks: int, pairs: int) -> None:
    """Alternate drains with the index on and off, per set-up; print the medians."""
    med = statistics.median
    loads = [os.getloadavg()[0]]
    print(f"drain {tasks:,} no-op tasks, Worker(concurrency=200), {pairs} pairs per set-up")
    for mode, store in SETUPS:
        await drain(url, mode, store, 2000, True)  # warm-up
        rate_ratio, cpu_ratio, cpu_on, cpu_off, sizes = [], [], [], [], []
        for pair in range(pairs):
            got = {}
            for index in (True, False) if pair % 2 == 0 else (False, True):
                got[index] = await drain(url, mode, store, tasks, index)
            (r_on, c_on, size), (r_off, c_off, _) = got[True], got[False]
            rate_ratio.append(r_on / r_off)
            cpu_ratio.append(c_on / c_off)
            cpu_on.append(c_on / tasks * 1e6)
            cpu_off.append(c_off / tasks * 1e6)
            sizes.append(size)
            loads.append(os.getloadavg()[0])
            line = f"  {mode} store={store} pair {pair + 1}: on {r_on:,.0f}/s, off {r_off:,.0f}/s"
            print(line, file=sys.stderr)
        kept = min(tasks, 10_000)  # at least; whole entries go: up to one entry more
        print(
            f"{mode}, store_results={store}: on/off tasks/s {med(rate_ratio):.3f}, "
            f"CPU {med(cpu_ratio):.3f} ({med(cpu_on):.1f} vs {med(cpu_off):.1f} us/task); "
            f"index of {kept:,}+ notes: {med(sizes):,.0f} bytes "
            f"({med(sizes) / kept:.0f} per note)"
        )
    print(f"load average (1 min) during the run: {min(loads):.1f} - {max(loads):.1f}")


async def micro(url: str) -> None:
    """Time the note of one run and the write of 20,000 notes (module docstring)."""
    import timeit
    import uuid

    from blitzq import Queue
    from blitzq.broker import Completion
    from blitzq.broker.transport import Delivery
    from blitzq.serialization import Envelope
    from blitzq.worker.execution import Job
    from blitzq.worker.recent import EndNotes

    queue = Queue(redis_url=url, namespace=f"bench-micro-{uuid.uuid4().hex[:8]}")

    @queue.task(name="micro.noop")
    async def noop() -> None:
        return None

    job = Job(Delivery("default", b"1-0", b"", 1), Envelope("id-1", "micro.noop", "default"), noop)
    done = Completion("default", b"1-0", "id-1", b"record")
    notes = EndNotes(10_000, 86_400)
    notes.broker = queue.broker
    number = 200_000
    best = min(timeit.repeat(lambda: notes.note(job, done, None, False), number=number, repeat=5))
    print(f"EndNotes.note alone: {best / number * 1e9:.0f} ns per run")
    cpus, walls = [], []
    for _ in range(5):
        for n in range(20_000):
            notes.note(job, done, None, False)
            job.envelope.id = f"id-{n}"
        cpu0, t0 = time.process_time(), time.perf_counter()
        await notes.flush()
        cpus.append((time.process_time() - cpu0) / 20_000 * 1e6)
        walls.append((time.perf_counter() - t0) * 1e3)
    print(
        f"EndNotes.flush of 20,000 notes: {min(cpus):.2f} us of CPU per note, "
        f"{min(walls):.0f} ms per call (the server's share included)"
    )
    await queue.close()


def main() -> None:
    """Parse arguments, start the private server, run the pairs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--micro", action="store_true", help="time the note and the write alone")
    args = parser.parse_args()
    with harness.private_redis() as url:
        if args.micro:
            asyncio.run(micro(url))
        else:
            asyncio.run(paired(url, args.tasks, args.pairs))


if __name__ == "__main__":
    main()
