"""How late does a delayed task start? blitzq's delay precision, idle and under load.

Method
------
The script starts a private ``redis-server`` (no persistence) on a free port, like
``bench/bench.py`` (whose helpers it imports), and an in-process ``Worker(concurrency=200)``
in a fresh namespace per condition. It enqueues ``--n`` tasks one after another, ``--spacing``
seconds apart, each with ``task.options(delay=d)`` where ``d`` is drawn uniformly from
``[--delay-min, --delay-max]`` (0.2-0.5 s), so due times are staggered and interleave with
enqueues. Just before each enqueue it reads ``t0 = time.time()``; the task's first statement
reads ``time.time()`` again (``start``). ``lateness = start - (t0 + d)``.

``blitzq`` computes the due time as ``time.time() + d`` inside ``enqueue``, a few microseconds
after ``t0``, so the lateness shown is an upper bound by those microseconds, and a negative
lateness is a certain early start ("early" column: how many; it must be 0).

Conditions:

* ``idle``: nothing else runs.
* ``load (producer process)``: a separate process enqueues no-op async tasks (results stored,
  the Queue's default) at ``--rate`` (5,000/s) with ``enqueue_many`` every 5 ms, and the same
  worker drains them while the delayed tasks are measured. The drained rate is reported.
* ``load (in-process producer)``: the same producer as an asyncio task in the worker's own
  process and event loop (harsher: the producer's Python work competes with the worker's).

Worker, scheduler and producer share one machine, so one clock: no skew is involved.
Run: ``.venv/bin/python bench/delay_precision.py [--n 300] [--quick] [--mode fast]``.
The Markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import delete_matching, new_namespace, private_redis

from blitzq import Queue, Task, Worker

NOOP = "delay.noop"
STAMP = "delay.stamp"
#: Seconds a condition may take before the script gives up.
DEADLINE = 60.0
#: Seconds of background load before measuring, so the drain is steady.
WARM_LOAD = 1.0
PRODUCER_TICK = 0.005


@dataclass
class Result:
    """Lateness samples (seconds) of one condition and the background rate it ran under."""

    label: str
    lateness: list[float]
    drained: float | None = None
    sent: float | None = None
    p50_target: float | None = None
    p95_target: float | None = None

    def percentile(self, p: float) -> float:
        """``p``-th percentile (nearest rank) of the samples, in seconds."""
        ordered = sorted(self.lateness)
        index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[index]

    @property
    def early(self) -> int:
        """Tasks that started before their due time."""
        return sum(1 for x in self.lateness if x < 0)

    def verdict(self) -> str:
        """``met`` or what was missed, against the targets of this condition."""
        missed = []
        if self.p50_target is not None and self.percentile(50) > self.p50_target:
            missed.append("p50")
        if self.p95_target is not None and self.percentile(95) > self.p95_target:
            missed.append("p95")
        if self.early:
            missed.append("early starts")
        return "met" if not missed else "MISSED: " + ", ".join(missed)

    def cells(self) -> list[str]:
        """Markdown cells of this row."""
        ms = [f"{self.percentile(p) * 1000:.2f}" for p in (50, 95, 99)]
        targets = []
        if self.p50_target is not None:
            targets.append(f"p50 <= {self.p50_target * 1000:.0f}")
        if self.p95_target is not None:
            targets.append(f"p95 <= {self.p95_target * 1000:.0f}")
        load = "-"
        if self.drained is not None:
            load = f"{self.sent:,.0f} sent / {self.drained:,.0f} drained"
        return [
            self.label,
            str(len(self.lateness)),
            *ms,
            f"{max(self.lateness) * 1000:.2f}",
            f"{min(self.lateness) * 1000:.2f}",
            str(self.early),
            load,
            ", ".join(targets) + " ms, never early: " + self.verdict(),
        ]


def build_queue(url: str, namespace: str, mode: str) -> tuple[Queue, dict[int, float]]:
    """A Queue with the stamping task (records its start time) and the no-op load task."""
    queue = Queue("default", redis_url=url, namespace=namespace, mode=mode)  # type: ignore[arg-type]
    starts: dict[int, float] = {}

    async def stamp(i: int) -> None:
        starts[i] = time.time()

    async def noop() -> None:
        return None

    queue.task(name=STAMP, store_result=False)(stamp)
    queue.task(name=NOOP)(noop)
    return queue, starts


async def produce(noop: Task[Any, Any], rate: float, stop: asyncio.Event) -> int:
    """Enqueue no-op tasks at ``rate`` per second until ``stop`` is set; return how many."""
    sent = 0
    start = time.monotonic()
    while not stop.is_set():
        owed = min(int((time.monotonic() - start) * rate) - sent, 2000)
        if owed > 0:
            await noop.enqueue_many([()] * owed)
            sent += owed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PRODUCER_TICK)
    return sent


async def producer_main(url: str, namespace: str, mode: str, rate: float) -> None:
    """Entry of the producer subprocess: produce until SIGTERM, then print count and seconds."""
    queue, _ = build_queue(url, namespace, mode)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    start = time.monotonic()
    sent = await produce(queue.tasks[NOOP], rate, stop)
    elapsed = time.monotonic() - start
    await queue.close()
    print(sent, elapsed, flush=True)


async def wait_for(check: Any, what: str) -> None:
    """Poll ``check()`` every 5 ms until true.

    Raises:
        TimeoutError: not true within ``DEADLINE`` seconds.
    """
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def measure(
    stamp: Task[Any, Any], starts: dict[int, float], args: argparse.Namespace, seed: int
) -> list[float]:
    """Enqueue the delayed tasks, wait until all ran, return their lateness (seconds)."""
    rng = random.Random(seed)
    expected: dict[int, float] = {}
    for i in range(args.n):
        delay = rng.uniform(args.delay_min, args.delay_max)
        t0 = time.time()
        await stamp.options(delay=delay).enqueue(i)
        expected[i] = t0 + delay
        await asyncio.sleep(args.spacing)
    await wait_for(lambda: all(i in starts for i in range(args.n)), "the delayed tasks")
    return [starts[i] - expected[i] for i in range(args.n)]


async def condition(url: str, label: str, load: str | None, args: argparse.Namespace) -> Result:
    """Run one condition: ``load`` is ``None``, ``"process"`` or ``"inprocess"``."""
    namespace = new_namespace("delay")
    queue, starts = build_queue(url, namespace, args.mode)
    stamp = queue.tasks[STAMP]
    worker = Worker(queue, concurrency=200)
    running = asyncio.create_task(worker.run())
    producer: subprocess.Popen[str] | None = None
    stop = asyncio.Event()
    local: asyncio.Task[int] | None = None
    try:
        # Warm up: one immediate and one delayed task, so connections, the consumer group and
        # the worker's event subscription all exist before the first measured enqueue.
        await stamp.enqueue(-1)
        await stamp.options(delay=0.05).enqueue(-2)
        await wait_for(lambda: -1 in starts and -2 in starts, "the warm-up tasks")
        if load == "process":
            producer = subprocess.Popen(
                [sys.executable, __file__, "--produce", url, namespace, args.mode, str(args.rate)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert producer.stdout is not None
            line = await asyncio.to_thread(producer.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError("the producer process did not start")
        elif load == "inprocess":
            local = asyncio.create_task(produce(queue.tasks[NOOP], args.rate, stop))
        if load:
            await asyncio.sleep(WARM_LOAD)
        done0, t0 = worker.processed, time.monotonic()
        lateness = await measure(stamp, starts, args, args.seed)
        drained = (worker.processed - done0 - args.n) / (time.monotonic() - t0)
        sent: float | None = None
        if producer is not None:
            producer.send_signal(signal.SIGTERM)
            out, _ = await asyncio.to_thread(producer.communicate, None, 30)
            count, elapsed = out.split()[-2:]
            sent = float(count) / float(elapsed)
            producer = None
        elif local is not None:
            stop.set()
            sent = (await local) / (time.monotonic() - t0 + WARM_LOAD)
            local = None
        result = Result(label, lateness)
        if load:
            result.drained, result.sent = drained, sent
            result.p95_target = args.load_p95 / 1000
        else:
            result.p50_target, result.p95_target = args.idle_p50 / 1000, args.idle_p95 / 1000
        return result
    finally:
        stop.set()
        if local is not None:
            await local
        if producer is not None:
            producer.kill()
            producer.wait()
        worker.stop()
        await asyncio.wait_for(running, timeout=60)
        await queue.close()
        client = aioredis.Redis.from_url(url)
        await delete_matching(client, "{" + namespace + "}:*")
        await client.aclose()


def render(results: list[Result]) -> str:
    """The Markdown table."""
    lines = [
        "| condition | tasks | p50 ms | p95 ms | p99 ms | max ms | min ms | early "
        "| background load (tasks/s) | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in results]
    return "\n".join(lines)


CONDITIONS = {
    "idle": ("idle", None),
    "load": ("5,000/s load (producer process)", "process"),
    "load-inprocess": ("5,000/s load (in-process producer)", "inprocess"),
}


async def run(url: str, args: argparse.Namespace) -> list[Result]:
    """Run the chosen conditions in order."""
    client = aioredis.Redis.from_url(url)
    server = (await client.info("server"))["redis_version"]
    await client.aclose()
    print(
        f"delay precision: Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"redis-server {server}, {os.cpu_count()} CPUs, mode={args.mode}, n={args.n}",
        file=sys.stderr,
    )
    results = []
    for name in args.only:
        label, load = CONDITIONS[name]
        if load:
            label = label.replace("5,000", f"{args.rate:,.0f}")
        t0 = time.perf_counter()
        results.append(await condition(url, label, load, args))
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return results


def main() -> None:
    """Parse arguments, start the private server, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=300, help="delayed tasks per condition")
    parser.add_argument("--quick", action="store_true", help="100 delayed tasks per condition")
    parser.add_argument("--spacing", type=float, default=0.01, help="seconds between enqueues")
    parser.add_argument("--delay-min", type=float, default=0.2)
    parser.add_argument("--delay-max", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=5000.0, help="background tasks/s")
    parser.add_argument("--mode", choices=("reliable", "fast"), default="reliable")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only", default="idle,load,load-inprocess", help=f"any of {', '.join(CONDITIONS)}"
    )
    parser.add_argument("--redis-url", default=None, help="use this server, not a private one")
    parser.add_argument("--idle-p50", type=float, default=2.0, help="target, ms")
    parser.add_argument("--idle-p95", type=float, default=5.0, help="target, ms")
    parser.add_argument("--load-p95", type=float, default=20.0, help="target, ms")
    parser.add_argument("--produce", nargs=4, metavar=("URL", "NS", "MODE", "RATE"), help=None)
    args = parser.parse_args()
    if args.produce:  # the background producer subprocess
        url, namespace, mode, rate = args.produce
        asyncio.run(producer_main(url, namespace, mode, float(rate)))
        return
    if args.quick:
        args.n = 100
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in args.only if n not in CONDITIONS]
    if unknown:
        parser.error(f"unknown condition(s) {unknown}; choose from {', '.join(CONDITIONS)}")
    t0 = time.perf_counter()
    if args.redis_url:
        results = asyncio.run(run(args.redis_url, args))
    else:
        with private_redis() as url:
            results = asyncio.run(run(url, args))
    print(render(results))
    print(f"\n({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)


if __name__ == "__main__":
    main()
