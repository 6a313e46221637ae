"""Rate limits against a real Redis, in both modes.

A limit is a token bucket in Redis shared by every worker: ``"10/s"`` lets a burst of 10 start
at once and then 10 per second. A task over its limit goes back to the schedule with a
reservation (same attempt, no slot held) and runs when its token exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, RateLimit, current_task

from .proc_tasks import make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``rq`` in ``mode``, closed after the test."""
    q = make_queue(name="rq", mode=mode)
    yield q
    await q.close()


def spread(starts: list[float]) -> float:
    """Seconds from the first start to the last."""
    return max(starts) - min(starts)


async def test_rate_limit_paces_starts_without_retries_or_held_slots(queue: Queue) -> None:
    starts: list[float] = []
    attempts: list[int] = []
    quick_done: list[float] = []

    @queue.task(name="r.limited", rate_limit="10/s")
    async def limited(i: int) -> int:
        ctx = current_task()
        assert ctx is not None
        starts.append(time.time())
        attempts.append(ctx.attempt)
        return i

    @queue.task(name="r.quick")
    async def quick() -> None:
        quick_done.append(time.time())

    enqueued = time.time()
    handles = await limited.enqueue_many([(i,) for i in range(30)])
    quick_handle = await quick.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        # The unlimited task queued behind 30 limited ones does not wait for them: a task
        # waiting for its token holds no slot.
        await quick_handle.result(timeout=5)
        quick_latency = quick_done[0] - enqueued
        assert [await h.result(timeout=10) for h in handles] == list(range(30))
    duration = max(starts) - enqueued
    print(
        f"30 tasks at 10/s: {duration:.2f} s from enqueue to last start "
        f"(first to last start {spread(starts):.2f} s); unlimited task done after "
        f"{quick_latency:.3f} s"
    )
    assert 1.6 <= duration <= 10.0, duration  # never faster than the limit; generous above
    # The unlimited task did not wait behind the paced ones: done before the last started.
    assert quick_done[0] < max(starts), quick_latency
    # Burst of 10 right away, then about 10 per second: never more than 10 + 10 in 1 s.
    ordered = sorted(starts)
    assert ordered[9] - ordered[0] < 1.0
    assert all(ordered[i + 20] - ordered[i] >= 0.9 for i in range(len(ordered) - 20))
    # Being rate limited is not a retry: every task ran once, as attempt 1.
    assert attempts == [1] * 30
    records = [await h.status() for h in handles]
    assert all(r is not None and r.attempts == 1 for r in records)


async def test_rate_key_shares_one_bucket_between_tasks(queue: Queue, raw_redis: Any) -> None:
    starts: list[float] = []

    @queue.task(name="r.a", rate_limit="10/s", rate_key="shared-api")
    async def a() -> None:
        starts.append(time.time())

    @queue.task(name="r.b", rate_limit="10/s", rate_key="shared-api")
    def b() -> None:
        starts.append(time.time())

    handles = await a.enqueue_many([() for _ in range(10)])
    handles += await b.enqueue_many([() for _ in range(10)])
    async with running(make_worker(queue, concurrency=10)):
        for h in handles:
            await h.result(timeout=10)
    print(
        f"20 tasks of two tasks sharing a 10/s bucket: first to last start {spread(starts):.2f} s"
    )
    # One bucket: 10 at once, the other 10 over the next second. Two buckets would let all
    # 20 start together.
    assert 0.8 <= spread(starts) <= 10.0, spread(starts)
    prefix = "{" + queue.namespace + "}:rl:"
    assert await raw_redis.exists(prefix + "shared-api") == 1
    assert await raw_redis.exists(prefix + "r.a") == 0
    assert await raw_redis.exists(prefix + "r.b") == 0


async def test_queue_rate_limit_covers_every_task_of_the_queue(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="rq", mode=mode, queue_rate_limits={"slowq": "5/s"})
    limited: list[float] = []
    free: list[float] = []

    @queue.task(name="r.one", queue="slowq")
    async def one() -> None:
        limited.append(time.time())

    @queue.task(name="r.two", queue="slowq")
    def two() -> None:
        limited.append(time.time())

    @queue.task(name="r.other")
    async def other() -> None:
        free.append(time.time())

    enqueued = time.time()
    handles = await one.enqueue_many([() for _ in range(5)])
    # High priority on the same queue shares the queue's limit too.
    handles += await two.options(priority="high").enqueue_many([() for _ in range(5)])
    others = await other.enqueue_many([() for _ in range(20)])
    async with running(make_worker(queue, concurrency=10)):
        for h in others:
            await h.result(timeout=5)
        others_done = time.time() - enqueued
        for h in handles:
            await h.result(timeout=10)
    print(
        f"queue limit 5/s: 10 tasks started over {spread(limited):.2f} s; "
        f"20 tasks of an unlimited queue done after {others_done:.2f} s"
    )
    assert 0.8 <= spread(limited) <= 10.0, spread(limited)
    # The unlimited queue is not paced (20 at 5/s would spread over 3 s) and did not wait
    # behind the limited one.
    assert spread(free) < 2.0, spread(free)
    assert max(free) < max(limited), others_done
    await queue.close()


def test_rate_limit_parse_accepts_units_and_rejects_bad_text() -> None:
    assert RateLimit.parse("10/s") == RateLimit(10.0, 1.0, None, None)
    assert RateLimit.parse("100/m").period == 60.0
    assert RateLimit.parse("1000/hour").rate == pytest.approx(1000 / 3600)
    five = RateLimit.parse("5/10s")
    assert (five.count, five.period, five.rate) == (5.0, 10.0, 0.5)
    assert RateLimit.parse(" 2 / day ").period == 86400.0
    assert RateLimit.parse("10/s", key="k").key == "k"
    assert RateLimit.parse("10/s").capacity == 10.0
    assert RateLimit(0.5, 1.0).capacity == 1.0
    assert RateLimit(100, 1.0, burst=5).capacity == 5
    bad: list[Any] = [
        "", "10", "ten/s", "10/fortnight", "10/", "/s", "0/s", "-1/s", "10/0s", "10 per s",
        "1e3/s", "10/s/s", None, 10,
    ]  # fmt: skip
    for spec in bad:
        with pytest.raises(ConfigurationError):
            RateLimit.parse(spec)
    with pytest.raises(ConfigurationError):
        RateLimit(10, 1.0, burst=0)
    with pytest.raises(ConfigurationError):
        RateLimit(10, 0.0)


def test_bad_rate_limit_options_are_configuration_errors() -> None:
    queue = Queue(name="rq", redis_url="redis://127.0.0.1:1/0", namespace="unused")

    def fn() -> None:
        return None

    with pytest.raises(ConfigurationError):
        queue.task(name="r.bad", rate_limit="fast")(fn)
    with pytest.raises(ConfigurationError):
        queue.task(name="r.key-only", rate_key="k")(fn)
    with pytest.raises(ConfigurationError):
        Queue(redis_url="redis://127.0.0.1:1/0", queue_rate_limits={"q": "lots"})
    with pytest.raises(ConfigurationError):
        Queue(redis_url="redis://127.0.0.1:1/0", queue_rate_limits={"bad name": "5/s"})


async def test_limit_on_one_task_leaves_others_alone(queue: Queue) -> None:
    """A slow bucket on one task does not delay another task's bucket or unlimited work."""
    seen: dict[str, list[float]] = {"slow": [], "fast": []}

    @queue.task(name="r.slow", rate_limit="2/s")
    async def slow() -> None:
        seen["slow"].append(time.time())

    @queue.task(name="r.fast", rate_limit="100/s")
    async def fast() -> None:
        seen["fast"].append(time.time())

    slow_handles = await slow.enqueue_many([() for _ in range(4)])
    fast_handles = await fast.enqueue_many([() for _ in range(20)])
    async with running(make_worker(queue, concurrency=5)):
        for h in fast_handles:
            await h.result(timeout=5)
        fast_spread = spread(seen["fast"])
        for h in slow_handles:
            await h.result(timeout=5)
    assert fast_spread < 3.0, fast_spread  # 2/s would spread the 20 over 10 s
    # 2 at once, then one every 0.5 s.
    assert 0.8 <= spread(seen["slow"]) <= 10.0, seen["slow"]
