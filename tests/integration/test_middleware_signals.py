"""Middleware and signals against a real Redis, in both modes.

Middleware hooks run in a documented order around enqueues and runs; a before-enqueue hook
can refuse an enqueue (nothing is published); hooks and signal handlers that raise are logged
and never break the worker. Each signal fires once per event with the right data; the CLI
worker's ``--configure`` registers them without a custom entry point.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
import redis
from click.testing import CliRunner

from blitzq import (
    BlitzQError,
    ConfigurationError,
    EnqueueRefused,
    Middleware,
    Queue,
    Retry,
    RetryPolicy,
    Signal,
    SignalEvent,
    TaskContext,
    TaskFailed,
    current_task,
)
from blitzq.cli import cli
from blitzq.middleware import Outgoing, OutgoingWorkflow
from blitzq.options import Option, TaskOptions
from blitzq.task import Task
from blitzq.workflow import chord

from .proc_tasks import eventually, make_worker, running

FAST_RETRY = RetryPolicy(base=0.05, jitter="none")


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode``, closed after the test."""
    q = make_queue(name="mw", mode=mode)
    yield q
    await q.close()


def check_tenant(label: str, value: Any) -> str | None:
    """The ``tenant`` option's check: ``None`` or a non-empty ``str``."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigurationError(f"{label} must be a non-empty str, got {value!r}")
    return value


class Recorder(Middleware):
    """Appends ``(name, hook, detail)`` to a shared log for every hook."""

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name = name
        self.log = log

    async def before_enqueue(self, message: Outgoing) -> None:
        self.log.append((self.name, "before_enqueue", message.envelope.id))

    async def after_enqueue(self, message: Outgoing) -> None:
        self.log.append((self.name, "after_enqueue", message.envelope.id))

    async def before_execute(self, context: TaskContext) -> None:
        self.log.append((self.name, "before_execute", context.id))

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        self.log.append((self.name, "after_execute", (context.id, result)))

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        self.log.append((self.name, "on_error", (context.id, type(exc).__name__)))

    async def on_retry(self, context: TaskContext, exc: BaseException, delay: float) -> None:
        self.log.append((self.name, "on_retry", (context.id, round(delay, 1))))


def hooks_of_task(log: list[tuple[str, str, Any]], task_id: str) -> list[tuple[str, str]]:
    """The (middleware, hook) pairs logged for ``task_id``, in order."""
    out = []
    for name, hook, detail in log:
        ident = detail[0] if isinstance(detail, tuple) else detail
        if ident == task_id:
            out.append((name, hook))
    return out


# ------------------------------------------------------------------ middleware
async def test_middleware_hooks_run_in_order_around_enqueue_and_each_run(queue: Queue) -> None:
    log: list[tuple[str, str, Any]] = []
    queue.add_middleware(Recorder("A", log))
    queue.add_middleware(Recorder("B", log))
    seen_context: list[bool] = []
    attempts: dict[str, int] = {}

    @queue.task(name="mw.ok")
    async def ok(x: int) -> int:
        ctx = current_task()
        seen_context.append(ctx is not None and ("A", "before_execute", ctx.id) in log)
        return x * 2

    @queue.task(name="mw.flaky", retry_policy=FAST_RETRY, retries=1)
    def flaky() -> str:  # a thread task: before_execute runs on the loop first
        ctx = current_task()
        assert ctx is not None
        attempts[ctx.id] = attempts.get(ctx.id, 0) + 1
        if attempts[ctx.id] == 1:
            raise ValueError("first attempt fails")
        return "second time lucky"

    @queue.task(name="mw.broken", retries=0, dead_letter=False)
    async def broken() -> None:
        raise KeyError("always")

    h1 = await ok.enqueue(21)
    h2 = await flaky.enqueue()
    h3 = await broken.enqueue()
    assert hooks_of_task(log, h1.id) == [
        ("A", "before_enqueue"),
        ("B", "before_enqueue"),
        ("B", "after_enqueue"),
        ("A", "after_enqueue"),
    ]
    async with running(make_worker(queue)):
        assert await h1.result(timeout=10) == 42
        assert await h2.result(timeout=10) == "second time lucky"
        with pytest.raises(TaskFailed):
            await h3.result(timeout=10)
        await eventually(
            lambda: asyncio.sleep(0, result=len(hooks_of_task(log, h3.id))), lambda n: n >= 6
        )
    # Before-hooks in registration order, after-hooks (and errors, retries) in reverse.
    enqueue = [("A", "before_enqueue"), ("B", "before_enqueue")]
    enqueue += [("B", "after_enqueue"), ("A", "after_enqueue")]
    assert hooks_of_task(log, h1.id) == [
        *enqueue,
        ("A", "before_execute"),
        ("B", "before_execute"),
        ("B", "after_execute"),
        ("A", "after_execute"),
    ]
    assert ("B", "after_execute", (h1.id, 42)) in log
    assert seen_context == [True]
    assert hooks_of_task(log, h2.id) == [
        *enqueue,
        ("A", "before_execute"),
        ("B", "before_execute"),
        ("B", "on_error"),
        ("A", "on_error"),
        ("B", "on_retry"),
        ("A", "on_retry"),
        ("A", "before_execute"),
        ("B", "before_execute"),
        ("B", "after_execute"),
        ("A", "after_execute"),
    ]
    assert ("A", "on_error", (h2.id, "ValueError")) in log
    assert hooks_of_task(log, h3.id) == [
        *enqueue,
        ("A", "before_execute"),
        ("B", "before_execute"),
        ("B", "on_error"),
        ("A", "on_error"),
    ]


async def test_a_refused_enqueue_publishes_nothing(
    queue: Queue, mode: str, raw_redis: Any, namespace: str
) -> None:
    class Gate(Middleware):
        async def before_enqueue(self, message: Outgoing) -> None:
            if message.envelope.kwargs.get("amount", 0) > 100:
                raise ValueError("amount over the limit")
            if message.envelope.kwargs.get("amount", 0) < 0:
                raise EnqueueRefused("negative amounts are refused")

    queue.add_middleware(Gate())

    @queue.task(name="mw.pay")
    async def pay(amount: int) -> int:
        return amount

    with pytest.raises(EnqueueRefused) as wrapped:
        await pay.enqueue(amount=500)
    message = str(wrapped.value)
    assert "Gate" in message
    assert "mw.pay" in message
    assert "amount over the limit" in message
    assert isinstance(wrapped.value, BlitzQError)
    assert isinstance(wrapped.value.__cause__, ValueError)
    with pytest.raises(EnqueueRefused, match="negative amounts are refused"):
        await pay.enqueue(amount=-1)
    with pytest.raises(EnqueueRefused):  # one refused item refuses the whole batch
        await pay.enqueue_many([((), {"amount": 1}), ((), {"amount": 101})])
    with pytest.raises(EnqueueRefused):
        await pay.options(delay=5).enqueue(amount=1000)
    stats = await queue.stats(["mw"])
    assert stats["queues"]["mw"]["waiting"] == 0
    assert stats["scheduled"] == 0
    kind = "s" if mode == "reliable" else "l"
    assert not await raw_redis.exists("{" + namespace + "}:" + kind + ":mw")
    accepted = await pay.enqueue(amount=5)  # an accepted one goes through
    async with running(make_worker(queue)):
        assert await accepted.result(timeout=10) == 5


async def test_before_enqueue_may_change_the_message(queue: Queue) -> None:
    class Stamp(Middleware):
        async def before_enqueue(self, message: Outgoing) -> None:
            env = message.envelope
            message.envelope = msgspec.structs.replace(
                env, headers={**(env.headers or {}), "tenant": "acme"}
            )

    queue.add_middleware(Stamp())

    @queue.task(name="mw.tenant")
    async def tenant() -> Any:
        ctx = current_task()
        assert ctx is not None
        return (ctx.headers or {}).get("tenant")

    handle = await tenant.enqueue()
    async with running(make_worker(queue)):
        assert await handle.result(timeout=10) == "acme"


async def test_apply_hooks_see_the_first_steps_and_head_their_messages(queue: Queue) -> None:
    """``before_apply`` sees the first steps (every member of a group, not the callback),
    its headers reach those steps' runs only; ``after_apply`` follows the publish; a raising
    ``before_apply`` refuses the start (nothing published)."""
    log: list[tuple[str, Any]] = []

    class Stamp(Middleware):
        async def before_apply(self, workflow: OutgoingWorkflow) -> None:
            log.append(("before", [env.task for env in workflow.steps]))
            if workflow.steps[0].args == [666]:
                raise ValueError("no devils")
            assert all(env.correlation_id == workflow.workflow_id for env in workflow.steps)
            workflow.headers["tenant"] = "acme"

        async def after_apply(self, workflow: OutgoingWorkflow) -> None:
            log.append(("after", workflow.workflow_id))

    queue.add_middleware(Stamp())

    @queue.task(name="mw.wf.tag")
    async def tag(x: int) -> list[Any]:
        ctx = current_task()
        assert ctx is not None
        return [x, (ctx.headers or {}).get("tenant")]

    @queue.task(name="mw.wf.join")
    async def join(results: list[Any]) -> list[Any]:
        ctx = current_task()
        assert ctx is not None
        return [results, (ctx.headers or {}).get("tenant")]

    flow = await queue.apply(chord([tag.s(1), tag.s(2)], join.s()))
    assert log == [("before", ["mw.wf.tag", "mw.wf.tag"]), ("after", flow.id)]
    with pytest.raises(EnqueueRefused, match="no devils"):
        await queue.apply(tag.s(666) | tag.si(1))
    assert log[-1] == ("before", ["mw.wf.tag"])
    stats = await queue.stats(["mw"])
    assert stats["queues"]["mw"]["waiting"] == 2  # the two members; the refused start: nothing
    async with running(make_worker(queue)):
        # The members got the header; the callback, published by a worker, did not.
        assert await flow.get(timeout=30) == [[[1, "acme"], [2, "acme"]], None]


async def test_a_raising_before_execute_fails_the_attempt_without_running_the_task(
    queue: Queue,
) -> None:
    ran: list[int] = []

    class Guard(Middleware):
        async def before_execute(self, context: TaskContext) -> None:
            if context.attempt == 1:
                raise Retry(delay=0.05, reason="not yet")
            if context.task == "mw.never":
                raise PermissionError("not allowed")

    queue.add_middleware(Guard())

    @queue.task(name="mw.later")
    async def later() -> str:
        ran.append(1)
        return "ran on attempt 2"

    @queue.task(name="mw.never", retries=1, retry_policy=FAST_RETRY, dead_letter=False)
    def never() -> None:
        ran.append(2)

    h1 = await later.enqueue()
    h2 = await never.enqueue()
    async with running(make_worker(queue)):
        assert await h1.result(timeout=10) == "ran on attempt 2"
        with pytest.raises(TaskFailed) as failed:
            await h2.result(timeout=10)
    assert failed.value.error_type == "PermissionError"
    assert ran == [1]
    record = await h1.status()
    assert record is not None
    assert record.attempts == 2


async def test_raising_after_hooks_are_logged_and_the_worker_goes_on(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Middleware):
        async def after_enqueue(self, message: Outgoing) -> None:
            raise RuntimeError("after_enqueue broke")

        async def after_execute(self, context: TaskContext, result: Any) -> None:
            raise RuntimeError("after_execute broke")

        async def on_error(self, context: TaskContext, exc: BaseException) -> None:
            raise RuntimeError("on_error broke")

    queue.add_middleware(Broken())

    @queue.task(name="mw.square")
    async def square(x: int) -> int:
        return x * x

    @queue.task(name="mw.fail", retries=0, dead_letter=False)
    def fail() -> None:
        raise ValueError("task failed")

    caplog.set_level(logging.ERROR, logger="blitzq.middleware")
    handles = [await square.enqueue(n) for n in range(5)]  # enqueue succeeds regardless
    failing = await fail.enqueue()
    async with running(make_worker(queue)) as worker:
        assert [await h.result(timeout=10) for h in handles] == [0, 1, 4, 9, 16]
        with pytest.raises(TaskFailed, match="task failed"):
            await failing.result(timeout=10)
        more = await square.enqueue(7)
        assert await more.result(timeout=10) == 49
        assert not worker.stopping
        await eventually(
            lambda: asyncio.sleep(0, result=caplog.text), lambda t: "on_error broke" in t
        )
    assert "Broken.after_enqueue failed" in caplog.text
    assert "Broken.after_execute failed" in caplog.text
    assert "Broken.on_error failed" in caplog.text


async def test_without_middleware_or_handlers_runs_skip_the_hooks(queue: Queue) -> None:
    @queue.task(name="mw.plain")
    async def plain() -> int:
        return 1

    handle = await plain.enqueue()
    assert queue.enqueue_filters == []
    assert queue.enqueue_observers == []
    async with running(make_worker(queue)) as worker:
        assert await handle.result(timeout=10) == 1
        assert worker.runner.extensions.enabled is False


class Tenant(Middleware):
    """A user middleware declaring a per-task option, as docs/architecture.md's worked
    example does: ``@queue.task(tenant="acme")``, seen at run time."""

    task_options: ClassVar[Mapping[str, Option]] = {"tenant": Option(None, check_tenant)}

    def __init__(self) -> None:
        self.tenants: dict[str, str | None] = {}
        self.runs: list[tuple[str, str | None]] = []

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        self.tenants[task.name] = options.get("tenant")

    async def before_execute(self, context: TaskContext) -> None:
        self.runs.append((context.task, self.tenants.get(context.task)))


async def test_a_user_middleware_declares_a_task_option_seen_on_a_real_worker(
    queue: Queue,
) -> None:
    tenant = Tenant()
    queue.add_middleware(tenant)  # before the tasks that use its option

    @queue.task(name="mw.tenant", tenant="acme")
    async def billed(x: int) -> int:
        return x + 1

    @queue.task(name="mw.no-tenant")
    async def free() -> int:
        return 0

    assert billed.controls.get("tenant") == "acme"
    with pytest.raises(ConfigurationError, match="tenant must be a non-empty str"):
        queue.task(name="mw.bad-tenant", tenant="")(lambda: None)
    async with running(make_worker(queue)):
        assert await (await billed.enqueue(1)).result(timeout=10) == 2
        assert await (await free.enqueue()).result(timeout=10) == 0
    assert tenant.runs == [("mw.tenant", "acme"), ("mw.no-tenant", None)]


def check_region(label: str, value: Any) -> Any:
    if value is not None and value not in ("eu", "us"):
        raise ConfigurationError(f"{label} must be 'eu' or 'us', got {value!r}")
    return value


class Region(Middleware):
    """A user middleware declaring a per-call option, as docs/architecture.md's worked
    example does: ``task.options(region="eu")``, read back at run time from the message's
    ``options`` field (``context.options``)."""

    call_options: ClassVar[Mapping[str, Option]] = {"region": Option(None, check_region)}

    def __init__(self) -> None:
        self.runs: list[tuple[str, Any]] = []

    async def before_execute(self, context: TaskContext) -> None:
        self.runs.append((context.id, (context.options or {}).get("region")))


async def test_a_user_middleware_declares_a_call_option_seen_on_a_real_worker(
    queue: Queue,
) -> None:
    region = Region()
    queue.add_middleware(region)

    @queue.task(name="mw.region")
    async def placed(x: int) -> int:
        return x + 1

    with pytest.raises(ConfigurationError, match="region must be 'eu' or 'us'"):
        placed.options(region="mars")
    async with running(make_worker(queue)):
        eu = await placed.options(region="eu").enqueue(1)
        plain = await placed.enqueue(2)
        [us] = await placed.enqueue_many([((3,), {}, {"region": "us"})])
        named = await queue.send("mw.region", (4,), region="eu")
        for handle in (eu, plain, us, named):
            await handle.result(timeout=10)
    assert sorted(region.runs) == sorted(
        [(eu.id, "eu"), (plain.id, None), (us.id, "us"), (named.id, "eu")]
    )


class Lifecycle(Middleware):
    """Records the worker-lifecycle hooks, and what the Queue's lifespan gave before."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def on_worker_start(self, worker: Any) -> None:
        self.log.append(f"{self.name} start {worker.id}")

    async def on_worker_stop(self, worker: Any) -> None:
        self.log.append(f"{self.name} stop {worker.id}")


async def test_worker_lifecycle_hooks_run_around_the_queues_sugar_in_order(queue: Queue) -> None:
    """``on_worker_start`` runs after ``@queue.on_startup`` and ``@queue.lifespan``, in
    registration order; ``on_worker_stop`` before ``on_shutdown``, in reverse order."""
    log: list[str] = []
    queue.add_middleware(Lifecycle("a", log))
    queue.add_middleware(Lifecycle("b", log))

    @queue.on_startup
    async def started() -> None:
        log.append("on_startup")

    @queue.on_shutdown
    async def stopped() -> None:
        log.append("on_shutdown")

    @queue.lifespan
    async def resource() -> Any:
        log.append("lifespan enter")
        yield 1
        log.append("lifespan exit")

    worker = make_worker(queue)
    async with running(worker):
        await eventually(lambda: asyncio.sleep(0, log), lambda seen: len(seen) == 4)
    w = worker.id
    assert log == [
        "on_startup",
        "lifespan enter",
        f"a start {w}",
        f"b start {w}",
        f"b stop {w}",
        f"a stop {w}",
        "on_shutdown",
        "lifespan exit",
    ]


class FailsToStart(Middleware):
    async def on_worker_start(self, worker: Any) -> None:
        raise RuntimeError("no database")


async def test_a_failing_on_worker_start_fails_the_start(queue: Queue) -> None:
    queue.add_middleware(FailsToStart())
    with pytest.raises(RuntimeError, match="no database"):
        await asyncio.wait_for(make_worker(queue).run(), 30)


# --------------------------------------------------------------------- signals
async def test_each_signal_fires_once_with_the_right_data(queue: Queue) -> None:
    events: list[SignalEvent] = []
    for signal in Signal:
        if signal.value.startswith("task_") or signal.value.startswith("worker_"):
            if signal is Signal.TASK_FAILED:
                continue  # registered below as a coroutine handler

            queue.on(signal)(events.append)

    @queue.on(Signal.TASK_FAILED)
    async def failed(event: SignalEvent) -> None:
        await asyncio.sleep(0)
        events.append(event)

    flaky_runs: list[int] = []

    @queue.task(name="sig.ok")
    async def ok(x: int) -> int:
        return x + 1

    @queue.task(name="sig.flaky", retries=2, retry_policy=FAST_RETRY)
    async def flaky() -> str:
        flaky_runs.append(1)
        if len(flaky_runs) == 1:
            raise ValueError("flaky")
        return "ok"

    @queue.task(name="sig.dead", retries=0)
    def dead() -> None:
        raise RuntimeError("dead")

    @queue.task(name="sig.failed", retries=0, dead_letter=False)
    async def failed_task() -> None:
        raise KeyError("gone")

    @queue.task(name="sig.cancelled")
    async def cancelled() -> None:
        raise AssertionError("a cancelled task must not run")

    h_ok = await ok.enqueue(1)
    h_flaky = await flaky.enqueue()
    h_dead = await dead.enqueue()
    h_failed = await failed_task.enqueue()
    h_cancel = await cancelled.enqueue()
    await h_cancel.cancel()
    enqueued = [e for e in events if e.signal is Signal.TASK_ENQUEUED]
    assert [e.task_id for e in enqueued] == [
        h_ok.id,
        h_flaky.id,
        h_dead.id,
        h_failed.id,
        h_cancel.id,
    ]
    assert enqueued[0].task == "sig.ok"
    assert enqueued[0].queue == "mw"
    assert enqueued[0].attempt == 1
    async with running(make_worker(queue)) as worker:
        assert await h_ok.result(timeout=10) == 2
        assert await h_flaky.result(timeout=10) == "ok"
        for handle in (h_dead, h_failed, h_cancel):
            with pytest.raises(TaskFailed):
                await handle.result(timeout=10)
        await eventually(
            lambda: asyncio.sleep(0, result=[e.signal for e in events]),
            lambda s: Signal.TASK_CANCELLED in s and s.count(Signal.TASK_FAILED) == 2,
        )
    worker_id = worker.id

    def of(signal: Signal, task_id: str | None = None) -> list[SignalEvent]:
        return [
            e for e in events if e.signal is signal and (task_id is None or e.task_id == task_id)
        ]

    # Worker signals: once each, started first and stopped last.
    assert len(of(Signal.WORKER_STARTED)) == 1
    assert len(of(Signal.WORKER_STOPPED)) == 1
    assert events.index(of(Signal.WORKER_STARTED)[0]) < events.index(of(Signal.TASK_STARTED)[0])
    assert events[-1].signal is Signal.WORKER_STOPPED
    assert events[-1].worker == worker_id
    # Success.
    (started,) = of(Signal.TASK_STARTED, h_ok.id)
    (succeeded,) = of(Signal.TASK_SUCCEEDED, h_ok.id)
    assert (succeeded.task, succeeded.queue, succeeded.attempt) == ("sig.ok", "mw", 1)
    assert succeeded.result == 2
    assert succeeded.error is None
    assert succeeded.worker == worker_id
    assert events.index(started) < events.index(succeeded)
    # A retry, then success on attempt 2.
    (retried,) = of(Signal.TASK_RETRIED, h_flaky.id)
    assert retried.attempt == 1
    assert isinstance(retried.error, ValueError)
    assert retried.error_type == "ValueError"
    assert retried.error_message == "flaky"
    assert retried.delay is not None
    assert 0 <= retried.delay <= 0.1
    assert len(of(Signal.TASK_STARTED, h_flaky.id)) == 2
    (flaky_ok,) = of(Signal.TASK_SUCCEEDED, h_flaky.id)
    assert flaky_ok.attempt == 2
    assert of(Signal.TASK_FAILED, h_flaky.id) == []
    # Dead-lettered: TASK_FAILED then TASK_DEAD_LETTERED, once each.
    (dead_failed,) = of(Signal.TASK_FAILED, h_dead.id)
    (dead_lettered,) = of(Signal.TASK_DEAD_LETTERED, h_dead.id)
    assert isinstance(dead_lettered.error, RuntimeError)
    assert dead_lettered.error_message == "dead"
    assert events.index(dead_failed) < events.index(dead_lettered)
    # Failed without a dead letter.
    (plain_failed,) = of(Signal.TASK_FAILED, h_failed.id)
    assert plain_failed.error_type == "KeyError"
    assert of(Signal.TASK_DEAD_LETTERED, h_failed.id) == []
    # Cancelled before it ran: skipped by the worker, never started.
    (cancel_event,) = of(Signal.TASK_CANCELLED, h_cancel.id)
    assert cancel_event.task == "sig.cancelled"
    assert of(Signal.TASK_STARTED, h_cancel.id) == []
    # Nothing else fired for the tasks.
    for handle in (h_ok, h_flaky, h_dead, h_failed, h_cancel):
        per_task = [e.signal for e in events if e.task_id == handle.id]
        assert per_task.count(Signal.TASK_ENQUEUED) == 1
        assert (
            per_task.count(Signal.TASK_SUCCEEDED)
            + per_task.count(Signal.TASK_FAILED)
            + per_task.count(Signal.TASK_CANCELLED)
            == 1
        )


async def test_a_running_task_cancelled_emits_task_cancelled_and_on_error(queue: Queue) -> None:
    events: list[SignalEvent] = []
    errors: list[str] = []
    queue.on(Signal.TASK_CANCELLED)(events.append)

    class Watch(Middleware):
        async def on_error(self, context: TaskContext, exc: BaseException) -> None:
            errors.append(type(exc).__name__)

    queue.add_middleware(Watch())
    started = asyncio.Event()

    @queue.task(name="sig.long")
    async def long() -> None:
        started.set()
        await asyncio.sleep(30)

    handle = await long.enqueue()
    async with running(make_worker(queue)):
        await asyncio.wait_for(started.wait(), 10)
        await handle.cancel()
        await eventually(lambda: asyncio.sleep(0, result=len(events)), lambda n: n == 1)
    assert events[0].task_id == handle.id
    assert errors == ["TaskCancelled"]


async def test_a_raising_signal_handler_is_logged_and_the_worker_goes_on(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    @queue.on(Signal.TASK_SUCCEEDED)
    def sync_boom(event: SignalEvent) -> None:
        calls.append("sync")
        raise RuntimeError("sync handler broke")

    @queue.on(Signal.TASK_SUCCEEDED)
    async def async_boom(event: SignalEvent) -> None:
        calls.append("async")
        raise RuntimeError("async handler broke")

    @queue.on(Signal.TASK_ENQUEUED)
    def enqueue_boom(event: SignalEvent) -> None:
        raise RuntimeError("enqueue handler broke")

    @queue.task(name="sig.add")
    async def add(a: int, b: int) -> int:
        return a + b

    caplog.set_level(logging.ERROR, logger="blitzq.signals")
    handles = [await add.enqueue(n, n) for n in range(4)]
    async with running(make_worker(queue)) as worker:
        assert [await h.result(timeout=10) for h in handles] == [0, 2, 4, 6]
        assert not worker.stopping
        await eventually(lambda: asyncio.sleep(0, result=len(calls)), lambda n: n == 8)
    assert calls.count("sync") == 4
    assert calls.count("async") == 4
    assert "sync_boom" in caplog.text
    assert "async_boom" in caplog.text
    assert "enqueue_boom" in caplog.text


async def test_features_emit_their_own_signals_through_the_public_method(queue: Queue) -> None:
    got: list[SignalEvent] = []
    queue.on(Signal.TASK_EXPIRED)(got.append)
    assert queue.signals.has(Signal.TASK_EXPIRED)
    assert not queue.signals.has(Signal.WORKFLOW_STEP_DONE)
    event = SignalEvent(Signal.TASK_EXPIRED, "t1", "some.task", "mw", 1, extra={"age": 61.0})
    await queue.signals.emit(Signal.TASK_EXPIRED, event)
    queue.signals.emit_soon(Signal.TASK_EXPIRED, event)
    await queue.signals.drain()
    assert got == [event, event]
    assert queue.signals.disconnect(Signal.TASK_EXPIRED, got.append) is True
    with pytest.raises(ValueError):
        queue.on("no_such_signal")


# ------------------------------------------------------------------ --configure
APP = """
import os
from blitzq import Queue

queue = Queue(name="cfg")

@queue.task(name="cfg.double")
async def double(x):
    return 2 * x
"""

CONFIGURE = """
import os
import redis
from blitzq import Middleware, Signal

client = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])


class Tag(Middleware):
    async def before_execute(self, context):
        client.rpush(os.environ["TEST_KEY"] + ":before", context.id)


def setup(queue):
    queue.add_middleware(Tag())

    @queue.on(Signal.TASK_SUCCEEDED)
    def done(event):
        client.rpush(os.environ["TEST_KEY"] + ":done", f"{event.task_id}={event.result}")

    @queue.on(Signal.WORKER_STARTED)
    def started(event):
        client.rpush(os.environ["TEST_KEY"] + ":workers", event.worker)
"""


def _blitzq_command() -> list[str]:
    script = Path(sys.executable).with_name("blitzq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}


@pytest.mark.parametrize("workers", [1, 2])
def test_configure_registers_middleware_and_signals_in_a_cli_worker(
    tmp_path: Path, redis_url: str, namespace: str, make_queue: Callable[..., Queue], workers: int
) -> None:
    (tmp_path / "cfg_app.py").write_text(APP)
    (tmp_path / "cfg_setup.py").write_text(CONFIGURE)
    key = "{" + namespace + "}:cfg-test"
    env = _clean_env() | {"TEST_REDIS_URL": redis_url, "TEST_KEY": key}
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [
            *_blitzq_command(),
            "worker",
            "cfg_app:queue",
            "--configure",
            "cfg_setup:setup",
            "--workers",
            str(workers),
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "--shutdown-timeout",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = redis.Redis.from_url(redis_url)
    producer = make_queue(name="cfg")
    try:
        handles = [producer.send_sync("cfg.double", [n]) for n in range(4)]
        assert [h.result_sync(timeout=30) for h in handles] == [0, 2, 4, 6]
        deadline = time.monotonic() + 10
        while client.llen(key + ":done") < 4 or client.llen(key + ":workers") < workers:
            assert time.monotonic() < deadline, "the configured handlers did not all run"
            time.sleep(0.05)
        done = sorted(v.decode() for v in client.lrange(key + ":done", 0, -1))
        assert done == sorted(f"{h.id}={2 * n}" for n, h in enumerate(handles))
        before = {v.decode() for v in client.lrange(key + ":before", 0, -1)}
        assert before == {h.id for h in handles}
        assert len(set(client.lrange(key + ":workers", 0, -1))) == workers
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            if proc.stderr is not None:
                proc.stderr.close()
        client.close()
        producer.close_sync()
    assert proc.returncode == 0


def test_configure_with_a_bad_spec_exits_78_with_a_message(
    tmp_path: Path, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cfg_app2.py").write_text(APP)
    (tmp_path / "cfg_bad.py").write_text("def setup(queue):\n    raise RuntimeError('nope')\n")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    base = ["--redis-url", redis_url, "--namespace", namespace, "worker", "cfg_app2:queue"]
    base.append("--no-supervise")  # the message is this process's (a configuration error)
    for spec, expected in [
        ("cfg_bad:setup", "--configure cfg_bad:setup failed: RuntimeError: nope"),
        ("cfg_bad:missing", "has no attribute 'missing'"),
        ("no_colon", "expects MODULE:CALLABLE"),
    ]:
        result = runner.invoke(cli, [*base, "--configure", spec], env=_clean_env())
        assert result.exit_code == 78, result.output
        assert expected in result.output


async def test_batch_hooks_see_each_batch_once_and_the_enqueue_lists_run_after_them(
    queue: Queue,
) -> None:
    # One mechanism: a middleware's batch hooks, and the Queue's enqueue_filters /
    # enqueue_observers lists run by the built-in EnqueueLists after the registered ones.
    seen: list[tuple[str, list[str]]] = []

    class Batches(Middleware):
        async def before_enqueue(self, message: Outgoing) -> None:
            seen.append(("before_enqueue", [message.envelope.args[0]]))

        async def before_publish(self, queue: Any, batch: list[Outgoing]) -> None:
            seen.append(("before_publish", [o.envelope.args[0] for o in batch]))
            for o in batch:
                if o.envelope.args[0] == "dup":
                    o.existing_id = "the-original"  # a duplicate: not published

        async def after_publish(self, queue: Any, batch: list[Outgoing]) -> None:
            seen.append(("after_publish", [o.envelope.args[0] for o in batch]))

    async def list_filter(queue: Any, batch: list[Outgoing]) -> None:
        seen.append(("enqueue_filters", [o.envelope.args[0] for o in batch]))

    async def list_observer(queue: Any, batch: list[Outgoing]) -> None:
        seen.append(("enqueue_observers", [o.envelope.args[0] for o in batch]))

    queue.enqueue_filters.append(list_filter)
    queue.enqueue_observers.append(list_observer)
    queue.add_middleware(Batches())

    @queue.task(name="mw.batched")
    async def batched(word: str) -> str:
        return word

    handles = await batched.enqueue_many([("a",), ("dup",)])
    assert [h.id for h in handles][1] == "the-original"
    assert seen == [
        ("before_enqueue", ["a"]),
        ("before_enqueue", ["dup"]),
        ("before_publish", ["a", "dup"]),
        ("enqueue_filters", ["a", "dup"]),
        ("after_publish", ["a"]),
        ("enqueue_observers", ["a"]),
    ]
    stats = await queue.broker.queue_stats(["mw"])
    assert stats["mw"]["waiting"] == 1  # "a" only


async def test_a_batch_hook_refuses_the_whole_batch(queue: Queue) -> None:
    class NoBatches(Middleware):
        async def before_publish(self, queue: Any, batch: list[Outgoing]) -> None:
            if len(batch) > 1:
                raise EnqueueRefused("one at a time")

    queue.add_middleware(NoBatches())

    @queue.task(name="mw.single")
    async def single(n: int) -> int:
        return n

    with pytest.raises(EnqueueRefused, match="one at a time"):
        await single.enqueue_many([(1,), (2,)])
    stats = await queue.broker.queue_stats(["mw"])
    assert stats["mw"]["waiting"] == 0
    await single.enqueue(3)  # a batch of one passes
    stats = await queue.broker.queue_stats(["mw"])
    assert stats["mw"]["waiting"] == 1
