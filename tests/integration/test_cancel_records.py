"""The record is the one answer about a cancelled task, and result waits end when their record
cannot come (issue 28, items 7, 9 and 10), against a real Redis (and the embedded Valkey:
``complete.lua``, ``cancel.lua``, ``trace.lua`` and ``keep_running.lua`` changed).

- A running task being cancelled keeps its ``running`` record (read as ``cancelling``, with
  its ``started_at``) until its run has really ended; then ``cancelled``, ``started_at`` kept.
- Tasks cancelled right as they finish: ``result()`` and the stored record agree, every one.
- A wait whose record expired, and that nothing else can bring, ends with ResultExpired
  (``timeout=None`` too); a task still to come (queued, scheduled) is waited for.
- A run longer than ``result_ttl`` keeps its ``running`` record.
- A workflow whose state expired: ``get()`` raises WorkflowExpired.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import (
    Queue,
    ResultExpired,
    ResultTimeout,
    TaskCancelled,
    TaskState,
    WorkflowExpired,
    WorkflowNotFound,
    group,
)
from blitzq.client import lookup
from blitzq.worker import maintenance

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.both_servers


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
def quick_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Result waits ask whether their task is still known after 0.1 s (not 2 s)."""
    monkeypatch.setattr(lookup, "TRACE_FIRST", 0.1)
    monkeypatch.setattr(lookup, "TRACE_MAX", 0.5)


async def test_cancel_during_cleanup_keeps_started_at_until_the_run_ends(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="cr", mode=mode, track_state=True)
    cleaning = asyncio.Event()
    release = asyncio.Event()

    @queue.task(name="cr.cleanup")
    async def with_cleanup() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cleaning.set()
            await release.wait()  # cleanup that awaits
            raise
        return "slept"

    try:
        async with running(make_worker(queue)):
            handle = await with_cleanup.enqueue()
            started = await eventually(
                handle.status, lambda r: r is not None and r.state is TaskState.RUNNING, 30.0
            )
            assert started is not None
            assert started.started_at is not None
            assert await handle.cancel() == "running"
            await asyncio.wait_for(cleaning.wait(), 30.0)
            during = await handle.status()
            assert during is not None
            assert during.state is TaskState.CANCELLING
            assert not during.state.is_final
            assert during.started_at == started.started_at
            with pytest.raises(ResultTimeout) as info:  # not final while cleanup runs
                await handle.result(timeout=0.3)
            assert not isinstance(info.value, ResultExpired)
            release.set()
            with pytest.raises(TaskCancelled):
                await handle.result(timeout=30)
        final = await handle.status()
        assert final is not None
        assert final.state is TaskState.CANCELLED
        assert final.started_at == started.started_at
        assert final.finished_at is not None
        assert final.finished_at >= started.started_at
    finally:
        await queue.close()


async def _outcome(handle: Any) -> tuple[str, Any]:
    try:
        return "succeeded", await handle.result(timeout=60)
    except TaskCancelled:
        return "cancelled", None


@pytest.mark.parametrize("track_state", [False, True])
async def test_tasks_cancelled_as_they_finish_agree_with_their_records(
    make_queue: Callable[..., Queue], mode: str, track_state: bool
) -> None:
    queue = make_queue(name="cr", mode=mode, track_state=track_state)
    count = 40
    gate = asyncio.Event()
    started: set[int] = set()

    @queue.task(name="cr.racer")
    async def racer(i: int) -> int:
        started.add(i)
        await gate.wait()
        for _ in range(i % 5):  # spread the ends over a few turns of the loop
            await asyncio.sleep(0)
        return i

    try:
        await _race(queue, racer, count, started, gate.set, f"{mode} async {track_state=}")
    finally:
        await queue.close()


@pytest.mark.parametrize("track_state", [False, True])
async def test_thread_tasks_cancelled_as_they_finish_agree_with_their_records(
    make_queue: Callable[..., Queue], track_state: bool
) -> None:
    """Thread tasks are only asked to stop: one returning as the cancel arrives ends
    ``succeeded`` or ``cancelled``, and ``result()`` says the same as its record."""
    queue = make_queue(name="cr", track_state=track_state)
    count = 16
    gate = threading.Event()
    started: set[int] = set()

    @queue.task(name="cr.thread_racer")
    def racer(i: int) -> int:
        started.add(i)
        gate.wait(60)
        return i

    try:
        await _race(queue, racer, count, started, gate.set, f"thread {track_state=}")
    finally:
        await queue.close()


async def _race(
    queue: Queue, task: Any, count: int, started: set[int], release: Callable[[], None], label: str
) -> None:
    """Run ``count`` calls of ``task`` (each adds its argument to ``started``, then waits to
    be released) with result waits already in flight; release them all and cancel them all
    at once; once the worker has stopped, every answer of ``result()`` must be its record's."""
    async with running(make_worker(queue, concurrency=count)):
        handles = await task.enqueue_many([(i,) for i in range(count)])
        waits = [asyncio.ensure_future(_outcome(h)) for h in handles]
        await eventually(lambda: asyncio.sleep(0, len(started)), lambda n: n == count, 30.0)
        release()
        answers = await asyncio.gather(*(h.cancel() for h in handles))
        outcomes = await asyncio.wait_for(asyncio.gather(*waits), 60.0)
    # The worker stopped: every completion is applied. Read the records now.
    kinds: dict[str, int] = {}
    for handle, (kind, value), answer in zip(handles, outcomes, answers, strict=True):
        record = await queue.inspect(handle.id)
        assert record is not None, handle.id
        assert record.state.value == kind, (handle.id, answer, kind, record)
        if kind == "succeeded":
            assert value == record.result
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{label}: {kinds}, cancel answers {set(answers)}")


async def test_a_cancel_stored_before_a_completion_is_not_overwritten(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """A cancel that does not find the task running stores ``cancelled`` at once; a run of it
    that completes later (fetched just before the cancel, and done before its worker heard of
    it) writes nothing over that record but its worker's own ``cancelled`` one."""
    from blitzq import records
    from blitzq.broker import Completion

    queue = make_queue(name="cr", mode=mode)
    broker = queue.broker
    now = time.time()
    try:
        assert await queue.cancel("c1") == "pending"
        with pytest.raises(TaskCancelled):
            await queue.get_result("c1", timeout=1)
        late = [
            records.running("c1", "t", "cr", 1, now, now, "w"),
            records.succeeded("c1", "t", "cr", 1, now, now, "w", 42),
            records.failed("c1", "t", "cr", 1, now, now, "w", "E", "m", "tb"),
        ]
        for record in late:
            await broker.complete([Completion("cr", None, "c1", record, 60)])
            stored = await queue.inspect("c1")
            assert stored is not None
            assert stored.state is TaskState.CANCELLED
            assert stored.worker is None  # still the cancel's record
            with pytest.raises(TaskCancelled):
                await queue.get_result("c1", timeout=1)
        # The worker's cancelled record (richer: task, queue, started_at) replaces it.
        own = records.cancelled("c1", "t", "cr", 1, now, "w", started_at=now)
        await broker.complete([Completion("cr", None, "c1", own, 60)])
        stored = await queue.inspect("c1")
        assert stored is not None
        assert stored.state is TaskState.CANCELLED
        assert (stored.worker, stored.task, stored.started_at) == ("w", "t", now)
        # Another task, never cancelled, is written as usual in the same batch.
        ok = records.succeeded("c2", "t", "cr", 1, now, now, "w", 1)
        await broker.complete(
            [
                Completion("cr", None, "c1", late[1], 60),
                Completion("cr", None, "c2", ok, 60),
            ]
        )
        assert await queue.get_result("c2", timeout=1) == 1
        with pytest.raises(TaskCancelled):
            await queue.get_result("c1", timeout=1)
    finally:
        await queue.close()


async def test_result_of_an_expired_record_ends_without_a_timeout(
    make_queue: Callable[..., Queue], quick_trace: None
) -> None:
    queue = make_queue(name="cr", result_ttl=1)

    @queue.task(name="cr.quick")
    async def quick() -> int:
        return 5

    try:
        async with running(make_worker(queue)):
            handle = await quick.enqueue()
            assert await handle.result(timeout=30) == 5
        await eventually(lambda: queue.broker.get_record(handle.id), lambda r: r is None, 30.0)
        # A wait that starts now, as in another process: not vouched by this process's
        # listener, which may still remember the completion it saw pushed.
        handle._since = None
        with pytest.raises(ResultExpired) as info:
            await asyncio.wait_for(handle.result(timeout=None), 30.0)
        assert isinstance(info.value, ResultTimeout)
        assert info.value.task_id == handle.id
        assert "result_ttl" in str(info.value)
        # get_results keeps the error's kind.
        with pytest.raises(ResultExpired):
            await asyncio.wait_for(queue.get_results([handle]), 30.0)
    finally:
        await queue.close()


async def test_a_record_lost_before_its_ttl_is_named_as_lost(
    make_queue: Callable[..., Queue], quick_trace: None
) -> None:
    """A record gone seconds after the task was sent did not expire (result_ttl is a day):
    the server lost it (a restart without persistence, a flush, an eviction). A user saw
    "records expire result_ttl (86400 s) after they are written" for a 20-second-old task;
    the handle knows when it sent the task and says what happened instead."""
    queue = make_queue(name="cr")

    @queue.task(name="cr.lost")
    async def lost() -> int:
        return 5

    try:
        async with running(make_worker(queue)):
            handle = await lost.enqueue()
            assert await handle.result(timeout=30) == 5
        records: Any = queue.broker.state.records
        assert await records.client.delete(records.keys.record(handle.id)) == 1  # as a flush
        handle._since = None  # a wait not vouched by this process's listener
        with pytest.raises(ResultExpired) as info:
            await asyncio.wait_for(handle.result(timeout=None), 30.0)
        message = str(info.value)
        assert f"less than result_ttl ({queue.result_ttl} s)" in message
        assert "the server lost its data (a restart without persistence" in message
        assert "or an operator purged it (queue purge)" in message  # a user test's purge
        assert "records expire result_ttl" not in message
    finally:
        await queue.close()


async def test_a_wait_for_a_task_still_to_come_goes_on(
    make_queue: Callable[..., Queue], quick_trace: None
) -> None:
    """Queued with no worker yet, or delayed past its record's life: known somewhere, so the
    wait keeps waiting (several traces pass) and returns the result once it comes."""
    queue = make_queue(name="cr", result_ttl=1)

    @queue.task(name="cr.later")
    async def later(x: int) -> int:
        return x + 1

    try:
        queued = await later.enqueue(1)
        delayed = await later.options(delay=1.5).enqueue(2)
        waits = [asyncio.ensure_future(h.result(timeout=None)) for h in (queued, delayed)]
        calls: list[int] = []
        trace = queue.broker.state.records.trace_task

        async def counted(task_id: str, where: str) -> bool | None:
            calls.append(1)
            return await trace(task_id, where)

        queue.broker.state.records.trace_task = counted  # type: ignore[method-assign]
        await eventually(lambda: asyncio.sleep(0, len(calls)), lambda n: n >= 6, 30.0)
        assert not any(w.done() for w in waits)
        async with running(make_worker(queue)):
            assert await asyncio.wait_for(asyncio.gather(*waits), 30.0) == [2, 3]
    finally:
        await queue.close()


async def test_fast_mode_cannot_tell_and_waits_to_its_timeout(
    make_queue: Callable[..., Queue], quick_trace: None
) -> None:
    """A list pops a running message: the store cannot prove a task gone, so a wait on an
    expired record runs to its timeout (a plain ResultTimeout)."""
    queue = make_queue(name="cr", mode="fast", result_ttl=1)

    @queue.task(name="cr.fastq")
    async def fastq() -> int:
        return 1

    try:
        async with running(make_worker(queue)):
            handle = await fastq.enqueue()
            assert await handle.result(timeout=30) == 1
        await eventually(lambda: queue.broker.get_record(handle.id), lambda r: r is None, 30.0)
        assert await queue.broker.state.records.trace_task(handle.id, handle.queue) is None
        handle._since = None  # as in another process (see the test above)
        with pytest.raises(ResultTimeout) as info:
            await handle.result(timeout=1.0)
        assert not isinstance(info.value, ResultExpired)
    finally:
        await queue.close()


async def test_a_run_longer_than_result_ttl_keeps_its_running_record(
    make_queue: Callable[..., Queue], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """result_ttl 1 s; running records live 4 s (a margin of 2 s instead of 3 rounds + 5 s)
    and the worker's maintenance (every 0.5 s) must extend them for a 5 s run."""
    monkeypatch.setattr(maintenance, "keep_margin", lambda visibility_timeout: 2)
    queue = make_queue(name="cr", mode=mode, track_state=True, result_ttl=1, visibility_timeout=1.5)
    release = asyncio.Event()

    @queue.task(name="cr.long")
    async def long_run() -> str:
        await release.wait()
        return "done"

    try:
        async with running(make_worker(queue)):
            handle = await long_run.enqueue()
            first = await eventually(
                handle.status, lambda r: r is not None and r.state is TaskState.RUNNING, 30.0
            )
            assert first is not None
            end = time.monotonic() + 5.0  # past result_ttl and the first record's TTL
            while time.monotonic() < end:
                record = await handle.status()
                assert record is not None, "the running record expired under its run"
                assert record.state is TaskState.RUNNING
                await asyncio.sleep(0.2)
            release.set()
            assert await handle.result(timeout=30) == "done"
    finally:
        await queue.close()


async def test_keep_running_extends_running_records_only(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    from blitzq import records

    queue = make_queue(name="cr")
    try:
        keys = queue.broker.state.keys  # type: ignore[attr-defined]
        now = time.time()
        run = records.running("r1", "t", "cr", 1, now, now, "w")
        done = records.succeeded("r2", "t", "cr", 1, now, now, "w", 1)
        await raw_redis.set(keys.record("r1"), run, ex=2)
        await raw_redis.set(keys.record("r2"), done, ex=2)
        assert await queue.broker.state.records.keep_running(["r1", "r2", "r3"], 600) == 1
        assert 590 <= await raw_redis.ttl(keys.record("r1")) <= 600
        assert await raw_redis.ttl(keys.record("r2")) <= 2
        assert await raw_redis.exists(keys.record("r3")) == 0
        assert await queue.broker.state.records.keep_running([], 600) == 0
    finally:
        await queue.close()


async def test_group_get_after_its_state_expired_names_the_expiry(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="cr", result_ttl=1)

    @queue.task(name="cr.add")
    async def add(x: int, y: int) -> int:
        return x + y

    try:
        async with running(make_worker(queue)):
            handle = await queue.apply(group(add.s(1, 2), add.s(3, 4)))
            assert await handle.get(timeout=30) == [3, 7]
        await eventually(lambda: queue.broker.workflow_state(handle.id), lambda s: s is None, 30.0)
        with pytest.raises(WorkflowExpired) as info:
            await asyncio.wait_for(handle.get(), 30.0)
        assert isinstance(info.value, WorkflowNotFound)
        assert "expired" in str(info.value)
        # A handle made from the id alone cannot know it existed: not found, as before.
        with pytest.raises(WorkflowNotFound) as plain:
            await queue.workflow(handle.id).get()
        assert not isinstance(plain.value, WorkflowExpired)
    finally:
        await queue.close()
