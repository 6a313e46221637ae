"""Prometheus metrics of a real worker, scraped over HTTP as Prometheus does: counters never go
down and count each outcome once (a completion refused as stale counts nothing, whatever its
outcome: success, failure, expiry before start); the sampled gauges are on the first page
served; the abandoned-thread counters show a sync task that ignores its timeout; the RabbitMQ
pairing counts what it applied."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from blitzq import Queue, TaskExpired, TaskFailed, Worker
from tests.broker_kinds import is_reliable_redis

from .proc_tasks import eventually, make_worker, running
from .test_health import PrivateRedis
from .test_metrics import Samples, scrape, value

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_redis() -> Iterator[PrivateRedis]:
    """A ``redis-server`` of this test (it pauses its writes), stopped at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = PrivateRedis(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


class Watch:
    """Scrapes a worker's ``/metrics`` every 20 ms in the background and remembers every
    counter sample (a ``*_total`` name) that went down between two scrapes."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.last: dict[Any, float] = {}
        self.decreases: list[tuple[Any, float, float]] = []
        self.pages = 0

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # not served yet, or stopping
                samples = await scrape(self.worker)
                if samples:
                    self.pages += 1
                for key, v in samples.items():
                    if not key[0].endswith("_total"):
                        continue
                    before = self.last.get(key)
                    if before is not None and v < before:
                        self.decreases.append((key, before, v))
                    self.last[key] = v
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching(worker: Worker) -> AsyncIterator[Watch]:
    """A :class:`Watch` of ``worker`` running for the block."""
    watch = Watch(worker)
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _value(v: Any) -> Any:
    return v


def tasks_total(samples: Samples, task: str, outcome: str, queue: str = "default") -> float:
    return value(samples, "blitzq_tasks_total", queue=queue, task=task, outcome=outcome) or 0.0


@pytest.mark.parametrize("fail_first", [False, True], ids=["late-success", "late-failure"])
async def test_a_stale_completion_never_makes_a_counter_go_down(
    own_redis: PrivateRedis, fail_first: bool
) -> None:
    """The first run's completion is refused as stale (its delivery was recovered and run
    again). While its write is held up (the test's own server pauses writes) a scrape must
    not count it, and once the broker refused it no counter went down: the attempt that
    counts is the redelivery's, counted once (it used to be counted at once and taken back,
    so the counter read 2 and then 1)."""
    import redis.asyncio as aioredis

    from blitzq import current_task
    from blitzq.broker.redis import ReliableRedisBroker

    queue = Queue(
        redis_url=own_redis.url, namespace="stale-" + uuid.uuid4().hex[:8], mode="reliable"
    )
    started, gate, returned = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @queue.task(name="fenced", retries=0)
    async def fenced() -> str:
        context = current_task()
        assert context is not None
        if context.attempt > 1:
            return "redelivery"
        started.set()
        await gate.wait()
        returned.set()
        if fail_first:
            raise RuntimeError("the first run failed late")
        return "first run"

    broker = queue.broker
    assert is_reliable_redis(broker)
    thief = ReliableRedisBroker(broker.state.conn.url, broker.state.keys.namespace)
    await thief.prepare_consumer(["default"], "thief")
    admin = aioredis.Redis.from_url(own_redis.url)
    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", concurrency=4)
    try:
        async with running(worker), watching(worker) as watch:
            handle = await fenced.enqueue()
            await asyncio.wait_for(started.wait(), 10)
            await eventually(lambda: thief.recover("default", 0.001, 10, 5), lambda r: r == (1, 0))
            assert await handle.result(timeout=10) == "redelivery"
            await eventually(
                lambda: scrape(worker), lambda s: tasks_total(s, "fenced", "succeeded") == 1
            )
            # Hold every write (the completion script included) while the first run ends.
            await admin.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
            try:
                gate.set()
                await asyncio.wait_for(returned.wait(), 10)
                await eventually(lambda: _value(len(worker.runner.jobs)), lambda n: n == 0)
                held = await scrape(worker)  # committed, its write not applied yet
            finally:
                await admin.execute_command("CLIENT", "UNPAUSE")
            samples = await eventually(
                lambda: scrape(worker),
                lambda s: value(s, "blitzq_stale_completions_total") == 1,
            )
            pages = watch.pages
            await eventually(lambda: _value(watch.pages), lambda n: n >= pages + 3)
        assert tasks_total(held, "fenced", "succeeded") == 1
        assert tasks_total(held, "fenced", "failed") == 0
        assert tasks_total(samples, "fenced", "succeeded") == 1
        assert tasks_total(samples, "fenced", "failed") == 0
        assert watch.decreases == []
        # Tester's input: the worker's own counts (its record, its "stopped:" line) took the
        # stale run as one more success; they agree with the metrics now.
        assert (worker.processed, worker.failed) == (1, 0)
    finally:
        await admin.aclose()
        await thief.close()
        await queue.close()


async def test_an_expiry_before_start_whose_delivery_was_recovered_counts_once(
    make_queue: Callable[..., Queue],
) -> None:
    """A delivery held in a start check while another consumer recovers it, then found past
    its ``max_age``: both it and its redelivery expire, the broker refuses the first as
    stale, and ``expired`` is counted once (it used to be counted for both)."""
    from blitzq.broker.redis import ReliableRedisBroker

    queue = make_queue(mode="reliable")
    entered: list[int] = []
    gate = asyncio.Event()

    @queue.task(name="late", max_age=0.2)
    async def late() -> None:
        raise AssertionError("an expired task never runs")

    async def hold(worker: Any, job: Any) -> None:  # a start check before the expiry check
        entered.append(job.delivery.deliveries)
        await gate.wait()

    late.checks.insert(0, hold)
    broker = queue.broker
    assert is_reliable_redis(broker)
    thief = ReliableRedisBroker(broker.state.conn.url, broker.state.keys.namespace)
    await thief.prepare_consumer(["default"], "thief")
    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", concurrency=4)
    try:
        async with running(worker), watching(worker) as watch:
            handle = await late.enqueue()
            await eventually(lambda: _value(len(entered)), lambda n: n == 1)
            await eventually(lambda: thief.recover("default", 0.001, 10, 5), lambda r: r == (1, 0))
            # The redelivery waits at the same check; both are past max_age when released.
            await eventually(lambda: _value(len(entered)), lambda n: n == 2)
            await asyncio.sleep(0.25)  # a lower bound on the age, not an assertion
            gate.set()
            with pytest.raises(TaskExpired):
                await handle.result(timeout=10)
            samples = await eventually(
                lambda: scrape(worker),
                lambda s: (
                    value(s, "blitzq_stale_completions_total") == 1
                    and tasks_total(s, "late", "expired") >= 1
                ),
            )
            pages = watch.pages
            await eventually(lambda: _value(watch.pages), lambda n: n >= pages + 3)
            again = await scrape(worker)
        assert tasks_total(samples, "late", "expired") == 1
        assert tasks_total(again, "late", "expired") == 1
        assert watch.decreases == []
    finally:
        await thief.close()
        await queue.close()


async def test_the_first_page_served_has_the_sampled_gauges(
    make_queue: Callable[..., Queue], namespace: str
) -> None:
    """Tasks wait in the queue when the worker starts: the very first scrape that answers
    shows the queue's depth (sampled before the endpoint is served), the in-progress gauge of
    every queue the worker consumes, and this worker among the live ones."""
    queue = make_queue(name="first")
    release = asyncio.Event()

    @queue.task(name="blocks")
    async def blocks() -> None:
        await release.wait()

    await blocks.enqueue_many([() for _ in range(5)])
    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", concurrency=1)
    async with running(worker):
        first = await eventually(lambda: scrape(worker), bool)  # the first page served
        depth = value(first, "blitzq_queue_depth", queue="first", state="waiting")
        assert depth is not None
        assert depth >= 4  # one may have started since the sample
        assert value(first, "blitzq_queue_depth", queue="first:high", state="waiting") == 0
        assert value(first, "blitzq_tasks_in_progress", queue="first:low") == 0
        assert value(first, "blitzq_tasks_in_progress", queue="first") in (0, 1)
        assert (value(first, "blitzq_workers", namespace=namespace) or 0) >= 1
        assert value(first, "blitzq_dead_letters", namespace=namespace) == 0
        release.set()
    await queue.close()


@pytest.fixture
def freed() -> Iterator[threading.Event]:
    """Set at the end of the test, so a hung task thread returns."""
    event = threading.Event()
    yield event
    event.set()


async def test_an_abandoned_thread_shows_on_a_scrape(
    make_queue: Callable[..., Queue], freed: threading.Event
) -> None:
    """A sync task that ignores its timeout: its thread is abandoned, and the page shows it
    in ``blitzq_abandoned_threads_total`` and ``_running``; once it returns, running drops to
    0 and the counter stays."""
    queue = make_queue(name="hang")

    @queue.task(name="hangs", timeout=0.2, retries=0)
    def hangs() -> str:
        freed.wait(60)
        return "late"

    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", concurrency=2)
    async with running(worker), watching(worker) as watch:
        handle = await hangs.enqueue()
        with pytest.raises(TaskFailed):
            await handle.result(timeout=20)
        samples = await eventually(
            lambda: scrape(worker),
            lambda s: value(s, "blitzq_abandoned_threads_total") == 1,
        )
        assert value(samples, "blitzq_abandoned_threads_running") == 1
        assert tasks_total(samples, "hangs", "dead_lettered", queue="hang") == 1
        freed.set()
        samples = await eventually(
            lambda: scrape(worker),
            lambda s: value(s, "blitzq_abandoned_threads_running") == 0,
        )
        assert value(samples, "blitzq_abandoned_threads_total") == 1
    assert watch.decreases == []
    await queue.close()


async def test_outcomes_over_rabbitmq_are_counted_once_applied(
    server_url: str, namespace: str
) -> None:
    """The RabbitMQ pairing (its completions carry the transport's delivery tags, acked after
    the store applied them): each outcome is counted once the completion was written."""
    from blitzq.broker.amqp import AmqpBroker
    from tests.amqp_server import amqp_or_skip, delete_amqp_queues

    url = amqp_or_skip()
    broker = AmqpBroker(url, server_url, namespace)
    queue = Queue("mq", broker=broker, visibility_timeout=5.0)

    @queue.task(name="mq.ok")
    async def ok(n: int) -> int:
        return n

    @queue.task(name="mq.bad", retries=0)
    async def bad() -> None:
        raise ValueError("no")

    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1")
    try:
        async with running(worker), watching(worker) as watch:
            handles = [await ok.enqueue(n) for n in range(5)]
            failed = await bad.enqueue()
            assert [await h.result(timeout=20) for h in handles] == list(range(5))
            with pytest.raises(TaskFailed):
                await failed.result(timeout=20)
            samples = await eventually(
                lambda: scrape(worker),
                lambda s: (
                    tasks_total(s, "mq.ok", "succeeded", queue="mq") == 5
                    and tasks_total(s, "mq.bad", "dead_lettered", queue="mq") == 1
                ),
            )
        assert value(samples, "blitzq_stale_completions_total") == 0
        assert watch.decreases == []
    finally:
        await queue.close()
        await delete_amqp_queues(url, [broker])
