"""A start check whose Redis goes away: the task is deferred with growing delays, spends no
attempt, and runs exactly once when the server is back; a check that hangs is cut by
``start_check_timeout`` and deferred the same way.

The check under test is a middleware's own start check that draws a token from a bucket on a
``redis-server`` of the test's own (a free port), through a blitzq broker on that server, so
the worker's queue, schedule and records stay on the session's server while the check's
server is stopped, restarted, or frozen (SIGSTOP). The delays are read from the worker's log
records (``deferrals``, ``defer_delay``), never measured.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest

from blitzq import Queue, TaskState
from blitzq.broker import Completion
from blitzq.broker.amqp import AmqpBroker
from blitzq.extensions.middleware import Middleware, WorkerContext
from blitzq.options import Option, TaskOptions
from blitzq.task import Task
from blitzq.worker.deferral import JITTER
from blitzq.worker.execution import Job
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.integration.proc_tasks import make_worker, running

from .conftest import PrivateRedis

pytestmark = pytest.mark.timeout(120)

BASE = 0.05  # defer_base_delay of the worker under test (seconds)


class OuterBucket(Middleware):
    """Option ``outer_bucket=True``: a start check taking a token from a bucket on another
    server (``url``), through a Queue's broker there.

    Args:
        url: the other server's URL.
        namespace: the key namespace there.
    """

    task_options: ClassVar[Mapping[str, Option]] = {"outer_bucket": Option(False)}

    def __init__(self, url: str, namespace: str) -> None:
        self.outer = Queue(redis_url=url, namespace=namespace)
        self.answered = 0

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Add :meth:`check` to a task with ``outer_bucket=True``."""
        if options.get("outer_bucket"):
            task.checks.append(self.check)

    async def check(self, worker: WorkerContext, job: Job) -> Completion | None:
        """Take a token (the bucket never runs dry); raises what the broker raises."""
        await self.outer.broker.acquire_rate([("outer", 1000.0, 1000.0)])
        self.answered += 1
        return None


def deferrals(records: list[logging.LogRecord], task_id: str) -> list[tuple[int, float]]:
    """``(deferral number, delay)`` of each deferral of ``task_id`` the worker logged."""
    return [
        (r.deferrals, r.defer_delay)  # type: ignore[attr-defined]
        for r in records
        if getattr(r, "task_id", None) == task_id and hasattr(r, "defer_delay")
    ]


def assert_growing(seen: list[tuple[int, float]], base: float, ceiling: float) -> None:
    """Deferrals numbered 1, 2, ... whose delays double from ``base`` (within the jitter)
    up to ``ceiling``, each longer than the one before until the ceiling."""
    assert [n for n, _ in seen] == list(range(1, len(seen) + 1)), seen
    for n, delay in seen:
        nominal = min(ceiling, base * 2 ** (n - 1))
        assert nominal * (1 - JITTER) - 1e-6 <= delay <= min(ceiling, nominal * (1 + JITTER))
    delays = [d for _, d in seen]
    assert all(b > a for a, b in itertools.pairwise(delays)), delays


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 20 ms until it holds.

    Raises:
        AssertionError: it did not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        await asyncio.sleep(0.02)


@pytest.fixture
def mode() -> str:
    """Broker mode of the Queue under test (a test parametrizes it to run them all)."""
    return "reliable"


@pytest.fixture
async def setup(
    make_queue: Callable[..., Queue],
    private_redis: PrivateRedis,
    server_url: str,
    namespace: str,
    mode: str,
) -> Any:
    """``(queue, middleware)``: a Queue in ``mode`` (``amqp``: RabbitMQ transport) on the
    session's server whose tasks with ``outer_bucket=True`` check a bucket on
    ``private_redis`` (read timeout 60 s); both closed after the test."""
    broker, url = None, ""
    if mode == "amqp":
        url = amqp_or_skip()
        broker = AmqpBroker(url, server_url, namespace)
        queue = Queue("oq", broker=broker)
    else:
        queue = make_queue(name="oq", mode=mode)
    middleware = OuterBucket(private_redis.url + "?socket_timeout=60", namespace)
    queue.add_middleware(middleware)
    yield queue, middleware
    await queue.close()
    await middleware.outer.close()
    if broker is not None:
        await delete_amqp_queues(url, [broker])


@pytest.mark.parametrize("mode", ["reliable", "fast", "amqp"])
async def test_outage_defers_with_growing_delays_and_runs_once_after_the_restart(
    setup: tuple[Queue, OuterBucket],
    private_redis: PrivateRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue, middleware = setup
    runs: list[int] = []

    @queue.task(name="o.guarded", outer_bucket=True)
    async def guarded(n: int) -> int:
        runs.append(n)
        return n

    @queue.task(name="o.plain")
    async def plain(n: int) -> int:
        return n

    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    private_redis.shutdown()  # the check's server goes away
    handle = await guarded.enqueue(1)
    worker = make_worker(queue, concurrency=2, defer_base_delay=BASE, defer_max_delay=30.0)
    async with running(worker):
        await wait_for(lambda: len(deferrals(caplog.records, handle.id)) >= 5, 60.0, "deferrals")
        # Deferred, not sleeping in a slot: other work goes on during the outage.
        assert await (await plain.enqueue(2)).result(timeout=30) == 2
        assert runs == []
        private_redis.start()  # back, on the same port
        assert await handle.result(timeout=60) == 1
    seen = deferrals(caplog.records, handle.id)
    assert_growing(seen, BASE, 30.0)
    assert runs == [1]  # exactly once, after the restart
    assert middleware.answered == 1
    record = await handle.status()
    assert record is not None
    assert record.state == TaskState.SUCCEEDED
    assert record.attempts == 1  # the outage spent no attempt and no delivery
    # One WARNING per deferral, each naming the outage and its error.
    lines = [r.getMessage() for r in caplog.records if hasattr(r, "defer_delay")]
    assert len(lines) == len(seen)
    assert all("could not reach the broker" in line and "Connection" in line for line in lines)


async def test_a_check_that_hangs_is_cut_by_start_check_timeout_and_deferred(
    setup: tuple[Queue, OuterBucket],
    private_redis: PrivateRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue, _ = setup
    runs: list[int] = []

    @queue.task(name="o.guarded", outer_bucket=True)
    async def guarded(n: int) -> int:
        runs.append(n)
        return n

    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    proc = private_redis.proc
    assert proc is not None
    # The check's server accepts connections but never answers (its socket timeout is 60 s).
    proc.send_signal(signal.SIGSTOP)
    try:
        handle = await guarded.enqueue(1)
        worker = make_worker(
            queue, defer_base_delay=BASE, defer_max_delay=30.0, start_check_timeout=0.3
        )
        async with running(worker):
            await wait_for(
                lambda: len(deferrals(caplog.records, handle.id)) >= 3, 60.0, "3 deferrals"
            )
            assert runs == []
            proc.send_signal(signal.SIGCONT)
            assert await handle.result(timeout=60) == 1
    finally:
        proc.send_signal(signal.SIGCONT)
    seen = deferrals(caplog.records, handle.id)
    assert_growing(seen, BASE, 30.0)
    lines = [r.getMessage() for r in caplog.records if hasattr(r, "defer_delay")]
    assert all("no answer within start_check_timeout (0.3 s)" in line for line in lines)
    assert runs == [1]
    record = await handle.status()
    assert record is not None
    assert record.attempts == 1
