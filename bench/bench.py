"""blitzq benchmark: every figure beside a raw redis-py reference measured in the same run.

Method
------
The script starts a private ``redis-server`` (no persistence) on a free port in a temporary
directory, runs every measurement against it and stops it at the end; the shared server on 6379
is never touched. Each measurement uses a fresh namespace (``bench-<id>``), and its keys are
deleted afterwards, so one measurement never sees another's data.

Each blitzq figure is printed beside a *raw reference*: a plain ``redis.asyncio`` loop in this
same process doing the same Redis work without blitzq (same payload sizes, same batch sizes).
The ratio column is ``blitzq / raw``: for rates, below 1 means blitzq is slower than the bare
loop; for latency and memory, above 1 means blitzq costs more. Throughput rows run blitzq and
the raw loop alternately (A B A B ...) ``--reps`` times (5; 1 with ``--quick``) and report the
median of each and, as the ratio, the median of the per-repetition ratios, which tames the noise
of a shared machine.

Rows:

* ``enqueue``: ``await task.enqueue()`` of a no-argument async task, one by one, against one
  ``XADD`` (reliable) / ``RPUSH`` (fast) per message.
* ``enqueue_many``: ``task.enqueue_many`` in batches of 1000, against 1000 pipelined ``XADD``
  (reliable) / one ``RPUSH`` of 1000 values (fast).
* ``drain``: one in-process ``Worker(queue, concurrency=200)`` runs 20,000 pre-enqueued no-op
  tasks. The clock stops when the work is *completed* as the broker sees it (reliable: stream
  empty and nothing pending; fast: list empty; with stored results also the last task's
  record exists), not merely when the coroutines ran. Raw reference: ``XREADGROUP COUNT 500``
  -> msgspec decode -> await a no-op -> ``XACK`` + ``XDEL`` (+ one ``SET`` record per task) in
  one MULTI pipeline; fast: ``LPOP 500`` -> decode -> no-op (+ pipelined ``SET`` records).
* ``latency``: 500 sequential round trips (``enqueue`` then ``await handle.result()``) with an
  idle worker in the same process, p50 and p99. Raw reference: ``XADD`` (``RPUSH``), a consumer
  coroutine blocked in ``XREADGROUP`` (``BLPOP``) on another connection that writes the record
  with ``SET`` (and ``XACK`` + ``XDEL`` in the same MULTI) and wakes the producer through an
  in-process future, then the producer's ``GET``.
* ``memory``: ``INFO memory`` ``used_memory`` growth after enqueuing 100,000 no-argument
  messages (no worker), divided by their number. Raw reference: the same number of values of
  the same size added with ``XADD`` (field ``m``) / ``RPUSH``.
* ``rss``: resident memory (``VmRSS``) of a subprocess that created a Queue with one task,
  started a Worker and sat idle for 2 s. Raw reference: a subprocess with redis-py and msgspec
  imported, idle for 2 s in a blocking ``XREADGROUP``.

Run ``make bench`` or ``.venv/bin/python bench/bench.py [--quick] [--only NAME[,NAME]]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import redis
import redis.asyncio as aioredis

from blitzq import Queue, Task, Worker
from blitzq.broker.redis.keys import GROUP, Keys

QUEUE = "default"
TASK_NAME = "bench.noop"
BATCH = 1000
DRAIN_CONCURRENCY = 200
RAW_FETCH = 500
RESULT_TTL = 86400
DEADLINE = 120.0
MEASUREMENTS = ("enqueue", "enqueue_many", "drain", "metrics", "latency", "memory", "rss")


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does (``--quick`` uses smaller numbers)."""

    enqueue: int = 5000
    enqueue_many: int = 20_000
    drain: int = 20_000
    latency: int = 500
    memory: int = 100_000
    reps: int = 5


QUICK = Sizes(enqueue=500, enqueue_many=2000, drain=2000, latency=50, memory=10_000, reps=1)


@dataclass
class Row:
    """One line of the result table: a blitzq figure, its raw reference, optional target."""

    name: str
    unit: str
    blitzq: float
    raw: float
    target: float | None = None
    lower_is_better: bool = False
    ratio: float | None = None

    def cells(self) -> list[str]:
        """Markdown cells: name, blitzq, raw, ratio, target check."""
        value = self.ratio if self.ratio is not None else self.blitzq / self.raw
        ratio = f"{value:.2f}x"
        target = "-"
        if self.target is not None:
            met = self.blitzq <= self.target if self.lower_is_better else self.blitzq >= self.target
            sign = "<=" if self.lower_is_better else ">="
            target = f"{sign} {_fmt(self.target, self.unit)}: {'met' if met else 'MISSED'}"
        return [self.name, _fmt(self.blitzq, self.unit), _fmt(self.raw, self.unit), ratio, target]


def _fmt(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f} /s"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.1f} {unit}"


# --------------------------------------------------------------------------- private server
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def private_redis() -> Iterator[str]:
    """Start ``redis-server`` on a free port in a temp dir; yield its URL; stop it after.

    Raises:
        RuntimeError: no ``redis-server`` binary, or it did not answer within 10 s.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    workdir = tempfile.mkdtemp(prefix="blitzq-bench-")
    port = _free_port()
    options = f"--port {port} --bind 127.0.0.1 --appendonly no --daemonize no".split()
    proc = subprocess.Popen(
        [binary, *options, "--save", "", "--dir", workdir, "--logfile", f"{workdir}/redis.log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except (redis.RedisError, OSError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- helpers
class RawEnvelope(msgspec.Struct, array_like=True, gc=False):
    """The raw loops' stand-in for a no-argument message (same fields and size as blitzq's)."""

    id: str
    task: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    created_at: float
    enqueued_at: float
    correlation_id: str | None
    headers: dict[str, Any] | None
    timeout: float | None


_ENCODER = msgspec.msgpack.Encoder()


def raw_payload() -> bytes:
    """A no-argument message encoded like blitzq's envelope, with a fresh id."""
    now = time.time()
    env = RawEnvelope(uuid.uuid4().hex, TASK_NAME, QUEUE, [], {}, 1, now, now, None, None, None)
    return _ENCODER.encode(env)


def raw_record(env: RawEnvelope) -> bytes:
    """A task record like the one blitzq stores on success."""
    return _ENCODER.encode(
        {
            "id": env.id,
            "task": env.task,
            "queue": env.queue,
            "state": "succeeded",
            "attempts": 1,
            "enqueued_at": env.created_at,
            "started_at": time.time(),
            "finished_at": time.time(),
            "worker": "raw",
            "result": 1,
        }
    )


def new_namespace(label: str) -> str:
    """A namespace no other measurement uses."""
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


async def delete_matching(client: aioredis.Redis, pattern: str) -> None:
    """Delete every key matching ``pattern`` (SCAN + DEL, freed at once, unlike UNLINK)."""
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            await client.delete(*batch)
            batch.clear()
    if batch:
        await client.delete(*batch)


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, interval: float) -> None:
    """Poll ``check`` every ``interval`` seconds until true.

    Raises:
        TimeoutError: still false after ``DEADLINE`` seconds.
    """
    deadline = time.monotonic() + DEADLINE
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


class Bench:
    """A Queue in a fresh namespace with one no-op async task that counts its runs.

    Args:
        url: the private server.
        mode: ``"reliable"`` or ``"fast"``.
        store: ``store_results`` of the Queue.
        label: part of the namespace name.
    """

    def __init__(self, url: str, mode: str, store: bool, label: str) -> None:
        self.namespace = new_namespace(label)
        self.keys = Keys(self.namespace)
        self.mode = mode
        self.queue = Queue(
            QUEUE,
            redis_url=url,
            namespace=self.namespace,
            mode=mode,
            store_results=store,
        )
        self.ran = 0
        self.target = 0
        self.all_ran = asyncio.Event()

        async def noop() -> int:
            self.ran += 1
            if self.ran == self.target:
                self.all_ran.set()
            return 1

        self.task: Task[[], int] = self.queue.task(name=TASK_NAME)(noop)

    @property
    def queue_key(self) -> str:
        """Where this mode keeps the queue's messages."""
        return self.keys.stream(QUEUE) if self.mode == "reliable" else self.keys.list(QUEUE)

    async def close(self, client: aioredis.Redis) -> None:
        """Close the Queue's connections and delete the namespace's keys."""
        await self.queue.close()
        await delete_matching(client, "{" + self.namespace + "}:*")


async def _run_worker(worker: Worker) -> asyncio.Task[None]:
    runner = asyncio.create_task(worker.run())
    await asyncio.sleep(0)
    return runner


async def _stop_worker(worker: Worker, runner: asyncio.Task[None]) -> None:
    worker.stop()
    await asyncio.wait_for(runner, timeout=30)


def _median_rows(name: str, blitzq: list[float], raw: list[float], unit: str = "/s") -> Row:
    """Medians of the repetitions; the ratio is the median of the paired (same-rep) ratios."""
    ratio = statistics.median(b / r for b, r in zip(blitzq, raw, strict=True))
    return Row(name, unit, statistics.median(blitzq), statistics.median(raw), ratio=ratio)


# --------------------------------------------------------------------------- enqueue
async def enqueue_one_blitzq(url: str, client: aioredis.Redis, mode: str, n: int) -> float:
    """Messages/s of ``await task.enqueue()``, one by one."""
    bench = Bench(url, mode, True, "enq")
    try:
        await bench.task.enqueue()  # connect and register the queue outside the clock
        t0 = time.perf_counter()
        for _ in range(n):
            await bench.task.enqueue()
        return n / (time.perf_counter() - t0)
    finally:
        await bench.close(client)


async def enqueue_one_raw(client: aioredis.Redis, mode: str, n: int) -> float:
    """Messages/s of one ``XADD`` / ``RPUSH`` per message (each payload encoded fresh)."""
    key = f"raw-{uuid.uuid4().hex[:8]}"
    try:
        t0 = time.perf_counter()
        if mode == "reliable":
            for _ in range(n):
                await client.xadd(key, {"m": raw_payload()})
        else:
            for _ in range(n):
                await client.rpush(key, raw_payload())
        return n / (time.perf_counter() - t0)
    finally:
        await client.delete(key)


async def enqueue_many_blitzq(url: str, client: aioredis.Redis, mode: str, n: int) -> float:
    """Messages/s of ``task.enqueue_many`` in batches of ``BATCH``."""
    bench = Bench(url, mode, True, "enqmany")
    calls = [()] * BATCH
    try:
        await bench.task.enqueue()
        t0 = time.perf_counter()
        for _ in range(n // BATCH):
            await bench.task.enqueue_many(calls)
        return (n // BATCH) * BATCH / (time.perf_counter() - t0)
    finally:
        await bench.close(client)


async def raw_fill(client: aioredis.Redis, key: str, mode: str, n: int) -> None:
    """Add ``n`` no-argument messages in batches of ``BATCH`` (pipelined XADD / one RPUSH)."""
    for start in range(0, n, BATCH):
        count = min(BATCH, n - start)
        if mode == "reliable":
            async with client.pipeline(transaction=False) as pipe:
                for _ in range(count):
                    pipe.xadd(key, {"m": raw_payload()})
                await pipe.execute()
        else:
            await client.rpush(key, *[raw_payload() for _ in range(count)])


async def enqueue_many_raw(client: aioredis.Redis, mode: str, n: int) -> float:
    """Messages/s of batches of ``BATCH`` pipelined XADD (reliable) / one RPUSH (fast)."""
    key = f"raw-{uuid.uuid4().hex[:8]}"
    try:
        t0 = time.perf_counter()
        await raw_fill(client, key, mode, (n // BATCH) * BATCH)
        return (n // BATCH) * BATCH / (time.perf_counter() - t0)
    finally:
        await client.delete(key)


async def measure_enqueue(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Enqueue rates, one by one and in batches, for both modes."""
    rows = []
    for mode, raw_cmd in (("reliable", "XADD"), ("fast", "RPUSH")):
        b, r = [], []
        for _ in range(sizes.reps):
            b.append(await enqueue_one_blitzq(url, client, mode, sizes.enqueue))
            r.append(await enqueue_one_raw(client, mode, sizes.enqueue))
        rows.append(_median_rows(f"enqueue one by one, {mode} (raw: {raw_cmd})", b, r))
    return rows


async def measure_enqueue_many(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Enqueue rates with ``enqueue_many`` in batches of 1000, for both modes."""
    rows = []
    for mode, raw_cmd in (("reliable", "pipelined XADD x1000"), ("fast", "RPUSH of 1000")):
        b, r = [], []
        for _ in range(sizes.reps):
            b.append(await enqueue_many_blitzq(url, client, mode, sizes.enqueue_many))
            r.append(await enqueue_many_raw(client, mode, sizes.enqueue_many))
        rows.append(_median_rows(f"enqueue_many x{BATCH}, {mode} (raw: {raw_cmd})", b, r))
    return rows


# --------------------------------------------------------------------------- drain
async def _broker_done(client: aioredis.Redis, bench: Bench, store: bool, last_id: str) -> bool:
    """Whether the broker shows every task completed (acked, and records written)."""
    async with client.pipeline(transaction=False) as pipe:
        if bench.mode == "reliable":
            pipe.xlen(bench.queue_key)
            pipe.xpending(bench.queue_key, GROUP)
        else:
            pipe.llen(bench.queue_key)
        if store:
            pipe.exists(bench.keys.record(last_id))
        replies = await pipe.execute()
    if replies[0]:
        return False
    if bench.mode == "reliable" and replies[1]["pending"]:
        return False
    return not store or bool(replies[-1])


async def drain_blitzq(url: str, client: aioredis.Redis, mode: str, store: bool, n: int) -> float:
    """Tasks/s of one in-process Worker draining ``n`` pre-enqueued no-op tasks to completion."""
    return (await drain_measured(url, client, mode, store, n))[0]


async def drain_measured(
    url: str, client: aioredis.Redis, mode: str, store: bool, n: int, metrics: bool = False
) -> tuple[float, float]:
    """:func:`drain_blitzq`'s tasks/s, and this process's CPU seconds over the same span
    (``metrics``: with Prometheus metrics on, served on a free port of 127.0.0.1)."""
    bench = Bench(url, mode, store, "drain")
    try:
        handles = []
        for start in range(0, n, BATCH):
            handles += await bench.task.enqueue_many([()] * min(BATCH, n - start))
        last_id = handles[-1].id
        bench.target = n
        ops: dict[str, Any] = {"metrics_port": 0, "ops_host": "127.0.0.1"} if metrics else {}
        worker = Worker(bench.queue, concurrency=DRAIN_CONCURRENCY, **ops)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        runner = await _run_worker(worker)
        waiter = asyncio.create_task(bench.all_ran.wait())
        done, _ = await asyncio.wait(
            {runner, waiter}, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            waiter.cancel()
            if runner.done():
                runner.result()  # re-raise the worker's error
            raise TimeoutError(f"only {bench.ran} of {n} tasks ran")
        await wait_until(lambda: _broker_done(client, bench, store, last_id), "completions", 0.001)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        await _stop_worker(worker, runner)
        return n / elapsed, cpu
    finally:
        await bench.close(client)


async def _noop() -> int:
    return 1


async def drain_raw(client: aioredis.Redis, mode: str, store: bool, n: int) -> float:
    """Tasks/s of the bare redis-py drain loop (see the module docstring)."""
    prefix = f"raw-{uuid.uuid4().hex[:8]}"
    key, group = f"{prefix}:q", "g"
    decoder = msgspec.msgpack.Decoder(RawEnvelope)
    try:
        if mode == "reliable":
            await client.xgroup_create(key, group, id="0", mkstream=True)
        await raw_fill(client, key, mode, n)
        t0 = time.perf_counter()
        done = 0
        while done < n:
            if mode == "reliable":
                reply = await client.xreadgroup(group, "c1", {key: ">"}, count=RAW_FETCH)
                entries = reply[0][1]
                ids = []
                async with client.pipeline(transaction=True) as pipe:
                    for entry_id, fields in entries:
                        env = decoder.decode(fields[b"m"])
                        await _noop()
                        ids.append(entry_id)
                        if store:
                            pipe.set(f"{prefix}:t:{env.id}", raw_record(env), ex=RESULT_TTL)
                    pipe.xack(key, group, *ids)
                    pipe.xdel(key, *ids)
                    await pipe.execute()
                done += len(entries)
            else:
                items = await client.lpop(key, RAW_FETCH)
                if store:
                    async with client.pipeline(transaction=False) as pipe:
                        for item in items:
                            env = decoder.decode(item)
                            await _noop()
                            pipe.set(f"{prefix}:t:{env.id}", raw_record(env), ex=RESULT_TTL)
                        await pipe.execute()
                else:
                    for item in items:
                        decoder.decode(item)
                        await _noop()
                done += len(items)
        return n / (time.perf_counter() - t0)
    finally:
        await delete_matching(client, f"{prefix}:*")


async def measure_drain(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Drain rates of one worker, reliable/fast x results stored or not."""
    rows = []
    for mode in ("reliable", "fast"):
        for store in (True, False):
            b, r = [], []
            for _ in range(sizes.reps):
                b.append(await drain_blitzq(url, client, mode, store, sizes.drain))
                r.append(await drain_raw(client, mode, store, sizes.drain))
            label = "results stored" if store else "no results"
            rows.append(_median_rows(f"drain {sizes.drain:,} no-op, {mode}, {label}", b, r))
    return rows


async def measure_metrics(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """The drain with metrics on against the same drain with metrics off, paired (off on,
    on off, ...: the order alternates):
    tasks/s, and CPU microseconds of this process per task (the worker runs in it), which a
    busy machine disturbs less than wall time. The "raw" column is metrics off here."""
    rows = []
    for mode in ("reliable", "fast"):
        for store in (True, False):
            on, off, cpu_on, cpu_off = [], [], [], []
            for rep in range(sizes.reps):
                sides = ((True, on, cpu_on), (False, off, cpu_off))
                for metrics, rates, cpus in sides if rep % 2 else sides[::-1]:
                    rate, cpu = await drain_measured(url, client, mode, store, sizes.drain, metrics)
                    rates.append(rate)
                    cpus.append(cpu / sizes.drain * 1e6)
            label = "results stored" if store else "no results"
            name = f"drain {sizes.drain:,}, {mode}, {label}, metrics on (raw: off)"
            rows.append(_median_rows(name, on, off))
            cpu_row = _median_rows(f"{name}, CPU", cpu_on, cpu_off, unit="us/task")
            cpu_row.lower_is_better = True
            rows.append(cpu_row)
    return rows


# --------------------------------------------------------------------------- latency
def _percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``samples`` (seconds) in milliseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


async def latency_blitzq(url: str, client: aioredis.Redis, mode: str, n: int) -> list[float]:
    """Seconds per round trip (enqueue, then await the result) with an idle in-process worker."""
    bench = Bench(url, mode, True, "lat")
    try:
        worker = Worker(bench.queue, concurrency=10)
        runner = await _run_worker(worker)
        samples = []
        for i in range(n + 20):  # the first 20 warm connections and subscriptions up
            t0 = time.perf_counter()
            handle = await bench.task.enqueue()
            await handle.result(timeout=10)
            if i >= 20:
                samples.append(time.perf_counter() - t0)
        await _stop_worker(worker, runner)
        return samples
    finally:
        await bench.close(client)


async def latency_raw(url: str, mode: str, n: int) -> list[float]:
    """Seconds per raw round trip: push, a blocked consumer writes the record, then GET."""
    producer = aioredis.Redis.from_url(url)
    consumer = aioredis.Redis.from_url(url)
    prefix = f"raw-{uuid.uuid4().hex[:8]}"
    key, group = f"{prefix}:q", "g"
    decoder = msgspec.msgpack.Decoder(RawEnvelope)
    waiting: dict[str, asyncio.Future[None]] = {}

    async def consume() -> None:
        while True:
            if mode == "reliable":
                reply = await consumer.xreadgroup(group, "c1", {key: ">"}, count=1, block=1000)
                if not reply:
                    continue
                entry_id, fields = reply[0][1][0]
                env = decoder.decode(fields[b"m"])
                async with consumer.pipeline(transaction=True) as pipe:
                    pipe.set(f"{prefix}:t:{env.id}", raw_record(env), ex=RESULT_TTL)
                    pipe.xack(key, group, entry_id)
                    pipe.xdel(key, entry_id)
                    await pipe.execute()
            else:
                popped = await consumer.blpop([key], timeout=1)
                if not popped:
                    continue
                env = decoder.decode(popped[1])
                await consumer.set(f"{prefix}:t:{env.id}", raw_record(env), ex=RESULT_TTL)
            waiting.pop(env.id).set_result(None)

    try:
        if mode == "reliable":
            await producer.xgroup_create(key, group, id="0", mkstream=True)
        task = asyncio.create_task(consume())
        loop = asyncio.get_running_loop()
        samples = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            payload = raw_payload()
            task_id = decoder.decode(payload).id
            done = waiting[task_id] = loop.create_future()
            if mode == "reliable":
                await producer.xadd(key, {"m": payload})
            else:
                await producer.rpush(key, payload)
            await asyncio.wait_for(done, timeout=10)
            record = await producer.get(f"{prefix}:t:{task_id}")
            assert record is not None
            if i >= 20:
                samples.append(time.perf_counter() - t0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return samples
    finally:
        await delete_matching(producer, f"{prefix}:*")
        await producer.aclose()
        await consumer.aclose()


async def measure_latency(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Round-trip latency p50/p99, both modes."""
    rows = []
    for mode in ("reliable", "fast"):
        b50, b99 = _percentiles(await latency_blitzq(url, client, mode, sizes.latency))
        r50, r99 = _percentiles(await latency_raw(url, mode, sizes.latency))
        rows.append(Row(f"round trip p50, {mode}", "ms", b50, r50, 1.0, lower_is_better=True))
        rows.append(Row(f"round trip p99, {mode}", "ms", b99, r99))
    return rows


# --------------------------------------------------------------------------- memory
async def _used_memory(client: aioredis.Redis) -> int:
    """``used_memory`` in bytes, once no lazily freed object is pending."""
    deadline = time.monotonic() + 10
    while True:
        info = await client.info("memory")
        if not info.get("lazyfree_pending_objects") or time.monotonic() > deadline:
            return int(info["used_memory"])
        await asyncio.sleep(0.01)


async def memory_blitzq(url: str, client: aioredis.Redis, mode: str, n: int) -> tuple[float, int]:
    """(bytes of Redis memory per queued no-arg message, bytes of one message)."""
    bench = Bench(url, mode, True, "mem")
    calls = [()] * BATCH
    try:
        before = await _used_memory(client)
        for start in range(0, n, BATCH):
            await bench.task.enqueue_many(calls[: min(BATCH, n - start)])
        after = await _used_memory(client)
        if mode == "reliable":
            _, fields = (await client.xrange(bench.queue_key, count=1))[0]
            size = len(fields[b"m"])
        else:
            size = len(await client.lindex(bench.queue_key, 0))
        return (after - before) / n, size
    finally:
        await bench.close(client)


async def memory_raw(client: aioredis.Redis, mode: str, n: int, size: int) -> float:
    """Bytes of Redis memory per raw value of ``size`` bytes added with XADD / RPUSH."""
    key = f"raw-{uuid.uuid4().hex[:8]}"
    try:
        before = await _used_memory(client)
        for start in range(0, n, BATCH):
            count = min(BATCH, n - start)
            values = [os.urandom(size) for _ in range(count)]
            if mode == "reliable":
                async with client.pipeline(transaction=False) as pipe:
                    for value in values:
                        pipe.xadd(key, {"m": value})
                    await pipe.execute()
            else:
                await client.rpush(key, *values)
        after = await _used_memory(client)
        return (after - before) / n
    finally:
        await client.delete(key)


async def measure_memory(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Redis memory per queued no-argument message, both modes."""
    rows = []
    for mode in ("reliable", "fast"):
        per_message, size = await memory_blitzq(url, client, mode, sizes.memory)
        raw = await memory_raw(client, mode, sizes.memory, size)
        name = f"Redis memory per queued message ({size} B payload), {mode}"
        rows.append(Row(name, "B", per_message, raw, 100.0, lower_is_better=True))
    return rows


# --------------------------------------------------------------------------- rss
_RSS = """
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
"""

_WORKER_SCRIPT = """
import asyncio, sys
from blitzq import Queue, Worker

async def main(url, namespace):
    queue = Queue("default", redis_url=url, namespace=namespace)

    @queue.task(name="bench.noop")
    async def noop():
        return None

    worker = Worker(queue)
    runner = asyncio.create_task(worker.run())
    await asyncio.sleep(2.0)
    print(rss_mb())
    worker.stop()
    await runner

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

_RAW_SCRIPT = """
import asyncio, sys, time
import msgspec, redis.asyncio as aioredis

async def main(url, namespace):
    client = aioredis.Redis.from_url(url)
    key = namespace + ":q"
    await client.xgroup_create(key, "g", id="0", mkstream=True)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        await client.xreadgroup("g", "c1", {key: ">"}, count=500, block=500)
    print(rss_mb())
    await client.delete(key)
    await client.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _run_rss(script: str, url: str, namespace: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _RSS + script, url, namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


async def measure_rss(url: str, client: aioredis.Redis, sizes: Sizes) -> list[Row]:
    """Resident memory of an idle worker process against a bare redis-py process."""
    namespace = new_namespace("rss")
    try:
        worker_mb = await asyncio.to_thread(_run_rss, _WORKER_SCRIPT, url, namespace)
        raw_mb = await asyncio.to_thread(_run_rss, _RAW_SCRIPT, url, f"raw-{namespace}")
    finally:
        await delete_matching(client, "{" + namespace + "}:*")
    name = "idle worker process RSS (raw: redis-py + msgspec)"
    return [Row(name, "MB", worker_mb, raw_mb, 45.0, lower_is_better=True)]


# --------------------------------------------------------------------------- main
RUNNERS: dict[str, Callable[[str, aioredis.Redis, Sizes], Awaitable[list[Row]]]] = {
    "enqueue": measure_enqueue,
    "enqueue_many": measure_enqueue_many,
    "drain": measure_drain,
    "metrics": measure_metrics,
    "latency": measure_latency,
    "memory": measure_memory,
    "rss": measure_rss,
}


def render(rows: list[Row]) -> str:
    """The Markdown table of ``rows``."""
    lines = [
        "| measurement | blitzq | raw redis-py | blitzq / raw | target |",
        "|---|---:|---:|---:|---|",
    ]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


async def run(url: str, names: list[str], sizes: Sizes) -> list[Row]:
    """Run the chosen measurements in order; print each table row set as it completes."""
    client = aioredis.Redis.from_url(url)
    rows: list[Row] = []
    try:
        server = (await client.info("server"))["redis_version"]
        print(
            f"blitzq bench: Python {platform.python_version()}, redis-py {redis.__version__}, "
            f"redis-server {server}, {os.cpu_count()} CPUs, reps={sizes.reps}",
            file=sys.stderr,
        )
        for name in names:
            t0 = time.perf_counter()
            new = await RUNNERS[name](url, client, sizes)
            print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            rows += new
    finally:
        await client.aclose()
    return rows


def main() -> None:
    """Parse arguments, start the private server, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument(
        "--only", default="", help=f"comma-separated measurements: {', '.join(MEASUREMENTS)}"
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions of throughput rows")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(MEASUREMENTS)
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        parser.error(f"unknown measurement(s) {unknown}; choose from {', '.join(MEASUREMENTS)}")
    sizes = QUICK if args.quick else Sizes()
    if args.reps:
        sizes = Sizes(**{**sizes.__dict__, "reps": args.reps})
    t0 = time.perf_counter()
    with private_redis() as url:
        rows = asyncio.run(run(url, names, sizes))
    print(render(rows))
    print(f"\n({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)


if __name__ == "__main__":
    main()
