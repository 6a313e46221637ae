"""Task locks against a real Redis, in both modes.

A mutex never lets two runs of the same key overlap, whatever the worker's concurrency; a
semaphore lets exactly ``lock_limit`` run; a locked-out task waits on the schedule without
spending an attempt; keys come from positional or keyword arguments; a bad template is
refused at registration.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, RetryPolicy, TaskFailed, TaskState, current_task

from .proc_tasks import make_worker, running

_MAX = """
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
return n
"""


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``lq`` in ``mode``, closed after the test."""
    q = make_queue(name="lq", mode=mode)
    yield q
    await q.close()


def key(namespace: str, name: str) -> str:
    """An observation key of the test's namespace."""
    return "{" + namespace + "}:obs:" + name


async def test_a_mutex_never_runs_two_at_once(queue: Queue, raw_redis: Any, namespace: str) -> None:
    active, peak = key(namespace, "active"), key(namespace, "max")

    @queue.task(name="l.charge", lock="user:{user_id}")
    async def charge(user_id: int, n: int) -> int:
        await raw_redis.eval(_MAX, 2, active, peak)
        await asyncio.sleep(0.02)
        await raw_redis.decr(active)
        return n

    handles = [await charge.enqueue(7, n) for n in range(20)]
    # two workers of concurrency 10 each: plenty of slots, one lock
    async with (
        running(make_worker(queue, concurrency=10)),
        running(make_worker(queue, concurrency=10)),
    ):
        results = [await h.result(timeout=30) for h in handles]
    assert results == list(range(20))
    assert int(await raw_redis.get(peak)) == 1
    records = [await h.status() for h in handles]
    assert all(r is not None and r.attempts == 1 for r in records)  # waits spent no attempt


async def test_a_semaphore_runs_exactly_its_limit(
    queue: Queue, raw_redis: Any, namespace: str
) -> None:
    active, peak = key(namespace, "active"), key(namespace, "max")

    @queue.task(name="l.fetch", lock="api:{host}", lock_limit=3)
    async def fetch(host: str, n: int) -> int:
        await raw_redis.eval(_MAX, 2, active, peak)
        await asyncio.sleep(0.15)
        await raw_redis.decr(active)
        return n

    handles = [await fetch.enqueue("example.com", n) for n in range(9)]
    async with running(make_worker(queue, concurrency=10)):
        for h in handles:
            await h.result(timeout=30)
    assert int(await raw_redis.get(peak)) == 3


async def test_different_keys_run_in_parallel_and_kwargs_bind(
    queue: Queue, raw_redis: Any, namespace: str
) -> None:
    both = asyncio.Event()
    inside: set[int] = set()

    @queue.task(name="l.user", lock="user:{user_id}")
    async def per_user(user_id: int, note: str = "") -> int:
        inside.add(user_id)
        if len(inside) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)  # only returns if the other key runs too
        return user_id

    first = await per_user.enqueue(1)
    second = await per_user.enqueue(user_id=2, note="kw")
    async with running(make_worker(queue, concurrency=4)):
        assert await first.result(timeout=10) == 1
        assert await second.result(timeout=10) == 2


async def test_a_failed_attempt_gives_the_lock_back(queue: Queue) -> None:
    calls: list[int] = []

    @queue.task(name="l.flaky", lock="flaky", retry_policy=RetryPolicy(max_retries=2, base=0.01))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("again")
        return "ok"

    handle = await flaky.enqueue()
    async with running(make_worker(queue, concurrency=4)):
        assert await handle.result(timeout=15) == "ok"
    record = await handle.status()
    assert record is not None
    assert record.state is TaskState.SUCCEEDED
    assert record.attempts == 3


def test_a_bad_lock_template_is_refused_at_registration(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="lq")
    with pytest.raises(ConfigurationError, match="not a parameter"):

        @queue.task(name="l.bad", lock="user:{uid}")
        async def bad(user_id: int) -> None:
            return None

    with pytest.raises(ConfigurationError):

        @queue.task(name="l.positional", lock="user:{}")
        async def positional(user_id: int) -> None:
            return None

    with pytest.raises(ConfigurationError):

        @queue.task(name="l.limit", lock="x", lock_limit=0)
        async def limit() -> None:
            return None


async def test_a_running_task_keeps_its_lock_past_the_lease(
    queue: Queue, raw_redis: Any, namespace: str
) -> None:
    active, peak = key(namespace, "active"), key(namespace, "max")

    @queue.task(name="l.long", lock="long", lock_ttl=0.3)
    async def long(n: int) -> int:
        await raw_redis.eval(_MAX, 2, active, peak)
        await asyncio.sleep(1.0)  # over three leases: the worker must renew it
        await raw_redis.decr(active)
        return n

    handles = [await long.enqueue(n) for n in range(2)]
    async with running(make_worker(queue, concurrency=4)):
        for h in handles:
            await h.result(timeout=15)
    assert int(await raw_redis.get(peak)) == 1


async def test_a_timed_out_thread_keeps_its_lock_until_it_returns(queue: Queue) -> None:
    times: dict[str, float] = {}
    lock = threading.Lock()

    @queue.task(name="l.stuck", lock="shared", hard_timeout=0.2, retries=0)
    def stuck() -> None:
        time.sleep(0.8)  # C-level sleep: the thread outlives its hard timeout
        with lock:
            times["stuck_end"] = time.monotonic()

    @queue.task(name="l.next", lock="shared")
    def after() -> None:
        with lock:
            times["next_start"] = time.monotonic()

    first = await stuck.enqueue()
    second = await after.enqueue()
    async with running(make_worker(queue, concurrency=4)):
        with pytest.raises(TaskFailed):
            await first.result(timeout=10)
        await second.result(timeout=10)
    assert times["next_start"] >= times["stuck_end"]


async def test_the_retry_of_a_timed_out_thread_waits_for_its_lock(queue: Queue) -> None:
    """The retry is the same task id but another delivery: it must not take over the place
    its own first attempt still holds (each delivery holds its own place, ``locks.holder_of``)."""
    times: dict[str, float] = {}
    lock = threading.Lock()

    @queue.task(name="l.again", lock="own", hard_timeout=0.2, retries=1,
                retry_policy=RetryPolicy(base=0.01, factor=1.0, jitter="none"))  # fmt: skip
    def again() -> str:
        context = current_task()
        assert context is not None
        if context.attempt == 1:
            time.sleep(0.8)  # outlives its hard timeout; the retry is scheduled at once
            with lock:
                times["first_end"] = time.monotonic()
            return "first"
        with lock:
            times["retry_start"] = time.monotonic()
        return "retry"

    handle = await again.enqueue()
    async with running(make_worker(queue, concurrency=4)):
        assert await handle.result(timeout=15) == "retry"
    assert times["retry_start"] >= times["first_end"]
