"""The eager test mode and the worker harness (issue 12, testing helpers), in-process.

The user's view -- a pytest file run under the installed plugin -- is
``test_pytest_plugin.py``; here the same machinery is checked case by case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from blitzq import (
    Middleware,
    Queue,
    RateLimit,
    ResultTimeout,
    RetryPolicy,
    SerializationError,
    TaskCancelled,
    TaskContext,
    TaskFailed,
    TaskState,
    TaskTimeout,
)
from blitzq.testing import WorkerHarness, eager


async def test_enqueue_returns_after_the_task_ran() -> None:
    queue = Queue(namespace="eager-a")  # no URL: must not start the embedded server
    seen: list[int] = []

    @queue.task(name="e.add")
    async def add(a: int, b: int) -> int:
        seen.append(a + b)
        return a + b

    @queue.task(name="e.fan")
    async def fan(n: int) -> int:
        for i in range(n):  # enqueued while the drain runs: the same drain runs them
            await add.enqueue(i, 0)
        return n

    with eager() as mode:
        handle = await add.enqueue(2, 3)
        assert seen == [5]  # ran before enqueue returned
        assert await handle.result(timeout=5) == 5
        assert await (await fan.enqueue(3)).result(timeout=5) == 3
        assert sorted(seen) == [0, 1, 2, 5]
        assert queue.url.startswith("memory://eager-")
        assert mode.names
    await queue.close()


async def test_a_task_declared_fast_on_a_reliable_queue_runs() -> None:
    """A ``mode="fast"`` task of a reliable Queue travels the broker's fast lane: the eager
    drain fetches from it too, as a worker's second loop per queue does (it never ran, and
    result() waited for nothing; tester finding)."""
    queue = Queue(namespace="eager-lane")

    @queue.task(name="e.push", mode="fast")
    async def push(user: str) -> str:
        return f"pushed {user}"

    @queue.task(name="e.plain")
    async def plain(user: str) -> str:
        return f"plain {user}"

    with eager():
        pushed = await push.enqueue("ada")
        assert await pushed.result(timeout=5) == "pushed ada"
        assert await (await plain.enqueue("bo")).result(timeout=5) == "plain bo"
        record = await queue.inspect(pushed.id)
        assert record is not None
        assert record.state is TaskState.SUCCEEDED
        handles = await push.enqueue_many([("x",), ("y",)])
        assert [await h.result(timeout=5) for h in handles] == ["pushed x", "pushed y"]
    await queue.close()


async def test_arguments_are_serialized_as_in_production() -> None:
    queue = Queue(namespace="eager-b")

    @queue.task(name="e.echo")
    async def echo(value: object) -> object:
        return value

    with eager():
        with pytest.raises(SerializationError, match="not plain data"):
            await echo.enqueue(object())
        # A tuple comes back a list, as it does through Redis.
        assert await (await echo.enqueue((1, 2))).result(timeout=5) == [1, 2]
    await queue.close()


async def test_retries_within_the_horizon_run_and_delays_beyond_it_wait() -> None:
    queue = Queue(namespace="eager-c")
    calls = {"n": 0}

    @queue.task(name="e.flaky", retries=2, retry_policy=RetryPolicy(base=0.05, jitter="none"))
    async def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise RuntimeError("not yet")
        return "ok"

    @queue.task(name="e.later")
    async def later() -> None:
        return None

    with eager():
        handle = await flaky.enqueue()
        assert await handle.result(timeout=5) == "ok"
        assert calls["n"] == 3
        delayed = await later.options(delay=3600).enqueue()
        record = await queue.inspect(delayed.id)
        assert record is not None
        assert record.state is TaskState.SCHEDULED
        # Tester's input: `await delayed.result()` (no timeout) hung the test for good. It
        # cannot come in this test: said at once, with the due time and the horizon.
        for timeout in (None, 30):
            with pytest.raises(ResultTimeout, match=r"scheduled, due in 3[56]\d\d s.*horizon"):
                await asyncio.wait_for(delayed.result(timeout=timeout), 10)
    await queue.close()


def test_sync_api_and_workflows_in_eager_mode() -> None:
    queue = Queue(namespace="eager-d")

    @queue.task(name="e.double")
    def double(x: int) -> int:
        return 2 * x

    with eager():
        assert double.enqueue_sync(21).result_sync(timeout=5) == 42
        flow = queue.apply_sync(double.s(1) | double.s() | double.s())
        assert flow.get_sync(timeout=5) == 8
    queue.close_sync()


async def test_the_mode_switches_back(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()  # the test server
    url = queue.url
    with eager():
        assert queue.url.startswith("memory://")
    assert queue.url == url
    await queue.close()


async def test_worker_harness_drains_on_the_queues_own_backend(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    done: list[int] = []

    @queue.task(name="h.work")
    async def work(i: int) -> None:
        await asyncio.sleep(0)
        done.append(i)

    async with WorkerHarness(queue, concurrency=4) as w:
        await work.enqueue_many([(i,) for i in range(20)])
        await w.drain(timeout=30)
        assert sorted(done) == list(range(20))
    with pytest.raises(RuntimeError, match="inside"):
        await w.drain()
    await queue.close()


# ---------------------------------------------------------------- issue 27, item 2


class Boom(Exception):
    """A user's own exception type."""


async def test_result_raises_the_tasks_own_exception_or_task_failed() -> None:
    """``result()`` of a failed task raises what the task raised (``pytest.raises(Boom)``
    works); the record is production's; ``propagate=False`` gives ``TaskFailed``."""
    queue = Queue(namespace="eager-e")

    @queue.task(name="e.boom", retries=0)
    async def boom(n: int) -> None:
        raise Boom(f"no {n}")

    @queue.task(name="e.boom_sync", retries=0)
    def boom_sync() -> None:
        raise KeyError("k")

    @queue.task(name="e.ok")
    async def ok() -> int:
        return 1

    with eager() as mode:
        handle = await boom.enqueue(1)
        with pytest.raises(Boom, match="no 1"):
            await handle.result(timeout=5)
        with pytest.raises(KeyError):
            await (await boom_sync.enqueue()).result(timeout=5)
        record = await queue.inspect(handle.id)
        assert record is not None
        assert record.state is TaskState.DEAD_LETTERED  # the default: dead_letter=True
        assert record.error_type is not None
        assert record.error_type.endswith("Boom")
        handles = [await ok.enqueue(), handle]
        one, failed = await queue.get_results(handles, timeout=5, return_exceptions=True)
        assert one == 1
        assert isinstance(failed, Boom)
        with pytest.raises(Boom):
            await queue.get_results(handles, timeout=5)
        mode.propagate = False  # the fixture's mode can be switched in a test
        with pytest.raises(TaskFailed) as info:
            await handle.result(timeout=5)
        assert info.value.error_type == record.error_type
    with eager(propagate=False), pytest.raises(TaskFailed, match="no 2"):
        await (await boom.enqueue(2)).result(timeout=5)
    await queue.close()


def test_sync_result_and_a_workflow_raise_the_tasks_own_exception() -> None:
    queue = Queue(namespace="eager-f")

    @queue.task(name="e.double")
    def double(x: int) -> int:
        return 2 * x

    @queue.task(name="e.refuse", retries=0)
    def refuse(x: int) -> int:
        raise Boom(f"refused {x}")

    with eager():
        with pytest.raises(Boom, match="refused 3"):
            refuse.enqueue_sync(3).result_sync(timeout=5)
        flow = queue.apply_sync(double.s(1) | refuse.s() | double.s())
        with pytest.raises(Boom, match="refused 2"):
            flow.get_sync(timeout=5)
    with eager(propagate=False):
        flow = queue.apply_sync(double.s(1) | refuse.s())
        with pytest.raises(TaskFailed):
            flow.get_sync(timeout=5)
    queue.close_sync()


async def test_retries_delays_and_etas_run_in_virtual_time() -> None:
    """The default retry policy (3 retries, backoff up to 4 s), a delay of a minute and an
    eta an hour away... within the horizon run before the enqueue returns, with production's
    attempts and records; no timing is asserted (the test just ends)."""
    queue = Queue(namespace="eager-g")
    calls: dict[str, int] = {}

    @queue.task(name="e.flaky")  # the default retries
    async def flaky(key: str) -> str:
        calls[key] = calls.get(key, 0) + 1
        if calls[key] <= 3:
            raise Boom(f"attempt {calls[key]}")
        return key

    @queue.task(name="e.hopeless")
    async def hopeless() -> None:
        raise Boom("never")

    @queue.task(name="e.stamp")
    async def stamp(label: str) -> str:
        return label

    with eager(horizon=3600):
        handle = await flaky.enqueue("a")
        assert calls["a"] == 4  # ran, with its three retries, before enqueue returned
        assert await handle.result(timeout=5) == "a"
        record = await queue.inspect(handle.id)
        assert record is not None
        assert (record.state, record.attempts) == (TaskState.SUCCEEDED, 4)
        failed = await hopeless.enqueue()
        with pytest.raises(Boom, match="never"):
            await failed.result(timeout=5)
        record = await queue.inspect(failed.id)
        assert record is not None
        assert (record.state, record.attempts) == (TaskState.DEAD_LETTERED, 4)
        delayed = await stamp.options(delay=60).enqueue("delay")
        assert await delayed.result(timeout=5) == "delay"
        at = datetime.now(UTC) + timedelta(minutes=50)
        timed = await stamp.options(eta=at).enqueue("eta")
        assert await timed.result(timeout=5) == "eta"
        later = await stamp.options(delay=7200).enqueue("later")  # past the horizon
        record = await queue.inspect(later.id)
        assert record is not None
        assert record.state is TaskState.SCHEDULED
    with eager(horizon=0):  # no virtual time at all: a retry's backoff is waited for
        slow = await stamp.options(delay=600).enqueue("slow")
        record = await queue.inspect(slow.id)
        assert record is not None
        assert record.state is TaskState.SCHEDULED
    await queue.close()


async def test_a_task_waiting_for_a_child_and_a_thread_task_enqueuing() -> None:
    """A task may enqueue another and wait for its result (the drain runs the child
    meanwhile), from a coroutine or a thread (the sync API's loop tells the drain)."""
    queue = Queue(namespace="eager-h")

    @queue.task(name="e.child")
    async def child(n: int) -> int:
        return n + 1

    @queue.task(name="e.parent")
    async def parent(n: int) -> int:
        handle = await child.enqueue(n)
        return 10 * await handle.result(timeout=10)

    @queue.task(name="e.thread_parent")
    def thread_parent(n: int) -> int:
        return 100 * child.enqueue_sync(n).result_sync(timeout=10)

    with eager():
        assert await (await parent.enqueue(1)).result(timeout=5) == 20
        assert await (await thread_parent.enqueue(2)).result(timeout=5) == 300
    await queue.close()
    queue.close_sync()


async def test_an_unknown_task_fails_at_once_and_a_hard_timeout_raises() -> None:
    queue = Queue(namespace="eager-i")

    @queue.task(name="e.sleepy", timeout=0.2, retries=0)
    async def sleepy() -> None:
        await asyncio.sleep(30)

    with eager():
        handle = await queue.send("e.nobody")  # no Queue of this process registers it
        with pytest.raises(TaskFailed, match="unknown task"):
            await handle.result(timeout=5)
        with pytest.raises(TaskTimeout):
            await (await sleepy.enqueue()).result(timeout=30)
    await queue.close()


async def test_rate_limited_tasks_all_run() -> None:
    """A rate limit's wait keeps real time (the server's token bucket): the drain waits for
    it instead of skipping it, and every task runs."""
    queue = Queue(namespace="eager-j")
    ran: list[int] = []

    @queue.task(name="e.limited", rate_limit=RateLimit(5, 1.0, burst=2))
    async def limited(i: int) -> int:
        ran.append(i)
        return i

    with eager():
        handles = await limited.enqueue_many([(i,) for i in range(4)])
        assert sorted(ran) == [0, 1, 2, 3]
        assert await queue.get_results(handles, timeout=5) == [0, 1, 2, 3]
    await queue.close()


async def test_a_rate_limits_wait_is_never_skipped_by_virtual_time() -> None:
    """A message a rate limit put back holds the token its bucket reserved for its due
    time: virtual time does not bring it forward (it ran at once before; tester finding).
    The second call of a "1/m" task stays scheduled, due in about a minute, as in
    production, and result() says so at once."""
    queue = Queue(namespace="eager-rate")
    ran: list[int] = []

    @queue.task(name="e.sms", rate_limit="1/m")
    async def sms(n: int) -> int:
        ran.append(n)
        return n

    @queue.task(name="e.later")
    async def later(n: int) -> int:
        return n

    with eager():
        delayed = await later.options(delay=120).enqueue(7)  # a plain delay: skipped
        assert await delayed.result(timeout=5) == 7
        first = await sms.enqueue(1)
        second = await sms.enqueue(2)
        assert ran == [1]
        assert await first.result(timeout=5) == 1
        record = await queue.inspect(second.id)
        assert record is not None
        assert record.state is TaskState.SCHEDULED
        assert record.due_at is not None
        assert record.due_at - datetime.now(UTC).timestamp() > 30
        with pytest.raises(ResultTimeout, match="never skipped"):
            await second.result(timeout=5)
        # Virtual time does not pass it: a delay due after it waits with it.
        after = await later.options(delay=120).enqueue(8)
        assert (await queue.inspect(after.id)).state is TaskState.SCHEDULED  # type: ignore[union-attr]
        assert ran == [1]
    await queue.close()


async def test_fast_mode_other_queues_and_middleware_hooks() -> None:
    """The per-delivery path includes the middleware (before, after, on_retry hooks ran
    before the enqueue returned) and fast mode; an enqueue to a queue no task names runs."""
    seen: list[tuple[str, str]] = []

    class Trace(Middleware):
        async def before_execute(self, context: TaskContext) -> None:
            seen.append(("before", context.task))

        async def after_execute(self, context: TaskContext, result: object) -> None:
            seen.append(("after", context.task))

        async def on_retry(self, context: TaskContext, exc: BaseException, delay: float) -> None:
            seen.append(("retry", context.task))

    queue = Queue(namespace="eager-k", mode="fast")
    queue.add_middleware(Trace())
    calls = {"n": 0}

    @queue.task(name="e.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="e.twice")
    async def twice() -> int:
        calls["n"] += 1
        if calls["n"] < 2:
            raise RuntimeError("once more")
        return calls["n"]

    with eager():
        handle = await add.options(queue="elsewhere", priority="high").enqueue(2, 3)
        assert seen == [("before", "e.add"), ("after", "e.add")]
        assert await handle.result(timeout=5) == 5
        assert await (await twice.enqueue()).result(timeout=5) == 2
        assert seen[2:] == [
            ("before", "e.twice"),
            ("retry", "e.twice"),
            ("before", "e.twice"),
            ("after", "e.twice"),
        ]
    await queue.close()


async def test_a_drain_that_does_not_end_raises_timeout_error() -> None:
    """A task that never ends makes its enqueue raise ``TimeoutError`` after the mode's
    ``timeout``; the run is put back on its queue (as at a worker's shutdown) and the
    next activation starts clean."""
    queue = Queue(namespace="eager-l")
    started = asyncio.Event()

    @queue.task(name="e.forever")
    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    @queue.task(name="e.quick")
    async def quick() -> str:
        return "done"

    with eager(timeout=0.5):
        with pytest.raises(TimeoutError, match="did not end within"):
            await forever.enqueue()
        assert started.is_set()
    with eager():
        assert await (await quick.enqueue()).result(timeout=5) == "done"
    await queue.close()


async def test_inside_a_task_a_childs_failure_is_task_failed_as_in_production() -> None:
    """Only the test's own code gets the task's exception: a task waiting for a child that
    failed sees ``TaskFailed``, as in production, from a coroutine or a thread."""
    queue = Queue(namespace="eager-m")

    @queue.task(name="e.bad_child", retries=0)
    async def bad_child() -> None:
        raise Boom("child")

    @queue.task(name="e.careful")
    async def careful() -> str:
        try:
            await (await bad_child.enqueue()).result(timeout=10)
        except TaskFailed as exc:
            return f"caught {exc.error_type}"
        return "no failure"

    @queue.task(name="e.careful_thread")
    def careful_thread() -> str:
        try:
            bad_child.enqueue_sync().result_sync(timeout=10)
        except TaskFailed as exc:
            return f"caught {exc.error_type}"
        return "no failure"

    with eager():
        assert (await (await careful.enqueue()).result(timeout=5)).endswith("Boom")
        assert (await (await careful_thread.enqueue()).result(timeout=5)).endswith("Boom")
    await queue.close()
    queue.close_sync()


async def test_cancelling_a_running_task_cancels_it() -> None:
    """``handle.cancel()`` of a task running in the eager mode cancels it at once, as a
    worker does on the broker's event (the eager mode listens to none)."""
    queue = Queue(namespace="eager-n")
    started = asyncio.Event()

    @queue.task(name="e.sleeper")
    async def sleeper() -> None:
        started.set()
        await asyncio.sleep(30)

    @queue.task(name="e.canceller")
    async def canceller() -> list[str]:
        handle = await sleeper.enqueue()  # the running drain starts it beside this one
        await asyncio.wait_for(started.wait(), 10)
        return [handle.id, await handle.cancel()]

    with eager():
        sleeper_id, was = await (await canceller.enqueue()).result(timeout=5)
        assert was in ("running", "pending")
        with pytest.raises(TaskCancelled):
            await queue.get_result(sleeper_id, timeout=5)
    await queue.close()
