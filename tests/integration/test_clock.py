"""One clock decides when things run: the server's (``TIME`` inside the scripts).

A skewed producer, worker or scheduler is simulated in-process by replacing the ``time``
module seen by *that* side only (the producer's ``blitzq.client.publish``, the worker's
``blitzq.worker.*``), or through the scheduler's own ``clock=``. The broker is the real
Redis/Valkey; every assertion compares due times with the server's own ``TIME``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from blitzq import Queue, Retry
from blitzq.client import publish as enqueue_module
from blitzq.scheduler import Scheduler
from blitzq.worker import completions as completions_module
from blitzq.worker import maintenance as maintenance_module
from blitzq.worker import runner as runner_module

from .proc_tasks import eventually, make_worker, running

SKEW = 90.0


class SkewedTime(ModuleType):
    """The ``time`` module with a wall clock ``skew`` seconds off (monotonic untouched)."""

    def __init__(self, skew: float) -> None:
        super().__init__("time")
        self.skew = skew

    def time(self) -> float:
        return time.time() + self.skew

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture(params=["reliable", "fast"])
async def queue(request: pytest.FixtureRequest, make_queue: Callable[..., Queue]) -> Any:
    q = make_queue(mode=request.param)
    yield q
    await q.close()


async def server_now(raw_redis: Any) -> float:
    seconds, micros = await raw_redis.time()
    return float(seconds) + micros / 1e6


async def due_in(queue: Queue, raw_redis: Any, task_id: str) -> float:
    """Seconds until ``task_id`` is due, by the server's clock."""
    score = await raw_redis.zscore(queue.broker.state.keys.schedule, task_id)  # type: ignore[attr-defined]
    assert score is not None, f"{task_id} is not on the schedule"
    return float(score) - await server_now(raw_redis)


@pytest.mark.parametrize("skew", [SKEW, -SKEW])
async def test_a_skewed_producer_clock_does_not_move_a_delay(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """Issue 7 §5: a producer 90 s fast delayed a ``delay=60`` task to ~150 s."""

    @queue.task(name="t.later")
    async def later(n: int) -> int:
        return n

    monkeypatch.setattr(enqueue_module, "time", SkewedTime(skew))
    one = await later.options(delay=60).enqueue(1)
    many = await later.options(delay=60).enqueue_many([(2,), (3,)])
    send = await queue.send("t.later", (4,), delay=60)
    for handle in (one, *many, send):
        left = await due_in(queue, raw_redis, handle.id)
        assert 55.0 < left <= 60.0, (handle.id, left)


async def test_an_absolute_eta_is_compared_with_the_server_clock(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``eta=`` the producer's fast clock thinks is past still waits for the server."""

    @queue.task(name="t.at")
    async def at(n: int) -> int:
        return n

    monkeypatch.setattr(enqueue_module, "time", SkewedTime(SKEW))
    eta = await server_now(raw_redis) + 30.0
    handle = await at.options(eta=eta).enqueue(1)
    aware = await at.options(eta=dt.datetime.fromtimestamp(eta, dt.UTC)).enqueue(2)
    for h in (handle, aware):
        score = await raw_redis.zscore(queue.broker.state.keys.schedule, h.id)  # type: ignore[attr-defined]
        assert score == pytest.approx(eta, abs=1e-3)
    assert (await queue.stats([queue.name]))["scheduled"] == 2


async def test_a_worker_with_a_fast_clock_never_starts_a_delayed_task_early(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[float] = []

    @queue.task(name="t.stamp")
    async def stamp() -> None:
        started.append(await server_now(raw_redis))

    for module in (maintenance_module, runner_module, completions_module):
        monkeypatch.setattr(module, "time", SkewedTime(SKEW))
    async with running(make_worker(queue, concurrency=2)):
        handle = await stamp.options(delay=1.0).enqueue()
        score = await raw_redis.zscore(queue.broker.state.keys.schedule, handle.id)  # type: ignore[attr-defined]
        assert score is not None
        await handle.result(timeout=30)
    assert len(started) == 1
    assert started[0] >= float(score), (started, score)


async def test_a_retry_backoff_is_counted_on_the_server_clock(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker 90 s slow made its retries due at once for the other workers' promoters
    (its now + delay is past by their clocks); only the failing side is skewed here."""
    attempts: list[float] = []

    @queue.task(name="t.flaky", retries=1)
    async def flaky() -> str:
        attempts.append(await server_now(raw_redis))
        if len(attempts) == 1:
            raise Retry(delay=1.0)
        return "ok"

    for module in (runner_module, completions_module):
        monkeypatch.setattr(module, "time", SkewedTime(-SKEW))
    async with running(make_worker(queue, concurrency=2)):
        handle = await flaky.enqueue()
        assert await handle.result(timeout=30) == "ok"
    assert len(attempts) == 2
    assert attempts[1] - attempts[0] >= 1.0 - 0.01, attempts


async def test_a_scheduler_with_a_fast_clock_does_not_promote_early(
    queue: Queue, raw_redis: Any
) -> None:
    """Issue 7 §5: a scheduler with a fast clock released delayed tasks early."""

    @queue.task(name="t.wait")
    async def wait() -> None:
        return None

    handle = await wait.options(delay=60).enqueue()
    scheduler = Scheduler(queue, clock=lambda: time.time() + SKEW, promote=True)
    await scheduler.tick()
    assert (await queue.stats([queue.name]))["scheduled"] == 1
    assert await due_in(queue, raw_redis, handle.id) > 55.0
    # Due by the server's clock: it moves (the schedule entry is made due by hand).
    await raw_redis.zadd(queue.broker.state.keys.schedule, {handle.id: 1_000_000_000})  # type: ignore[attr-defined]
    await scheduler.tick()
    await eventually(lambda: queue.stats([queue.name]), lambda s: s["scheduled"] == 0)


async def test_a_rate_limit_wait_is_counted_on_the_server_clock(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rate-limited task goes back to the schedule, with its token reserved, for its wait.
    With the worker's clock 90 s slow that wait used to be due at once, and the task ran
    with its reserved token long before the token was due."""
    starts: list[float] = []

    @queue.task(name="t.paced", rate_limit="1/s")
    async def paced(n: int) -> int:
        starts.append(await server_now(raw_redis))
        return n

    for module in (runner_module, completions_module):
        monkeypatch.setattr(module, "time", SkewedTime(-SKEW))
    enqueued = await server_now(raw_redis)
    handles = await paced.enqueue_many([(i,) for i in range(3)])
    async with running(make_worker(queue, concurrency=3)):
        assert [await h.result(timeout=30) for h in handles] == [0, 1, 2]
    # One token a second from the first take (no earlier than the enqueue), on the server's
    # clock: the i-th start is never before enqueued + i seconds (2 ms of slack).
    for i, start in enumerate(sorted(starts)):
        assert start >= enqueued + i - 0.003, (i, start - enqueued)
