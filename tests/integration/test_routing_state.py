"""Routing, state tracking and ``current_task()`` against a real Redis, in both modes.

Routes give a task its queue when neither the call nor the decorator names one; with
``track_state=True`` a task's record follows it through its life; ``current_task()`` tells a
running task who it is, and tasks enqueued from inside a task inherit its correlation id and
headers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, Retry, TaskState, current_task
from blitzq.broker.redis import ReliableRedisBroker
from blitzq.routing import levels

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


def context_doc() -> dict[str, Any]:
    """What ``current_task()`` says, as a plain dict."""
    ctx = current_task()
    assert ctx is not None
    return {
        "id": ctx.id,
        "task": ctx.task,
        "queue": ctx.queue,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "correlation_id": ctx.correlation_id,
        "headers": ctx.headers,
    }


# ------------------------------------------------------------------------------- routing
async def test_routes_send_matching_tasks_to_their_queue(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, routes={"billing.*": "billing", "mail.*": "mail"})
    seen: list[str] = []

    @queue.task(name="billing.charge")
    async def charge(amount: int) -> int:
        ctx = current_task()
        assert ctx is not None
        seen.append(ctx.queue)
        return amount

    @queue.task(name="reports.build")
    async def build() -> str:
        return "built"

    assert charge.queue == "billing"
    assert build.queue == "default"
    handle = await charge.enqueue(5)
    assert handle.queue == "billing"
    assert (await charge.options(priority="high").enqueue(6)).queue == "billing:high"
    # By name, without the task registered in the producer: the routes still apply.
    assert (await queue.send("billing.refund")).queue == "billing"
    assert (await queue.send("mail.welcome")).queue == "mail"
    assert (await queue.send("other.thing")).queue == "default"
    assert (await build.enqueue()).queue == "default"
    # A default worker consumes the routed queues of its registered tasks.
    worker = make_worker(queue)
    assert "billing" in worker.queues
    async with running(worker):
        assert await handle.result(timeout=5) == 5
    assert "billing" in seen
    await queue.close()


async def test_queue_precedence_call_then_decorator_then_routes(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(routes={"acct.*": "routed"})

    @queue.task(name="acct.pinned", queue="pinned")
    async def pinned() -> None:
        return None

    @queue.task(name="acct.loose")
    async def loose() -> None:
        return None

    assert (await pinned.enqueue()).queue == "pinned"  # decorator beats routes
    assert (await loose.enqueue()).queue == "routed"  # routes beat the Queue's name
    assert (await pinned.options(queue="percall").enqueue()).queue == "percall"
    assert (await loose.options(queue="percall").enqueue()).queue == "percall"
    assert (await queue.send("acct.pinned")).queue == "pinned"
    assert (await queue.send("acct.pinned", queue="percall")).queue == "percall"
    assert (await queue.send("acct.unregistered")).queue == "routed"
    await queue.close()


async def test_callable_route(make_queue: Callable[..., Queue], mode: str) -> None:
    asked: list[str] = []

    def router(name: str) -> str | None:
        asked.append(name)
        return "heavy" if name.endswith(".big") else None

    queue = make_queue(mode=mode, routes=router)

    @queue.task(name="jobs.big")
    async def big() -> str:
        ctx = current_task()
        assert ctx is not None
        return ctx.queue

    @queue.task(name="jobs.small")
    async def small() -> str:
        ctx = current_task()
        assert ctx is not None
        return ctx.queue

    assert "jobs.big" in asked
    assert "jobs.small" in asked
    handles = [await big.enqueue(), await small.enqueue()]
    assert [h.queue for h in handles] == ["heavy", "default"]
    assert (await queue.send("x.big")).queue == "heavy"
    async with running(make_worker(queue, queues=["heavy", "default"])):
        assert [await h.result(timeout=5) for h in handles] == ["heavy", "default"]
    await queue.close()


# --------------------------------------------------------------------------- track_state
async def test_track_state_follows_a_task_through_its_life(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="sq", mode=mode, track_state=True)
    gate = asyncio.Event()
    attempts: list[int] = []

    @queue.task(name="s.flaky", retries=2)
    async def flaky() -> str:
        ctx = current_task()
        assert ctx is not None
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Retry(delay=0.6)
        await gate.wait()
        return "ok"

    @queue.task(name="s.plain")
    async def plain() -> None:
        return None

    queued = await plain.enqueue()
    record = await queued.status()
    assert record is not None
    assert record.state is TaskState.QUEUED
    assert record.attempts == 0

    handle = await flaky.options(delay=0.5).enqueue()
    states: list[TaskState] = []

    async def state() -> TaskState | None:
        r = await handle.status()
        if r is not None and (not states or states[-1] is not r.state):
            states.append(r.state)
        return r.state if r is not None else None

    assert await state() is TaskState.SCHEDULED
    async with running(make_worker(queue)):
        assert await state() is TaskState.SCHEDULED  # not due yet
        await eventually(state, lambda s: s is TaskState.RETRYING, 30.0)
        retrying = await handle.status()
        assert retrying is not None
        assert retrying.attempts == 1
        assert retrying.error_type is not None
        await eventually(state, lambda s: s is TaskState.RUNNING, 30.0)
        running_record = await handle.status()
        assert running_record is not None
        assert running_record.attempts == 2
        assert running_record.started_at is not None
        assert running_record.worker
        gate.set()
        assert await handle.result(timeout=5) == "ok"
        await queued.result(timeout=5)
    assert await state() is TaskState.SUCCEEDED
    assert states == [
        TaskState.SCHEDULED,
        TaskState.RETRYING,
        TaskState.RUNNING,
        TaskState.SUCCEEDED,
    ]
    assert attempts == [1, 2]
    final = await handle.status()
    assert final is not None
    assert final.attempts == 2
    assert final.result == "ok"
    await queue.close()


async def test_without_track_state_only_final_records_exist(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="sq", mode=mode)

    @queue.task(name="s.plain")
    async def plain() -> int:
        return 1

    handle = await plain.enqueue()
    later = await plain.options(delay=30).enqueue()
    assert await handle.status() is None  # waiting in its queue: no record
    # On the schedule: no record either, but inspect tells it is scheduled and when.
    scheduled = await later.status()
    assert scheduled is not None
    assert scheduled.state is TaskState.SCHEDULED
    assert scheduled.due_at is not None
    async with running(make_worker(queue)):
        assert await handle.result(timeout=5) == 1
    await queue.close()


# -------------------------------------------------------------------------- current_task
async def test_current_task_in_async_and_thread_tasks(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="ctxq", mode=mode)

    @queue.task(name="ctx.async", retries=4)
    async def in_async() -> dict[str, Any]:
        await asyncio.sleep(0.01)  # still there after the first suspension
        return context_doc()

    @queue.task(name="ctx.thread", retries=1)
    def in_thread() -> dict[str, Any]:
        return context_doc()

    assert current_task() is None
    a = await in_async.options(
        headers={"tenant": "acme", "n": 1}, correlation_id="corr-1", task_id="async-1"
    ).enqueue()
    t = await in_thread.options(priority="high", headers={"tenant": "zeta"}).enqueue()
    async with running(make_worker(queue)):
        doc_a = await a.result(timeout=5)
        doc_t = await t.result(timeout=5)
    assert doc_a == {
        "id": "async-1",
        "task": "ctx.async",
        "queue": "ctxq",
        "attempt": 1,
        "max_attempts": 5,
        "correlation_id": "corr-1",
        "headers": {"tenant": "acme", "n": 1},
    }
    assert doc_t == {
        "id": t.id,
        "task": "ctx.thread",
        "queue": "ctxq:high",
        "attempt": 1,
        "max_attempts": 2,
        "correlation_id": None,
        "headers": {"tenant": "zeta"},
    }
    assert current_task() is None
    await queue.close()


async def test_current_task_is_one_object_for_the_whole_run(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    # Made when first asked for (an async run that never asks costs none), then the same
    # object before and after a suspension and in a thread the task starts.
    queue = make_queue(name="ctxq", mode=mode)

    @queue.task(name="ctx.same")
    async def same() -> list[bool]:
        first = current_task()
        await asyncio.sleep(0.01)
        in_thread = await asyncio.to_thread(current_task)
        return [first is not None, first is current_task(), first is in_thread]

    @queue.task(name="ctx.never")
    async def never() -> int:
        return 1

    handles = [await never.enqueue(), await same.enqueue(), await never.enqueue()]
    async with running(make_worker(queue)):
        results = [await h.result(timeout=5) for h in handles]
    assert results == [1, [True, True, True], 1]
    assert current_task() is None
    await queue.close()


async def test_child_tasks_inherit_correlation_id_and_headers(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="ctxq", mode=mode)

    @queue.task(name="ctx.child")
    async def child(label: str) -> dict[str, Any]:
        return {"label": label, **context_doc()}

    @queue.task(name="ctx.parent_async")
    async def parent_async() -> list[str]:
        plain = await child.enqueue("plain")
        extra = await child.options(headers={"extra": True, "tenant": "override"}).enqueue("extra")
        return [plain.id, extra.id]

    @queue.task(name="ctx.parent_thread")
    def parent_thread() -> list[str]:
        return [child.enqueue_sync("from-thread").id]

    p1 = await parent_async.options(headers={"tenant": "acme"}).enqueue()
    p2 = await parent_async.options(correlation_id="root-corr", headers={"tenant": "b"}).enqueue()
    p3 = await parent_thread.options(headers={"tenant": "t"}).enqueue()
    async with running(make_worker(queue)):
        kids1 = [await queue.get_result(i, timeout=5) for i in await p1.result(timeout=5)]
        kids2 = [await queue.get_result(i, timeout=5) for i in await p2.result(timeout=5)]
        kids3 = [await queue.get_result(i, timeout=10) for i in await p3.result(timeout=10)]
    # Without a correlation id of its own, the parent's id becomes the children's.
    assert [k["correlation_id"] for k in kids1] == [p1.id, p1.id]
    assert kids1[0]["headers"] == {"tenant": "acme"}
    assert kids1[1]["headers"] == {"tenant": "override", "extra": True}
    assert [k["correlation_id"] for k in kids2] == ["root-corr", "root-corr"]
    assert kids2[0]["headers"] == {"tenant": "b"}
    # A thread task enqueuing with the sync API inherits too.
    assert kids3[0]["correlation_id"] == p3.id
    assert kids3[0]["headers"] == {"tenant": "t"}
    # Outside any task nothing is inherited.
    lone = await child.enqueue("lone")
    async with running(make_worker(queue)):
        doc = await lone.result(timeout=5)
    assert doc["correlation_id"] is None
    assert doc["headers"] is None
    await queue.close()


async def test_attempt_counts_crash_redeliveries(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="ctxq", mode="reliable", visibility_timeout=60.0)

    @queue.task(name="ctx.crashy", retries=3)
    async def crashy() -> dict[str, Any]:
        return context_doc()

    handle = await crashy.enqueue()
    # A worker takes the message and dies: its delivery is abandoned.
    dead = ReliableRedisBroker(queue.url, queue.namespace)
    try:
        await dead.prepare_consumer(levels("ctxq"), "crashed-worker")
        assert len(await dead.fetch_first(levels("ctxq"), 10, 0)) == 1
    finally:
        await dead.close()
    await asyncio.sleep(0.05)
    await queue.broker.prepare_consumer(levels("ctxq"), "recoverer")
    started = time.monotonic()
    assert await queue.broker.recover("ctxq", 0.01, 10, queue.max_deliveries) == (1, 0)
    async with running(make_worker(queue)):
        doc = await handle.result(timeout=5)
    assert doc["attempt"] == 2
    assert doc["max_attempts"] == 4
    record = await handle.status()
    assert record is not None
    assert record.attempts == 2
    assert time.monotonic() - started < 5
    await queue.close()


async def test_track_state_reaches_succeeded_without_stored_results(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """A task that stores no result still ends ``succeeded`` (not stuck at ``running``)."""
    queue = make_queue(name="sq", mode=mode, track_state=True)

    @queue.task(name="s.quiet", store_result=False)
    async def quiet() -> int:
        return 7

    handle = await quiet.enqueue()
    async with running(make_worker(queue)):
        record = await eventually(handle.status, lambda r: r is not None and r.state.is_final, 30.0)
    assert record is not None
    assert record.state is TaskState.SUCCEEDED
    assert record.result is None
    assert record.attempts == 1
    await queue.close()


async def test_delayed_task_starts_on_time_on_an_idle_worker(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """The promoter sleeps until the earliest due time and is woken by a new, earlier one
    (it does not poll on its 1 s ceiling)."""
    queue = make_queue(name="sq", mode=mode)
    starts: dict[int, float] = {}

    @queue.task(name="s.due")
    async def due(i: int) -> None:
        starts[i] = time.time()

    late = []
    worker = make_worker(queue)
    async with running(worker):
        await eventually(queue.broker.workers, lambda w: worker.id in w, 30.0)
        for i in range(4):
            await asyncio.sleep(0.23)  # the promoter is in its ceiling-long sleep
            eta = time.time() + 0.3
            handle = await due.options(eta=eta).enqueue(i)
            await handle.result(timeout=5)
            late.append(starts[i] - eta)
    print(f"delayed task start lateness on an idle worker: {[round(x, 4) for x in late]}")
    assert all(-0.01 <= x < 0.2 for x in late), late
    await queue.close()
