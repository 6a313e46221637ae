"""Workflows against a real Redis in both modes (and memory://): chains pass results,
groups and chords gather them in member order, nested shapes work, limits hold at build
time, a failed step fails the workflow at once, handles follow, cancel and re-attach.

Workers run in-process (``proc_tasks.running``); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import (
    ConfigurationError,
    Queue,
    RetryPolicy,
    Signature,
    TaskCancelled,
    TaskFailed,
    TaskState,
    WorkflowNotFound,
    chain,
    chord,
    group,
)
from blitzq.workflow import Chain, Chord, set_workflow_limits, workflow_limits

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


class App:
    """A Queue with the workflow tasks of these tests and counters of their runs."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.runs: Counter[str] = Counter()
        self.gate = asyncio.Event()
        runs = self.runs

        @queue.task(name="wf.add")
        async def add(a: int, b: int) -> int:
            runs["add"] += 1
            return a + b

        @queue.task(name="wf.mul")
        def mul(a: int, b: int) -> int:  # a thread task
            runs["mul"] += 1
            return a * b

        @queue.task(name="wf.slow_echo")
        async def slow_echo(value: Any, seconds: float) -> Any:
            runs["slow_echo"] += 1
            await asyncio.sleep(seconds)
            return value

        @queue.task(name="wf.total")
        async def total(values: list[int], bonus: int = 0) -> int:
            runs["total"] += 1
            return sum(values) + bonus

        @queue.task(name="wf.listing")
        async def listing(values: list[Any]) -> list[Any]:
            runs["listing"] += 1
            return values

        @queue.task(name="wf.boom", retries=0)
        async def boom(*_: Any) -> None:
            runs["boom"] += 1
            raise ValueError("boom: bad input")

        @queue.task(name="wf.wait_gate")
        async def wait_gate(value: Any) -> Any:
            runs["wait_gate"] += 1
            await self.gate.wait()
            return value

        flaky_left = {"n": 1}

        @queue.task(name="wf.flaky", retry_policy=RetryPolicy(base=0.05, jitter="none"))
        async def flaky(value: int) -> int:
            runs["flaky"] += 1
            if flaky_left["n"] > 0:
                flaky_left["n"] -= 1
                raise RuntimeError("transient")
            return value * 100

        self.add, self.mul, self.slow_echo, self.total = add, mul, slow_echo, total
        self.listing, self.boom, self.wait_gate, self.flaky = listing, boom, wait_gate, flaky

    async def count(self, name: str) -> int:
        """Runs of the task ``name`` so far (a coroutine, for ``eventually``)."""
        return self.runs[name]


@pytest.fixture
async def app(make_queue: Callable[..., Queue], mode: str) -> AsyncIterator[App]:
    """The test app on a Queue in ``mode``, with an in-process worker running."""
    queue = make_queue(mode=mode)
    made = App(queue)
    async with running(make_worker(queue, concurrency=20, unknown_task_grace=0)):
        yield made
    await queue.close()


# ------------------------------------------------------------------------- chains
async def test_chain_passes_each_result_to_the_next_step(app: App) -> None:
    handle = await app.queue.apply(app.add.s(1, 2) | app.mul.s(10) | app.add.s(5))
    assert await handle.get(timeout=10) == (1 + 2) * 10 + 5
    assert await handle.status() == "succeeded"
    handle2 = await app.queue.apply(chain(app.add.s(1, 1), app.add.s(1)))
    assert await handle2.get(timeout=10) == 3


async def test_immutable_step_ignores_the_previous_result(app: App) -> None:
    handle = await app.queue.apply(app.add.s(1, 2) | app.add.si(100, 1) | app.add.s(1))
    assert await handle.get(timeout=10) == 102


async def test_a_retried_step_keeps_its_place_in_the_workflow(app: App) -> None:
    handle = await app.queue.apply(app.add.s(1, 2) | app.flaky.s() | app.add.s(1))
    assert await handle.get(timeout=10) == 301
    assert app.runs["flaky"] == 2


# ------------------------------------------------------------------- groups, chords
async def test_group_results_come_in_member_order(app: App) -> None:
    # Later members finish first, so completion order is the reverse of member order.
    members = [app.slow_echo.s(i, 0.05 * (4 - i)) for i in range(5)]
    handle = await app.queue.apply(group(members))
    assert await handle.get(timeout=10) == [0, 1, 2, 3, 4]
    handle2 = await app.queue.apply(group(app.add.s(i, i) for i in range(3)))
    assert await handle2.get(timeout=10) == [0, 2, 4]


async def test_chord_callback_gets_the_ordered_list_once(app: App) -> None:
    members = [app.slow_echo.s(i, 0.02 * (5 - i)) for i in range(6)]
    handle = await app.queue.apply(chord(members, app.listing.s()))
    assert await handle.get(timeout=10) == [0, 1, 2, 3, 4, 5]
    assert app.runs["listing"] == 1
    # group | callback is a chord too, and the callback's own arguments follow the list.
    piped = group(app.add.s(i, 1) for i in range(4)) | app.total.s(bonus=1000)
    assert isinstance(piped, Chord)
    handle2 = await app.queue.apply(piped)
    assert await handle2.get(timeout=10) == 1 + 2 + 3 + 4 + 1000


async def test_nested_chain_with_a_chord_and_chord_of_chains(app: App) -> None:
    a = app
    # A chain containing a chord (whose members get the previous result) and more steps.
    inner = chord([a.add.s(1), a.add.s(2), a.mul.s(3)], a.total.s())
    flow = a.add.s(1, 1) | inner | a.add.s(1000)
    assert isinstance(flow, Chain)
    handle = await a.queue.apply(flow)
    assert await handle.get(timeout=10) == (3 + 4 + 6) + 1000
    # A chord whose members are a chain, a signature and a group (its list is one result).
    members = [chain(a.add.s(1, 1), a.mul.s(5)), a.add.s(7, 7), group(a.add.s(1, 1), a.add.s(2, 2))]
    handle2 = await a.queue.apply(chord(members, a.listing.s()))
    assert await handle2.get(timeout=10) == [10, 14, [2, 4]]
    # A group followed by a group (the list feeds each member of the second one).
    handle3 = await a.queue.apply(
        chain(group(a.add.s(1, 1), a.add.s(2, 2)), group(a.total.s(), a.total.s(bonus=1)))
    )
    assert await handle3.get(timeout=10) == [6, 7]


async def test_by_name_signatures_from_a_producer_without_the_code(
    app: App, make_queue: Callable[..., Queue], mode: str
) -> None:
    producer = make_queue(mode=mode)  # registers nothing: names only
    try:
        flow = chord(
            [producer.sig("wf.add", 1, 2), producer.sig("wf.add", 3, 4)],
            producer.sig("wf.total", bonus=10),
        )
        handle = await producer.apply(flow)
        assert await handle.get(timeout=10) == 3 + 7 + 10
    finally:
        await producer.close()


async def test_a_workflow_does_not_need_store_results(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, store_results=False)
    app = App(queue)
    async with running(make_worker(queue)):
        handle = await queue.apply(chord([app.add.s(1, 1), app.add.s(2, 2)], app.total.s()))
        assert await handle.get(timeout=10) == 6
        handle2 = await queue.apply(app.add.s(1, 1) | app.add.s(1))
        assert await handle2.get(timeout=10) == 3
    await queue.close()


# --------------------------------------------------------------------------- limits
def test_limits_are_checked_when_the_workflow_is_built(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()

    @queue.task(name="wf.noop")
    def noop(*_: Any) -> None:
        return None

    assert workflow_limits().max_depth == 10
    assert workflow_limits().max_group_size == 1000
    group([noop.s()] * 1000)  # at the limit: fine
    with pytest.raises(ConfigurationError, match="1001 members, over the limit of 1000"):
        group([noop.s()] * 1001)
    deep: Any = noop.s()
    for _ in range(9):
        deep = group([deep])  # depth 10
    with pytest.raises(ConfigurationError, match="nested 11 levels deep"):
        group([deep])
    with pytest.raises(ConfigurationError, match="nested 11 levels deep"):
        chain(noop.s(), deep)
    previous = set_workflow_limits(max_depth=3, max_group_size=2)
    try:
        with pytest.raises(ConfigurationError, match="over the limit of 2"):
            group([noop.s()] * 3)
        with pytest.raises(ConfigurationError, match="over the limit of 3"):
            chord([group([noop.s()])], noop.s()) | noop.s()
    finally:
        set_workflow_limits(previous.max_depth, previous.max_group_size)
    with pytest.raises(ConfigurationError, match="at least one member"):
        group([])
    with pytest.raises(ConfigurationError, match="callback must be a signature"):
        chord([noop.s()], group([noop.s()]))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="takes signatures"):
        chain(noop.s(), "not a step")  # type: ignore[arg-type]
    assert isinstance(queue.sig("wf.noop", 1), Signature)


# ------------------------------------------------------------------------ fail-fast
async def test_failed_step_wakes_get_with_its_error_and_stops_the_chain(app: App) -> None:
    flow = app.add.s(1, 1) | app.boom.s() | app.add.s(1)
    handle = await app.queue.apply(flow)
    started = time.monotonic()
    with pytest.raises(TaskFailed) as failed:
        await handle.get(timeout=30)
    assert time.monotonic() - started < 5, "get() was not woken by the failure"
    assert failed.value.error_type == "ValueError"
    assert failed.value.error == "boom: bad input"
    steps = await handle.children()
    assert failed.value.task_id == steps[1].id
    assert await handle.status() == "failed"
    # Atomic with the failed step's ack: the next step was never published.
    assert await steps[2].status() is None
    stats = await app.queue.stats([app.queue.name])
    assert stats["queues"][app.queue.name] == {"waiting": 0, "in_flight": 0}
    assert app.runs["add"] == 1


async def test_failed_chord_member_means_the_callback_never_runs(app: App) -> None:
    flow = chord([app.add.s(1, 1), app.boom.s(), app.slow_echo.s(3, 0.2)], app.listing.s())
    handle = await app.queue.apply(flow)
    with pytest.raises(TaskFailed, match="boom: bad input"):
        await handle.get(timeout=10)
    callback = (await handle.children())[-1]
    # Wait until the slow member finished too: the chord then has every other result.
    await eventually(lambda: app.count("slow_echo"), lambda n: n == 1)
    await eventually(
        lambda: app.queue.stats([app.queue.name]),
        lambda s: s["queues"][app.queue.name] == {"waiting": 0, "in_flight": 0},
    )
    assert await callback.status() is None
    assert app.runs["listing"] == 0


async def test_a_step_dead_lettered_outside_the_worker_path_still_fails_the_workflow(
    app: App,
) -> None:
    # An unknown task name is dead-lettered on receipt, without the step's finisher.
    handle = await app.queue.apply(app.add.s(1, 1) | app.queue.sig("wf.no_such_task"))
    with pytest.raises(TaskFailed) as failed:
        await handle.get(timeout=15)
    assert failed.value.state == "failed"
    assert failed.value.error_type == "unknown task"
    assert await handle.status() == "failed"


# ---------------------------------------------------------------------------- handles
async def test_handle_children_status_and_cancel(app: App) -> None:
    flow = app.add.s(1, 1) | app.wait_gate.s() | app.add.s(100)
    handle = await app.queue.apply(flow)
    children = await handle.children()
    assert [c.task for c in children] == ["wf.add", "wf.wait_gate", "wf.add"]
    assert all(c.queue == app.queue.name for c in children)
    await eventually(lambda: app.count("wait_gate"), lambda n: n == 1)
    assert await handle.status() == "running"
    first = await children[0].status()
    assert first is not None
    assert first.state is TaskState.SUCCEEDED
    assert first.result == 2
    assert await handle.cancel() == "cancelled"
    assert await handle.status() == "cancelled"
    with pytest.raises(TaskCancelled):
        await handle.get(timeout=5)
    app.gate.set()  # even if the running step finishes now, nothing follows it
    running_step = await eventually(
        lambda: children[1].status(), lambda r: r is not None and r.state.is_final
    )
    assert running_step is not None
    assert running_step.state is TaskState.CANCELLED
    await eventually(
        lambda: app.queue.stats([app.queue.name]),
        lambda s: s["queues"][app.queue.name] == {"waiting": 0, "in_flight": 0},
    )
    assert app.runs["add"] == 1
    last = await children[2].status()
    assert last is not None
    assert last.state is TaskState.CANCELLED
    # Cancelling a finished workflow changes nothing.
    done = await app.queue.apply(app.add.s(2, 2))
    assert await done.get(timeout=10) == 4
    assert await done.cancel() == "succeeded"


async def test_reattach_from_a_second_queue_object(
    app: App, make_queue: Callable[..., Queue], mode: str
) -> None:
    handle = await app.queue.apply(chord([app.add.s(1, 2), app.add.s(3, 4)], app.total.s()))
    other = make_queue(mode=mode)
    try:
        again = other.workflow(handle.id)
        assert again.id == handle.id
        assert await again.get(timeout=10) == 10
        assert await again.status() == "succeeded"
        assert [c.id for c in await again.children()] == [c.id for c in await handle.children()]
        with pytest.raises(WorkflowNotFound):
            await other.workflow("no-such-workflow").status()
        with pytest.raises(WorkflowNotFound):
            await other.workflow("no-such-workflow").get(timeout=1)
    finally:
        await other.close()


async def test_sync_twins(app: App) -> None:
    def use_sync() -> tuple[Any, str, int]:
        handle = app.queue.apply_sync(app.add.s(20, 1) | app.mul.s(2))
        value = handle.get_sync(timeout=10)
        return value, handle.status_sync(), len(handle.children_sync())

    assert await asyncio.to_thread(use_sync) == (42, "succeeded", 2)
    app.queue.close_sync()


async def test_memory_url_runs_workflows_too() -> None:
    queue = Queue(redis_url=f"memory://wf-{time.monotonic_ns()}")
    app = App(queue)
    async with running(make_worker(queue)):
        handle = await queue.apply(
            app.add.s(1, 1) | chord([app.add.s(1), app.mul.s(3)], app.total.s())
        )
        assert await handle.get(timeout=10) == 3 + 6
        failing = await queue.apply(app.add.s(1, 1) | app.boom.s() | app.add.s(1))
        with pytest.raises(TaskFailed):
            await failing.get(timeout=10)
        assert await failing.status() == "failed"


async def test_apply_registers_the_steps_queues_not_their_task_names(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """What apply() adds to the registry of known queues (``queue stats``, ``check``) are the
    queues its steps wait in, never their task names: with no worker running, the chain's
    first step shows as waiting in its queue."""
    queue = make_queue(mode=mode)
    App(queue)
    other = Signature("wf.add", (1, 2), {}, queue="wf-other")
    await queue.apply(chain(other, Signature("wf.add", (10,), {})))
    await queue.apply(chord(group(Signature("wf.mul", (2, 3), {})), Signature("wf.total")))
    known = set(await queue.broker.known_queues())
    assert {"wf-other", queue.name} <= known
    assert not known & {"wf.add", "wf.mul", "wf.total"}
    stats = await queue.stats()
    assert stats["queues"]["wf-other"]["waiting"] == 1
    await queue.close()
