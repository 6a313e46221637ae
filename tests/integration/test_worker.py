"""The worker against a real Redis, in both modes: executors, retries, timeouts, bounds, TTLs.

Each test runs an in-process :class:`~blitzq.Worker` on the test loop (see
``proc_tasks.running``) and waits for results or conditions with deadlines, never for a fixed
"long enough" sleep.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import (
    Queue,
    ResultNotStored,
    ResultTimeout,
    Retry,
    RetryPolicy,
    TaskFailed,
    TaskState,
)

from . import proc_tasks
from .proc_tasks import eventually, make_worker, running

FAST_RETRY = RetryPolicy(base=0.05, factor=1.0, jitter="none")


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode`` on the test namespace, closed after the test."""
    q = make_queue(mode=mode)
    yield q
    await q.close()


# ------------------------------------------------------------------------------ executors
async def test_async_and_thread_tasks_produce_results(queue: Queue) -> None:
    main_thread = threading.get_ident()

    @queue.task(name="t.add")
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    @queue.task(name="t.mul")
    def mul(a: int, b: int) -> dict[str, Any]:
        return {"product": a * b, "other_thread": threading.get_ident() != main_thread}

    @queue.task(name="t.eager")
    async def eager(x: str) -> str:  # never suspends: completes inline
        return x.upper()

    async with running(make_worker(queue, concurrency=4)):
        h1 = await add.enqueue(2, 3)
        h2 = await mul.enqueue(4, b=5)
        h3 = await eager.enqueue("hi")
        assert await h1.result(timeout=10) == 5
        assert await h2.result(timeout=10) == {"product": 20, "other_thread": True}
        assert await h3.result(timeout=10) == "HI"
    record = await h1.status()
    assert record is not None
    assert record.state is TaskState.SUCCEEDED
    assert record.attempts == 1
    assert record.result == 5
    assert record.started_at is not None
    assert record.finished_at is not None


async def test_process_tasks_produce_results(queue: Queue) -> None:
    square = queue.task(name="p.square", executor="process")(proc_tasks.square)
    pid = queue.task(name="p.pid", executor="process")(proc_tasks.process_id)
    boom = queue.task(name="p.boom", executor="process", retries=0)(proc_tasks.fail_in_process)
    async with running(make_worker(queue, concurrency=4, process_pool_size=1)):
        h1 = await square.enqueue(7)
        h2 = await pid.enqueue()
        h3 = await boom.enqueue("from child")
        assert await h1.result(timeout=60) == 49
        child = await h2.result(timeout=60)
        assert isinstance(child, int)
        assert child != os.getpid()
        with pytest.raises(TaskFailed) as info:
            await h3.result(timeout=60)
    assert info.value.error_type == "ValueError"
    assert info.value.error == "from child"


# -------------------------------------------------------------------------------- retries
async def test_retry_goes_back_to_schedule_and_frees_the_slot(queue: Queue) -> None:
    finished: list[str] = []
    starts: list[float] = []

    @queue.task(name="t.flaky")
    async def flaky() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise Retry(delay=1.0)
        finished.append("flaky")
        return "flaky"

    @queue.task(name="t.quick")
    async def quick() -> str:
        finished.append("quick")
        return "quick"

    h_flaky = await flaky.enqueue()
    h_quick = await quick.enqueue()
    async with running(make_worker(queue, concurrency=1)):
        assert await h_quick.result(timeout=10) == "quick"
        # While the retry waits, it is on the schedule, not in a slot.
        assert finished == ["quick"]
        stats = await queue.stats([queue.name])
        assert stats["scheduled"] == 1
        assert await h_flaky.result(timeout=10) == "flaky"
    assert finished == ["quick", "flaky"]
    assert starts[1] - starts[0] >= 0.95
    record = await h_flaky.status()
    assert record is not None
    assert record.attempts == 2


async def test_policy_backoff_retry_does_not_block_other_tasks(queue: Queue) -> None:
    finished: list[str] = []
    starts: list[float] = []

    @queue.task(name="t.backoff", retries=1, retry_policy=RetryPolicy(base=0.8, jitter="none"))
    def backoff() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise ConnectionError("transient")
        finished.append("backoff")
        return "ok"

    @queue.task(name="t.other")
    def other() -> str:
        finished.append("other")
        return "other"

    h1 = await backoff.enqueue()
    h2 = await other.enqueue()
    async with running(make_worker(queue, concurrency=1)):
        assert await h2.result(timeout=10) == "other"
        assert await h1.result(timeout=10) == "ok"
    assert finished == ["other", "backoff"]
    assert starts[1] - starts[0] >= 0.75


@pytest.mark.parametrize("delay", [0.0, 0.5])
async def test_retry_exception_waits_its_delay(queue: Queue, delay: float) -> None:
    starts: list[float] = []

    @queue.task(name="t.retry_delay", retries=1)
    async def again() -> int:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise Retry(delay=delay, reason="not ready")
        return len(starts)

    async with running(make_worker(queue, concurrency=2)):
        h = await again.enqueue()
        assert await h.result(timeout=10) == 2
    gap = starts[1] - starts[0]
    assert delay - 0.05 <= gap < delay + 2.0


async def test_exhausted_retries_fail_and_dead_letter(queue: Queue) -> None:
    calls: list[int] = []

    @queue.task(name="t.always_fails", retries=2, retry_policy=FAST_RETRY)
    def always_fails(n: int) -> None:
        calls.append(n)
        raise ValueError(f"bad {n}")

    async with running(make_worker(queue, concurrency=2)):
        h = await always_fails.enqueue(7)
        with pytest.raises(TaskFailed) as info:
            await h.result(timeout=10)
    assert calls == [7, 7, 7]
    err = info.value
    assert err.task_id == h.id
    assert err.state == "dead_lettered"
    assert err.error_type == "ValueError"
    assert err.error == "bad 7"
    assert err.traceback is not None
    assert "ValueError: bad 7" in err.traceback
    record = await h.status()
    assert record is not None
    assert record.state is TaskState.DEAD_LETTERED
    assert record.attempts == 3
    (dead,) = await queue.dead_letters()
    assert dead.id == h.id
    assert dead.reason == "failed"
    assert dead.task == "t.always_fails"
    assert dead.queue == queue.name
    assert dead.args == [7]
    assert "bad 7" in dead.error


async def test_no_dead_letter_when_disabled(queue: Queue) -> None:
    @queue.task(name="t.no_dlq", retries=0, dead_letter=False)
    async def no_dlq() -> None:
        raise RuntimeError("nope")

    async with running(make_worker(queue, concurrency=2)):
        h = await no_dlq.enqueue()
        with pytest.raises(TaskFailed) as info:
            await h.result(timeout=10)
    assert info.value.state == "failed"
    record = await h.status()
    assert record is not None
    assert record.state is TaskState.FAILED
    assert await queue.dead_letter_count() == 0


async def test_exceptions_outside_retry_on_fail_at_once(queue: Queue) -> None:
    calls: list[int] = []

    @queue.task(name="t.picky", retries=5, retry_policy=RetryPolicy(retry_on=(KeyError,)))
    async def picky() -> None:
        calls.append(1)
        raise ValueError("not retried")

    async with running(make_worker(queue, concurrency=2)):
        h = await picky.enqueue()
        with pytest.raises(TaskFailed):
            await h.result(timeout=10)
    assert calls == [1]


# ------------------------------------------------------------------------------- timeouts
async def test_async_timeout_cancels_the_coroutine(queue: Queue) -> None:
    cancelled = asyncio.Event()

    @queue.task(name="t.sleepy", timeout=0.3, retries=0)
    async def sleepy() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with running(make_worker(queue, concurrency=2)):
        start = time.monotonic()
        h = await sleepy.enqueue()
        with pytest.raises(TaskFailed) as info:
            await h.result(timeout=10)
        assert time.monotonic() - start < 5
    assert cancelled.is_set()
    assert info.value.error_type is not None
    assert info.value.error_type.endswith("TaskTimeout")
    (dead,) = await queue.dead_letters()
    assert dead.reason == "failed"
    assert "TaskTimeout" in dead.error


async def test_per_call_timeout_overrides_the_task(queue: Queue) -> None:
    @queue.task(name="t.maybe_slow", retries=0)
    async def maybe_slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    async with running(make_worker(queue, concurrency=2)):
        h = await maybe_slow.options(timeout=0.2).enqueue(30)
        ok = await maybe_slow.enqueue(0.01)
        with pytest.raises(TaskFailed) as info:
            await h.result(timeout=10)
        assert await ok.result(timeout=10) == "done"
    assert info.value.error_type is not None
    assert info.value.error_type.endswith("TaskTimeout")


# Timed-out thread tasks keep their slots: tests/integration/test_abandoned_threads.py


# -------------------------------------------------------------------------- concurrency
class Gauge:
    """Counts tasks running at once and remembers the highest count (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


@pytest.mark.both_servers  # fetching differs on Redis >= 7.2 / Valkey
async def test_global_concurrency_bound_async(queue: Queue) -> None:
    gauge = Gauge()

    @queue.task(name="t.gauged")
    async def gauged(i: int) -> int:
        gauge.enter()
        try:
            await asyncio.sleep(0.02)
        finally:
            gauge.leave()
        return i

    handles = await gauged.enqueue_many([(i,) for i in range(50)])
    async with running(make_worker(queue, concurrency=5)):
        results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
    assert results == list(range(50))
    assert gauge.peak == 5


@pytest.mark.both_servers  # fetching differs on Redis >= 7.2 / Valkey
async def test_global_concurrency_bound_threads(queue: Queue) -> None:
    gauge = Gauge()

    @queue.task(name="t.gauged_thread")
    def gauged_thread(i: int) -> int:
        gauge.enter()
        try:
            time.sleep(0.01)
        finally:
            gauge.leave()
        return i

    handles = await gauged_thread.enqueue_many([(i,) for i in range(50)])
    async with running(make_worker(queue, concurrency=3)):
        results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
    assert results == list(range(50))
    assert 1 <= gauge.peak <= 3


@pytest.mark.both_servers  # fetching differs on Redis >= 7.2 / Valkey
async def test_queue_concurrency_bound(queue: Queue) -> None:
    total, per_a, per_b = Gauge(), Gauge(), Gauge()

    async def body(gauge: Gauge) -> None:
        total.enter()
        gauge.enter()
        try:
            await asyncio.sleep(0.02)
        finally:
            gauge.leave()
            total.leave()

    @queue.task(name="t.on_a", queue="a")
    async def on_a(i: int) -> int:
        await body(per_a)
        return i

    @queue.task(name="t.on_b", queue="b")
    async def on_b(i: int) -> int:
        await body(per_b)
        return i

    handles = await on_a.enqueue_many([(i,) for i in range(20)])
    handles += await on_b.enqueue_many([(i,) for i in range(20)])
    worker = make_worker(queue, queues=["a", "b"], concurrency=6, queue_concurrency={"a": 2})
    async with running(worker):
        await asyncio.gather(*(h.result(timeout=20) for h in handles))
    assert per_a.peak == 2
    assert total.peak <= 6
    assert per_b.peak >= 3  # the quiet queue is not held to the busy queue's bound


# ------------------------------------------------------------------------ results / TTL
async def test_result_readable_until_ttl_then_gone(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode, result_ttl=1)

    @queue.task(name="t.answer")
    async def answer() -> int:
        return 42

    try:
        async with running(make_worker(queue, concurrency=2)):
            h = await answer.enqueue()
            assert await h.result(timeout=10) == 42
        key = "{" + namespace + "}:t:" + h.id
        ttl = await raw_redis.ttl(key)
        assert 0 <= ttl <= 1 or await raw_redis.exists(key) == 0
        await eventually(lambda: raw_redis.exists(key), lambda n: n == 0, timeout=30.0)
        assert await queue.inspect(h.id) is None
        with pytest.raises(ResultTimeout):
            await h.result(timeout=0.2)
    finally:
        await queue.close()


async def test_store_result_false_writes_no_success_record(queue: Queue) -> None:
    ran = asyncio.Event()

    @queue.task(name="t.silent", store_result=False)
    async def silent() -> int:
        ran.set()
        return 1

    @queue.task(name="t.marker")
    async def marker() -> int:
        return 2

    async with running(make_worker(queue, concurrency=1)):
        h = await silent.enqueue()
        await asyncio.wait_for(ran.wait(), 10)
        # A later task's record is written after the silent one's completion.
        m = await marker.enqueue()
        assert await m.result(timeout=10) == 2
        assert await h.status() is None
        with pytest.raises(ResultNotStored):  # at once: nothing is stored to wait for
            await h.result()
        with pytest.raises(ResultTimeout):  # by id nothing tells: no record is written
            await queue.get_result(h.id, timeout=0.2)
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}


async def test_queue_store_results_false_still_records_failures(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, store_results=False)

    @queue.task(name="t.fine")
    async def fine() -> int:
        return 1

    @queue.task(name="t.broken", retries=0)
    async def broken() -> int:
        raise ValueError("x")

    try:
        async with running(make_worker(queue, concurrency=1)):
            ok = await fine.enqueue()
            bad = await broken.enqueue()
            with pytest.raises(TaskFailed):
                await queue.get_result(bad.id, timeout=10)
            with pytest.raises(TaskFailed):  # the handle reports a recorded failure too
                await bad.result()
            assert await ok.status() is None
    finally:
        await queue.close()


# --------------------------------------------------------------------------- delay / eta
async def test_delayed_tasks_never_start_early(queue: Queue) -> None:
    started: dict[str, float] = {}

    @queue.task(name="t.when")
    async def when(label: str) -> str:
        started[label] = time.time()
        return label

    async with running(make_worker(queue, concurrency=4)):
        t0 = time.time()
        # Due 2 s and more ahead: still scheduled when stats() runs, even on a busy machine.
        due = {"delay": t0 + 2.0, "eta": t0 + 2.3, "eta_float": t0 + 2.1}
        handles = [
            await when.options(delay=2.0).enqueue("delay"),
            await when.options(eta=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2.3)).enqueue(
                "eta"
            ),
            await when.options(eta=t0 + 2.1).enqueue("eta_float"),
            await when.enqueue("now"),
        ]
        assert (await queue.stats([queue.name]))["scheduled"] >= 2
        results = await asyncio.gather(*(h.result(timeout=10) for h in handles))
    assert results == ["delay", "eta", "eta_float", "now"]
    for label, at in due.items():
        assert started[label] >= at - 0.001, label
        assert started[label] < at + 10.0, label  # generous: a busy machine
    assert started["now"] < due["delay"]
