"""Cancelling a workflow starts none of its queued steps, even in the slots its running
steps' cancels free.

A workflow's cancel used to cancel its steps one by one: a running step's cancel freed its
slot, and the worker fetched a queued step of the same workflow before it had heard that one
was cancelled too (tester finding: 3 of 8 queued steps ran to the end, in every try). Now
every step is marked first and announced after, and a worker whose running task is cancelled
reads the marks again before its next start.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from blitzq import Queue, Task, TaskState, chord

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("mode", ["reliable", "fast"])
@pytest.mark.parametrize("queued_kind", ["thread", "async"])
async def test_cancelling_a_workflow_starts_none_of_its_queued_steps(
    make_queue: Callable[..., Queue], mode: str, queued_kind: str
) -> None:
    queue = make_queue(mode=mode)
    started: list[str] = []
    release = threading.Event()  # never set while the workflow runs: the steps wait

    def waiting_step(name: str, label: str) -> Task[[int], int]:
        """An async step that notes its start as ``<label><i>``, then waits."""

        @queue.task(name=name)
        async def step(i: int) -> int:
            started.append(f"{label}{i}")
            await asyncio.sleep(30)
            return i

        return step

    busy = waiting_step("cancel.busy", "busy")
    queued_async = waiting_step("cancel.queued_async", "queued")

    @queue.task(name="cancel.queued_thread")
    def queued_thread(i: int) -> int:
        started.append(f"queued{i}")
        release.wait(30)
        return i

    @queue.task(name="cancel.merge")
    def merge(values: list[int]) -> int:
        return sum(values)

    queued = queued_thread if queued_kind == "thread" else queued_async
    steps = [busy.s(i) for i in range(4)] + [queued.s(i) for i in range(4, 12)]
    try:
        async with running(make_worker(queue, concurrency=4)):
            handle = await queue.apply(chord(steps, merge.s()))
            await eventually(lambda: _count(started), lambda n: n == 4)
            assert sorted(started) == [f"busy{i}" for i in range(4)]
            assert await handle.cancel() == "cancelled"
            children = await handle.children()
            for child in children[:12]:
                record = await eventually(
                    child.status, lambda r: r is not None and r.state.is_final
                )
                assert record is not None
                assert record.state is TaskState.CANCELLED, (child.id, record)
            await eventually(
                lambda: queue.stats([queue.name]),
                lambda s: s["queues"][queue.name] == {"waiting": 0, "in_flight": 0},
            )
        assert sorted(started) == [f"busy{i}" for i in range(4)]  # no queued step started
    finally:
        release.set()
        await queue.close()


async def _count(items: list[str]) -> int:
    return len(items)
