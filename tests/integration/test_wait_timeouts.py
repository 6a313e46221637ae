"""Every wait's ``timeout`` is checked where it is given: ``nan``, ``-1``, an infinity, a
bool or a string is a ``ConfigurationError`` naming ``timeout``, never a ``ResultTimeout``
raised at once (``within nan s``); ``None`` and finite numbers ``>= 0`` keep working."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, ResultTimeout, WorkflowHandle

pytestmark = pytest.mark.timeout(60)

BAD = [math.nan, -1, -0.5, math.inf, -math.inf, True, "1", 1e12]


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    q = make_queue()
    yield q
    await q.close()


@pytest.mark.parametrize("bad", BAD, ids=repr)
async def test_a_bad_timeout_is_a_configuration_error(queue: Queue, bad: Any) -> None:
    @queue.task()
    def never() -> int:  # no worker runs: any wait that starts would time out
        return 1

    handle = await never.enqueue()
    waits = {
        "handle.result": lambda: handle.result(timeout=bad),
        "queue.get_result": lambda: queue.get_result(handle.id, timeout=bad),
        "queue.get_results": lambda: queue.get_results([handle], timeout=bad),
        "queue.get_results (none)": lambda: queue.get_results([], timeout=bad),
        "workflow.get": lambda: WorkflowHandle(queue, "wf-none").get(timeout=bad),
    }
    for name, wait in waits.items():
        with pytest.raises(ConfigurationError, match="timeout must be a"):
            await wait()
        assert name
    with pytest.raises(ConfigurationError, match="timeout must be a"):
        await anext(queue.watch_progress(handle.id, timeout=bad))
    with pytest.raises(ConfigurationError, match="timeout must be a"):
        await queue.run(never, timeout=bad)


def test_the_sync_forms_check_it_too(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()

    @queue.task()
    def never() -> int:
        return 1

    try:
        handle = never.enqueue_sync()
        for bad in (math.nan, -1):
            with pytest.raises(ConfigurationError, match="timeout must be a"):
                handle.result_sync(timeout=bad)
            with pytest.raises(ConfigurationError, match="timeout must be a"):
                queue.get_result_sync(handle.id, timeout=bad)
            with pytest.raises(ConfigurationError, match="timeout must be a"):
                queue.get_results_sync([handle.id], timeout=bad)
            with pytest.raises(ConfigurationError, match="timeout must be a"):
                WorkflowHandle(queue, "wf-none").get_sync(timeout=bad)
    finally:
        queue.close_sync()


async def test_zero_and_a_small_timeout_still_time_out(queue: Queue) -> None:
    @queue.task()
    def never() -> int:
        return 1

    handle = await never.enqueue()
    for good in (0, 0.0, 0.05):
        with pytest.raises(ResultTimeout):
            await handle.result(timeout=good)
        with pytest.raises(ResultTimeout):
            await queue.get_result(handle.id, timeout=good)


def test_wait_cancelled_checks_its_timeout() -> None:
    from blitzq import TaskContext

    context = TaskContext("id", "t", "q", 1, 1, None, {})
    for bad in (math.nan, -1, math.inf, True):
        with pytest.raises(ConfigurationError, match="timeout must be a"):
            context.wait_cancelled(timeout=bad)
    assert context.wait_cancelled(timeout=0) is False
