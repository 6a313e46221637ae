"""Signals are part of the middleware chain, against a real Redis in both modes.

A middleware observes every signal through its ``on_signal`` hook, with the very event the
``queue.on`` handlers get (the middleware first), limited to the signals it names in
``observes``; ``queue.on`` is sugar over the built-in ``SignalHandlers`` middleware. A hook
that raises is logged and changes nothing; a middleware without the hook costs no signal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any, ClassVar

import pytest

from blitzq import Middleware, Queue, RetryPolicy, Signal, SignalEvent, TaskFailed
from blitzq.extensions.registry import extensions_of
from blitzq.extensions.signals import SignalHandlers

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = RetryPolicy(base=0.05, jitter="none")


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue in ``mode``, closed after the test."""
    q = make_queue(name="sigmw", mode=mode)
    yield q
    await q.close()


class Observer(Middleware):
    """Appends ``(name, event)`` to a shared log for each signal it observes."""

    def __init__(self, name: str, log: list[tuple[str, SignalEvent]]) -> None:
        self.name = name
        self.log = log

    async def on_signal(self, event: SignalEvent) -> None:
        self.log.append((self.name, event))


class FailuresOnly(Observer):
    """Observes ``TASK_FAILED`` alone, with a plain ``def``."""

    observes: ClassVar[Collection[Signal] | None] = frozenset({Signal.TASK_FAILED})

    def on_signal(self, event: SignalEvent) -> None:  # type: ignore[override]
        self.log.append((self.name, event))


async def test_a_middleware_sees_every_signal_with_the_handlers_event_first(queue: Queue) -> None:
    log: list[tuple[str, SignalEvent]] = []
    queue.add_middleware(Observer("mw", log))
    for sig in (Signal.TASK_ENQUEUED, Signal.TASK_STARTED, Signal.TASK_RETRIED):
        queue.on(sig)(lambda event: log.append(("handler", event)))
    for sig in (Signal.TASK_SUCCEEDED, Signal.TASK_FAILED, Signal.WORKER_STOPPED):

        @queue.on(sig)
        async def handler(event: SignalEvent) -> None:
            log.append(("handler", event))

    runs: list[int] = []

    @queue.task(name="sigmw.flaky", retries=1, retry_policy=FAST_RETRY)
    async def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("once")
        return "ok"

    @queue.task(name="sigmw.bad", retries=0, dead_letter=False)
    async def bad() -> None:
        raise KeyError("gone")

    h_flaky, h_bad = await flaky.enqueue(), await bad.enqueue()
    async with running(make_worker(queue)) as worker:
        assert await h_flaky.result(timeout=10) == "ok"
        with pytest.raises(TaskFailed):
            await h_bad.result(timeout=10)
        await eventually(
            lambda: asyncio.sleep(0, result=[e.signal for _, e in log]),
            lambda s: Signal.TASK_SUCCEEDED in s and Signal.TASK_FAILED in s,
        )
    await eventually(
        lambda: asyncio.sleep(0, result=[e.signal for _, e in log]),
        lambda s: s.count(Signal.WORKER_STOPPED) == 2,
    )
    mine = [e for who, e in log if who == "mw"]
    seen = {e.signal for e in mine}
    # Every signal of this scenario reaches the middleware, those without a handler too.
    assert {
        Signal.TASK_ENQUEUED,
        Signal.TASK_RECEIVED,
        Signal.TASK_STARTED,
        Signal.TASK_RETRIED,
        Signal.TASK_SUCCEEDED,
        Signal.TASK_FAILED,
        Signal.WORKER_STARTING,
        Signal.WORKER_STARTED,
        Signal.WORKER_STOPPING,
        Signal.WORKER_STOPPED,
    } <= seen
    for who, event in log:
        if who == "handler":  # the same event object, the middleware's hook before it
            first = next(i for i, (_, e) in enumerate(log) if e is event)
            assert log[first] == ("mw", event)
    retried = next(e for e in mine if e.signal is Signal.TASK_RETRIED)
    assert (retried.task_id, retried.worker, retried.attempt) == (h_flaky.id, worker.id, 1)
    assert retried.error_type == "ValueError"
    assert retried.delay is not None
    failed = next(e for e in mine if e.signal is Signal.TASK_FAILED)
    assert (failed.task_id, failed.error_type, failed.queue) == (h_bad.id, "KeyError", "sigmw")


async def test_observes_limits_the_signals_and_the_sugar_is_a_builtin_middleware(
    queue: Queue,
) -> None:
    extensions = extensions_of(queue)
    assert not queue.signals
    queue.add_middleware(Middleware())  # no on_signal: observes nothing
    assert not queue.signals
    assert extensions.enabled is False
    log: list[tuple[str, SignalEvent]] = []
    queue.add_middleware(FailuresOnly("failures", log))
    assert queue.signals.has(Signal.TASK_FAILED)
    assert not queue.signals.has(Signal.TASK_SUCCEEDED)
    assert extensions.enabled is True

    handlers = [m for m in extensions.builtin if isinstance(m, SignalHandlers)]
    assert handlers == [queue.signals.handlers]
    succeeded: list[SignalEvent] = []
    queue.on(Signal.TASK_SUCCEEDED)(succeeded.append)
    assert handlers[0].signal_handlers(Signal.TASK_SUCCEEDED) == (succeeded.append,)
    assert queue.signals.has(Signal.TASK_SUCCEEDED)

    @queue.task(name="sigmw.ok")
    async def ok() -> int:
        return 1

    @queue.task(name="sigmw.no", retries=0, dead_letter=False)
    async def no() -> None:
        raise RuntimeError("no")

    h_ok, h_no = await ok.enqueue(), await no.enqueue()
    async with running(make_worker(queue)):
        assert await h_ok.result(timeout=10) == 1
        with pytest.raises(TaskFailed):
            await h_no.result(timeout=10)
        await eventually(
            lambda: asyncio.sleep(0, result=(len(log), len(succeeded))), lambda n: n == (1, 1)
        )
    assert [(who, e.signal, e.task_id) for who, e in log] == [
        ("failures", Signal.TASK_FAILED, h_no.id)
    ]
    assert [e.task_id for e in succeeded] == [h_ok.id]
    assert queue.signals.disconnect(Signal.TASK_SUCCEEDED, succeeded.append) is True
    assert not queue.signals.has(Signal.TASK_SUCCEEDED)


class Broken(Middleware):
    """An ``on_signal`` that raises, for every signal."""

    def __init__(self) -> None:
        self.calls = 0

    def on_signal(self, event: SignalEvent) -> None:  # type: ignore[override]
        self.calls += 1
        raise RuntimeError(f"broken on {event.signal.value}")


async def test_a_raising_on_signal_is_logged_and_the_worker_goes_on(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    queue.add_middleware(broken)
    after: list[SignalEvent] = []
    queue.on(Signal.TASK_SUCCEEDED)(after.append)

    @queue.task(name="sigmw.add")
    async def add(a: int, b: int) -> int:
        return a + b

    caplog.set_level(logging.ERROR, logger="blitzq.signals")
    handles = [await add.enqueue(n, n) for n in range(3)]
    async with running(make_worker(queue)) as worker:
        assert [await h.result(timeout=10) for h in handles] == [0, 2, 4]
        assert not worker.stopping
        await eventually(lambda: asyncio.sleep(0, result=len(after)), lambda n: n == 3)
    assert broken.calls >= 3 * 4  # enqueued, received, started, succeeded per task
    assert "Broken.on_signal" in caplog.text
