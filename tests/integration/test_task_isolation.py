"""Task code cannot harm the worker or the next task (issue 7, sections 3 and 4).

- Anything task code raises (any ``BaseException`` but the worker's own cancellation) ends as
  a failed attempt with a record; describing an error never raises (a ``__str__`` or
  ``__repr__`` that raises, a huge message, an exception a pool process cannot send back).
- Middleware and signal handlers that raise ``SystemExit`` do not stop the worker.
- Each task, of every executor, starts in a fresh copy of the worker's base context: a
  context variable one task sets is never seen by the next.

Each test runs an in-process worker on the test loop against the real server (both modes
where the completion differs); the worker must still run the next task afterwards.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Middleware, Queue, Signal, SignalEvent, TaskContext, TaskFailed, TaskState
from blitzq.exceptions import MAX_ERROR_CHARS, describe_error
from blitzq.worker.execution import MAX_TRACEBACK_CHARS, format_traceback

from . import odd_tasks
from .odd_tasks import VAR
from .proc_tasks import make_worker, running

#: Seconds to wait for a result (generous: the machine may be loaded; process pools spawn).
WAIT = 60.0


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``iso`` in ``mode``, closed after the test."""
    q = make_queue(name="iso", mode=mode)
    yield q
    await q.close()


async def failure_of(handle: Any) -> TaskFailed:
    """Wait for ``handle``'s task to fail; return the TaskFailed its result raised."""
    with pytest.raises(TaskFailed) as info:
        await handle.result(timeout=WAIT)
    return info.value


async def assert_failed_once(queue: Queue, handle: Any, error_type: str, error: str) -> None:
    """The task failed on its first attempt with this readable error; nothing is left in
    flight (the message was acknowledged together with the record)."""
    failure = await failure_of(handle)
    assert failure.state in ("failed", "dead_lettered")
    assert failure.error_type == error_type
    assert failure.error == error
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.state in (TaskState.FAILED, TaskState.DEAD_LETTERED)
    assert record.attempts == 1
    assert record.error == error
    stats = await queue.stats(["iso"])
    assert stats["queues"]["iso"]["in_flight"] == 0


# ------------------------------------------------------------ describing errors
@pytest.mark.parametrize(
    ("kind", "message"),
    [("str", "<unprintable BadStr>"), ("repr", "the message"), ("both", "<unprintable BadBoth>")],
)
def test_describe_error_never_raises(kind: str, message: str) -> None:
    exc = odd_tasks.ERRORS[kind]("the message")
    name, text = describe_error(exc)
    assert name == f"tests.integration.odd_tasks.{type(exc).__qualname__}"
    assert text == message
    assert type(exc).__name__ in format_traceback(exc)


def test_describe_error_cuts_a_huge_message_and_keeps_the_frames() -> None:
    def huge() -> None:
        raise ValueError("x" * 5_000_000)

    try:
        huge()
    except ValueError as exc:
        name, text = describe_error(exc)
        trace = format_traceback(exc)
    assert name == "ValueError"
    assert len(text) <= MAX_ERROR_CHARS + 100
    assert text.endswith("(5000000 characters in all)")
    assert len(trace) <= MAX_TRACEBACK_CHARS
    assert "in huge" in trace  # the frames survive the cut, not only the message


# ----------------------------------------------------------------- odd errors
@pytest.mark.parametrize("executor", ["async-first-step", "async-after-await", "thread", "process"])
@pytest.mark.parametrize(
    ("kind", "message"),
    [("str", "<unprintable BadStr>"), ("repr", "the message"), ("both", "<unprintable BadBoth>")],
)
async def test_an_unprintable_exception_fails_the_attempt_with_a_readable_error(
    queue: Queue, executor: str, kind: str, message: str
) -> None:
    if executor == "async-first-step":

        async def body(kind: str) -> None:
            odd_tasks.raise_odd(kind)

        task = queue.task(name="iso.odd", retries=0)(body)
    elif executor == "async-after-await":

        async def body(kind: str) -> None:
            await asyncio.sleep(0.01)
            odd_tasks.raise_odd(kind)

        task = queue.task(name="iso.odd", retries=0)(body)
    else:
        task = queue.task(name="iso.odd", executor=executor, retries=0)(odd_tasks.raise_odd)

    @queue.task(name="iso.next")
    async def next_task(x: int) -> int:
        return x + 1

    error_type = f"tests.integration.odd_tasks.{odd_tasks.ERRORS[kind].__qualname__}"
    async with running(make_worker(queue, concurrency=2, process_pool_size=1)):
        handle = await task.enqueue(kind)
        await assert_failed_once(queue, handle, error_type, message)
        assert await (await next_task.enqueue(1)).result(timeout=WAIT) == 2


async def test_a_huge_exception_message_is_recorded_cut(queue: Queue) -> None:
    @queue.task(name="iso.huge", retries=0)
    async def huge() -> None:
        await asyncio.sleep(0)
        raise ValueError("y" * 3_000_000)

    async with running(make_worker(queue)):
        handle = await huge.enqueue()
        failure = await failure_of(handle)
    assert failure.error is not None
    assert failure.error.endswith("(3000000 characters in all)")
    assert len(failure.error) <= MAX_ERROR_CHARS + 100
    assert failure.traceback is not None
    assert "in huge" in failure.traceback
    assert len(failure.traceback) <= MAX_TRACEBACK_CHARS


@pytest.mark.parametrize("executor", ["async-first-step", "async-after-await", "thread", "process"])
@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "CustomBase"])
async def test_a_base_exception_from_task_code_is_a_failed_attempt(
    queue: Queue, executor: str, kind: str
) -> None:
    if executor == "async-first-step":

        async def body(kind: str) -> None:
            odd_tasks.raise_base(kind)

        task = queue.task(name="iso.base", retries=3)(body)
    elif executor == "async-after-await":

        async def body(kind: str) -> None:
            await asyncio.sleep(0.01)
            odd_tasks.raise_base(kind)

        task = queue.task(name="iso.base", retries=3)(body)
    else:
        task = queue.task(name="iso.base", executor=executor, retries=3)(odd_tasks.raise_base)

    @queue.task(name="iso.next")
    async def next_task(x: int) -> int:
        return x + 1

    expected = {
        "SystemExit": ("SystemExit", "3"),
        "KeyboardInterrupt": ("KeyboardInterrupt", ""),
        "GeneratorExit": ("GeneratorExit", ""),
        "CustomBase": ("tests.integration.odd_tasks.CustomBase", "custom"),
    }[kind]
    async with running(make_worker(queue, concurrency=2, process_pool_size=1)):
        handle = await task.enqueue(kind)
        # Not an Exception: the default retry policy does not retry it; one attempt.
        await assert_failed_once(queue, handle, *expected)
        assert await (await next_task.enqueue(1)).result(timeout=WAIT) == 2


@pytest.mark.parametrize("kind", ["unpicklable", "not-unpicklable"])
async def test_an_exception_a_pool_process_cannot_send_back_is_described(
    queue: Queue, kind: str
) -> None:
    bad = queue.task(name="iso.unsendable", executor="process", retries=0)(
        odd_tasks.raise_unsendable
    )
    slow = queue.task(name="iso.slow", executor="process", retries=0)(odd_tasks.sleep_then)
    expected = "Unpicklable" if kind == "unpicklable" else "NeedsTwo"
    message = "holds a lock" if kind == "unpicklable" else "one/two"
    async with running(make_worker(queue, concurrency=4, process_pool_size=2)):
        # Warm the pool, then run the bad call beside one that is still running.
        assert await (await slow.enqueue(0.0, 1)).result(timeout=WAIT) == 1
        running_beside = await slow.enqueue(1.0, 2)
        handle = await bad.enqueue(kind)
        failure = await failure_of(handle)
        assert failure.error_type == "blitzq.worker.executors.RemoteError"
        assert failure.error == f"tests.integration.odd_tasks.{expected}: {message}"
        # The pool is intact: the call beside it and the next ones succeed.
        assert await running_beside.result(timeout=WAIT) == 2
        assert await (await slow.enqueue(0.0, 3)).result(timeout=WAIT) == 3


async def test_a_result_a_pool_process_cannot_send_back_fails_only_its_own_run(
    queue: Queue,
) -> None:
    bad = queue.task(name="iso.notback", executor="process", retries=0)(odd_tasks.return_not_back)
    slow = queue.task(name="iso.slow", executor="process", retries=0)(odd_tasks.sleep_then)
    async with running(make_worker(queue, concurrency=4, process_pool_size=2)):
        assert await (await slow.enqueue(0.0, 1)).result(timeout=WAIT) == 1
        running_beside = await slow.enqueue(1.0, 2)
        failure = await failure_of(await bad.enqueue())
        assert failure.error_type == "blitzq.exceptions.SerializationError"
        assert failure.error is not None
        assert "cannot be sent back from the pool process" in failure.error
        assert await running_beside.result(timeout=WAIT) == 2
        assert await (await slow.enqueue(0.0, 3)).result(timeout=WAIT) == 3


# ------------------------------------------------------- middleware and signals
class ExitingMiddleware(Middleware):
    """Raises SystemExit from the hook named ``where``."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.errors_seen: list[str] = []

    async def before_execute(self, context: TaskContext) -> None:
        if self.where == "before_execute" and context.task == "iso.victim":
            raise SystemExit(4)

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        if self.where == "after_execute":
            raise SystemExit(5)

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        self.errors_seen.append(describe_error(exc)[0])
        if self.where == "on_error":
            raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["before_execute", "after_execute", "on_error", "signal"])
async def test_middleware_and_signal_handlers_raising_system_exit_do_not_stop_the_worker(
    queue: Queue, where: str
) -> None:
    middleware = ExitingMiddleware(where)
    queue.add_middleware(middleware)
    handled: list[str] = []
    if where == "signal":

        @queue.on(Signal.TASK_SUCCEEDED)
        def exits(event: SignalEvent) -> None:
            handled.append(event.task or "")
            raise SystemExit(6)

    @queue.task(name="iso.victim", retries=0)
    async def victim(fail: bool) -> str:
        await asyncio.sleep(0)
        if fail:
            raise ValueError("failed on purpose")
        return "ok"

    worker = make_worker(queue, concurrency=2)
    async with running(worker):
        first = await victim.enqueue(where == "on_error")
        if where == "before_execute":
            await assert_failed_once(queue, first, "SystemExit", "4")
        elif where == "on_error":
            await assert_failed_once(queue, first, "ValueError", "failed on purpose")
        else:
            assert await first.result(timeout=WAIT) == "ok"
        second = await victim.enqueue(False)
        if where == "before_execute":
            await assert_failed_once(queue, second, "SystemExit", "4")
        else:
            assert await second.result(timeout=WAIT) == "ok"
        await queue.signals.drain()
    if where == "signal":
        assert handled == ["iso.victim", "iso.victim"]
    if where == "before_execute":
        assert middleware.errors_seen == ["SystemExit", "SystemExit"]


# -------------------------------------------------------------------- context
@pytest.mark.parametrize("executor", ["async-before-await", "async-after-await", "thread"])
async def test_a_context_variable_set_by_a_task_is_not_seen_by_the_next(
    make_queue: Callable[..., Queue], executor: str
) -> None:
    queue = make_queue(name="iso")
    if executor == "async-before-await":

        @queue.task(name="iso.ctx")
        async def body(label: str) -> str:
            seen = VAR.get()
            VAR.set(label)
            await asyncio.sleep(0)
            return seen

        task = body
    elif executor == "async-after-await":

        @queue.task(name="iso.ctx")
        async def body_after(label: str) -> str:
            await asyncio.sleep(0)
            seen = VAR.get()
            VAR.set(label)
            return seen

        task = body_after
    else:
        task = queue.task(name="iso.ctx", executor="thread")(odd_tasks.see_and_set)

    @queue.task(name="iso.polluter")
    async def polluter() -> None:
        VAR.set("set by a task before its first await")  # ran inline in the fetch loop
        await asyncio.sleep(0)

    @queue.task(name="iso.async_reader")
    async def async_reader() -> str:
        return VAR.get()

    @queue.task(name="iso.thread_reader")
    def thread_reader() -> str:
        return VAR.get()

    async with running(make_worker(queue, concurrency=1)):
        await (await polluter.enqueue()).result(timeout=WAIT)
        seen = [await (await task.enqueue(f"t{i}")).result(timeout=WAIT) for i in range(30)]
        # Tasks of the other executors do not see it either.
        assert await (await async_reader.enqueue()).result(timeout=WAIT) == "default"
        assert await (await thread_reader.enqueue()).result(timeout=WAIT) == "default"
    assert seen == ["default"] * 30
    assert VAR.get() == "default"  # nor does the process that runs the worker
    await queue.close()


async def test_a_process_task_starts_in_a_fresh_context_of_its_pool_process(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="iso")
    task = queue.task(name="iso.pctx", executor="process")(odd_tasks.see_and_set)
    async with running(make_worker(queue, concurrency=1, process_pool_size=1)):
        seen = [await (await task.enqueue(f"p{i}")).result(timeout=WAIT) for i in range(10)]
    assert seen == ["default"] * 10
    await queue.close()


async def test_tasks_start_from_the_workers_base_context(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="iso")
    base: contextvars.ContextVar[str] = contextvars.ContextVar("iso_base", default="unset")

    @queue.task(name="iso.base_async")
    async def read_async() -> str:
        value = base.get()
        base.set("changed by a task")
        return value

    @queue.task(name="iso.base_thread")
    def read_thread() -> str:
        return base.get()

    token = base.set("set before the worker started")
    try:
        worker = make_worker(queue, concurrency=1)
        async with running(worker):
            for _ in range(3):
                assert await (await read_async.enqueue()).result(timeout=WAIT) == (
                    "set before the worker started"
                )
                assert await (await read_thread.enqueue()).result(timeout=WAIT) == (
                    "set before the worker started"
                )
    finally:
        base.reset(token)
    await queue.close()


class ContextMiddleware(Middleware):
    """Sets the context variable in before_execute; records what the hooks saw."""

    def __init__(self) -> None:
        self.before: list[str] = []
        self.after: list[str] = []

    async def before_execute(self, context: TaskContext) -> None:
        self.before.append(VAR.get())
        VAR.set(f"from middleware {context.id}")

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        self.after.append(VAR.get())


async def test_what_before_execute_sets_reaches_only_its_own_task(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="iso")
    middleware = ContextMiddleware()
    queue.add_middleware(middleware)

    @queue.task(name="iso.mw")
    async def body() -> str:
        seen = VAR.get()
        await asyncio.sleep(0)
        VAR.set("set by the task")
        return seen

    async with running(make_worker(queue, concurrency=1)):
        handles = [await body.enqueue() for _ in range(5)]
        seen = [await h.result(timeout=WAIT) for h in handles]
        await queue.signals.drain()
    assert seen == [f"from middleware {h.id}" for h in handles]
    assert middleware.before == ["default"] * 5
    # After-hooks see the run's context as the task left it.
    assert middleware.after == ["set by the task"] * 5
    await queue.close()


async def test_a_pool_process_that_dies_fails_its_run_and_the_next_calls_get_a_new_pool(
    queue: Queue,
) -> None:
    crash = queue.task(name="iso.crash", executor="process", retries=0)(odd_tasks.exit_process)
    slow = queue.task(name="iso.slow", executor="process", retries=0)(odd_tasks.sleep_then)
    async with running(make_worker(queue, concurrency=2, process_pool_size=1)):
        assert await (await slow.enqueue(0.0, 1)).result(timeout=WAIT) == 1
        failure = await failure_of(await crash.enqueue(9))
        assert failure.error_type == "concurrent.futures.process.BrokenProcessPool"
        # Not stuck with a broken pool: the next process tasks run in a new one.
        for value in (2, 3):
            assert await (await slow.enqueue(0.0, value)).result(timeout=WAIT) == value
