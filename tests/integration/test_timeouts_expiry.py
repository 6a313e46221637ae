"""Soft and hard timeouts and max_age expiry against a real Redis, in both modes.

A soft timeout raises SoftTimeoutError inside a thread task (which may catch it) and fails
an async task's attempt with it; the retry policy applies. A hard timeout of an async task is
final even when the body catches its cancellation (one that runs on is abandoned, keeping its
slot). A hard timeout terminates a
process task, and its slot is only freed once the process is gone. A task that waited longer
than its max_age is expired (state ``expired``, dead letter reason ``"expired"``) without
running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blitzq import (
    ConfigurationError,
    Queue,
    RetryPolicy,
    SoftTimeoutError,
    TaskExpired,
    TaskFailed,
    TaskState,
)
from blitzq.worker import timeouts

from ..procfs import pid_gone
from . import proc_tasks
from .proc_tasks import eventually, make_worker, running

FAST_RETRY = RetryPolicy(max_retries=1, base=0.01)


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``tq`` in ``mode``, closed after the test."""
    q = make_queue(name="tq", mode=mode)
    yield q
    await q.close()


async def test_soft_timeout_raises_inside_a_thread_task_and_retries(queue: Queue) -> None:
    seen: list[int] = []

    @queue.task(name="t.soft_thread", soft_timeout=0.2, retry_policy=FAST_RETRY)
    def slow_sync() -> str:
        try:
            for _ in range(200):  # pure-Python waiting: the error arrives within ~10 ms
                time.sleep(0.01)
        except SoftTimeoutError:
            seen.append(1)  # cleanup would go here
            raise
        return "finished"

    handle = await slow_sync.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=15)
    assert failed.value.error_type == "blitzq.exceptions.SoftTimeoutError"
    assert seen == [1, 1]  # both attempts saw it: the retry policy applied
    record = await handle.status()
    assert record is not None
    assert record.attempts == 2


async def test_an_async_task_blocking_past_its_hard_timeout_is_named_in_a_warning(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """A blocking call inside ``async def`` never yields to the event loop, so its hard
    timeout cannot cancel it: its outcome stands, and a WARNING names the overrun and the
    remedy (tester finding: nothing said it had run past its timeout)."""

    @queue.task(name="t.blocks", timeout=0.2)
    async def blocks() -> str:
        time.sleep(0.6)  # blocks the loop: the timer is due, and cannot run
        return "done"

    @queue.task(name="t.blocks_later", timeout=0.2)
    async def blocks_later() -> str:
        await asyncio.sleep(0)  # a first step, then the blocking call
        time.sleep(0.6)
        return "later"

    @queue.task(name="t.yields", timeout=5)
    async def yields() -> str:
        await asyncio.sleep(0.01)
        return "ok"

    handle = await blocks.enqueue()
    later = await blocks_later.enqueue()
    quick = await yields.enqueue()
    with caplog.at_level(logging.WARNING, logger="blitzq.worker"):
        async with running(make_worker(queue, concurrency=1)):
            assert await handle.result(timeout=15) == "done"
            assert await later.result(timeout=15) == "later"
            assert await quick.result(timeout=15) == "ok"
    overran = [r.getMessage() for r in caplog.records if "past its hard timeout" in r.getMessage()]
    assert len(overran) == 2, overran
    assert {handle.id, later.id} == {m.split()[2] for m in overran}
    assert all("thread task" in m for m in overran)


async def test_a_thread_task_that_catches_the_soft_timeout_may_still_succeed(
    queue: Queue,
) -> None:
    @queue.task(name="t.soft_catch", soft_timeout=0.1)
    def partial() -> str:
        done = 0
        try:
            for _ in range(500):
                time.sleep(0.01)
                done += 1
        except SoftTimeoutError:
            return f"partial after {done}"
        return "all"

    handle = await partial.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        result = await handle.result(timeout=10)
    assert result.startswith("partial after")


async def test_soft_timeout_of_an_async_task_fails_the_attempt(queue: Queue) -> None:
    cancelled: list[int] = []

    @queue.task(name="t.soft_async", soft_timeout=0.1, retries=0)
    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise

    handle = await slow.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=10)
    assert failed.value.error_type == "blitzq.exceptions.SoftTimeoutError"
    assert cancelled == [1]


async def test_an_async_task_that_catches_its_hard_timeout_is_recorded_as_a_timeout(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Tester's input: ``timeout=1`` and a body whose bare ``except`` caught the cancellation,
    slept on and returned: it was recorded ``succeeded`` with its value. A hard timeout is
    final: the run is a TaskTimeout whatever it did after its cancellation (with a WARNING
    saying so); one that raised instead is a TaskTimeout too."""
    caught: list[str] = []

    @queue.task(name="t.hard_caught", timeout=0.2, retries=0)
    async def stubborn(raise_after: bool) -> str:
        try:
            await asyncio.sleep(30)
        except BaseException:  # the user code under test swallows it
            caught.append("raised" if raise_after else "returned")
            await asyncio.sleep(0.05)
            if raise_after:
                raise ValueError("cleaned up badly") from None
        return "finished anyway"

    handles = [await stubborn.enqueue(False), await stubborn.enqueue(True)]
    with caplog.at_level(logging.WARNING, logger="blitzq.worker"):
        async with running(make_worker(queue, concurrency=2)):
            for h in handles:
                with pytest.raises(TaskFailed) as failed:
                    await h.result(timeout=10)
                assert failed.value.error_type == "blitzq.exceptions.TaskTimeout"
    assert sorted(caught) == ["raised", "returned"]
    warned = [r.getMessage() for r in caplog.records if "caught the cancellation" in r.message]
    assert any("returned" in m for m in warned), warned
    assert any("raised ValueError" in m for m in warned), warned


async def test_an_async_task_that_ignores_its_cancellation_is_abandoned(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that goes on after its hard timeout's cancellation (here until the test lets
    it) has its TaskTimeout recorded CANCEL_GRACE later, while it still runs, and is counted
    as an abandoned run that keeps its slot (the concurrency bound counts it) until its
    coroutine returns."""
    monkeypatch.setattr(timeouts, "CANCEL_GRACE", 0.2)
    let_go, gone = asyncio.Event(), asyncio.Event()

    @queue.task(name="t.hard_ignored", timeout=0.2, retries=0)
    async def deaf() -> str:
        try:
            await asyncio.sleep(30)
        except BaseException:  # the user code under test swallows it
            while not let_go.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await let_go.wait()
        gone.set()
        return "late"

    @queue.task(name="t.after_deaf")
    async def after() -> int:
        return 1

    handle = await deaf.enqueue()
    worker = make_worker(queue, concurrency=2)  # 1: its one slot held, the worker restarts
    async with running(worker):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=10)
        assert failed.value.error_type == "blitzq.exceptions.TaskTimeout"
        assert not gone.is_set()
        assert worker.abandoned_threads == 1
        assert worker._global.in_use == 1  # its slot is still taken
        assert await (await after.enqueue()).result(timeout=10) == 1  # in the other slot
        let_go.set()
        await asyncio.wait_for(gone.wait(), 10)
        await eventually(
            lambda: asyncio.sleep(0, (worker.abandoned_threads, worker._global.in_use)),
            lambda seen: seen == (0, 0),
            timeout=10,
        )
        assert worker.abandoned_threads_total == 1
        assert not worker.restart_requested
    record = await handle.status()
    assert record is not None
    assert record.error_type == "blitzq.exceptions.TaskTimeout"


async def test_hard_timeout_kills_a_process_task_before_its_slot_is_reused(
    queue: Queue, tmp_path: Path
) -> None:
    # 3 s: long enough for a busy machine to hand the call to the (warm) pool process and
    # let it write its pid, far shorter than the 30 s the call would sleep.
    killed = queue.task(name="t.proc_sleep", executor="process", hard_timeout=3.0, retries=0)(
        proc_tasks.sleep_with_pid_file
    )
    warm = queue.task(name="t.proc_warm", executor="process")(proc_tasks.square)
    pid_file = str(tmp_path / "pid")

    def the_pid_gone() -> bool:
        return pid_gone(int(Path(pid_file).read_text()))  # a zombie counts as gone

    @queue.task(name="t.after")
    def after() -> bool:
        return the_pid_gone()

    # concurrency 1: the three run one after the other. The first starts the pool process,
    # so that the timed call does not spend its time budget on a process start.
    warmed = await warm.enqueue(3)
    first = await killed.enqueue(pid_file, 30.0)
    second = await after.enqueue()
    async with running(make_worker(queue, concurrency=1, process_pool_size=1)):
        assert await warmed.result(timeout=60) == 9
        with pytest.raises(TaskFailed) as failed:
            await first.result(timeout=60)
        assert failed.value.error_type == "blitzq.exceptions.TaskTimeout"
        started = await asyncio.to_thread(Path(pid_file).exists)
        assert started, "the timed-out call never started in the pool"
        # The second task could only start once the first one's slot was freed: by then
        # the process running it must be gone.
        assert await second.result(timeout=30) is True
    assert the_pid_gone()


async def test_timeout_is_the_alias_of_hard_timeout(queue: Queue) -> None:
    @queue.task(name="t.alias", hard_timeout=0.1, retries=0)
    async def slow() -> None:
        await asyncio.sleep(10)

    assert slow.timeout == 0.1
    with pytest.raises(ConfigurationError):
        queue.task(name="t.both", timeout=1, hard_timeout=2)(slow.fn)
    with pytest.raises(ConfigurationError):
        queue.task(name="t.proc_soft", executor="process", soft_timeout=1)(proc_tasks.square)
    handle = await slow.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=10)
    assert failed.value.error_type == "blitzq.exceptions.TaskTimeout"


async def test_a_delayed_task_older_than_max_age_expires(queue: Queue) -> None:
    ran: list[str] = []

    @queue.task(name="t.fresh", max_age=0.2)
    async def fresh(label: str) -> str:
        ran.append(label)
        return label

    stale = await fresh.options(delay=0.4).enqueue("stale")
    ok = await fresh.enqueue("ok")
    async with running(make_worker(queue, concurrency=2)):
        assert await ok.result(timeout=10) == "ok"
        with pytest.raises(TaskExpired) as expired:
            await stale.result(timeout=10)
    assert expired.value.state == "expired"
    assert ran == ["ok"]
    record = await stale.status()
    assert record is not None
    assert record.state is TaskState.EXPIRED
    assert record.state.is_final
    (dead,) = await queue.dead_letters()
    assert dead.id == stale.id
    assert dead.reason == "expired"


async def test_a_task_queued_behind_others_expires_by_the_per_call_max_age(
    queue: Queue,
) -> None:
    gate, started = asyncio.Event(), asyncio.Event()

    @queue.task(name="t.blocker")
    async def blocker() -> None:
        started.set()
        await gate.wait()

    @queue.task(name="t.notify")
    async def notify(label: str) -> str:
        return label

    await blocker.enqueue()
    late = await notify.options(max_age=0.2).enqueue("late")
    patient = await notify.enqueue("patient")
    async with running(make_worker(queue, concurrency=1)):
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(0.3)  # the queued call ages past its max_age behind the blocker
        gate.set()
        with pytest.raises(TaskExpired):
            await late.result(timeout=10)
        assert await patient.result(timeout=10) == "patient"
    assert (await queue.dead_letters())[0].reason == "expired"
