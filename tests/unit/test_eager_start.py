"""The eager start of async runs (``worker/eager_start.py``): a coroutine that returns at
once is done without a task; one that suspends goes on in a task; errors of the call and of
the body come back apart; a driver used by a suspended or failed run is never reused."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from blitzq.context import TaskContext, current_task
from blitzq.worker.eager_start import EagerStart, TaskExit

_CURRENT = TaskContext("t-1", "unit.task", "q", 1, 1, None, None)


async def returns(x: int) -> int:
    return x * 2


async def suspends(x: int) -> int:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return x + 1


async def fails_at_once() -> None:
    raise ValueError("body")


async def fails_later() -> None:
    await asyncio.sleep(0)
    raise KeyError("later")


async def exits_later() -> None:
    await asyncio.sleep(0)
    raise SystemExit(3)


async def sees_current() -> tuple[Any, Any]:
    first = current_task()
    await asyncio.sleep(0)
    return first, current_task()


def start(eager: EagerStart, fn: Any, *args: Any) -> tuple[Any, Any, Any]:
    return eager.start(contextvars.copy_context(), _CURRENT, fn, list(args), {})


async def test_a_run_that_returns_at_once_needs_no_task() -> None:
    eager = EagerStart()
    driver = eager.steps
    for x in range(3):
        assert start(eager, returns, x) == (x * 2, None, None)
    assert eager.steps is driver  # the same driver serves every run that returns at once
    assert eager.box == [None]  # no result kept past its run


async def test_a_run_that_suspends_goes_on_in_a_task_and_returns_its_value() -> None:
    eager = EagerStart()
    driver = eager.steps
    result, error, task = start(eager, suspends, 41)
    assert (result, error) == (None, None)
    assert task is not None
    assert eager.steps is not driver  # that driver is the task's now
    # Runs started meanwhile are not mixed up with the suspended one.
    assert start(eager, returns, 5) == (10, None, None)
    assert await asyncio.wait_for(task, 5) == 42


async def test_errors_of_the_body_come_back_and_the_next_run_gets_a_fresh_driver() -> None:
    eager = EagerStart()
    driver = eager.steps
    result, error, task = start(eager, fails_at_once)
    assert result is None
    assert task is None
    assert isinstance(error, ValueError)
    assert eager.steps is not driver
    assert start(eager, returns, 1) == (2, None, None)
    _, _, later = start(eager, fails_later)
    with pytest.raises(KeyError):
        await asyncio.wait_for(later, 5)
    _, _, exits = start(eager, exits_later)
    with pytest.raises(TaskExit) as caught:
        await asyncio.wait_for(exits, 5)
    assert isinstance(caught.value.error, SystemExit)


async def test_an_error_of_the_call_itself_is_raised_before_any_step() -> None:
    eager = EagerStart()
    with pytest.raises(TypeError):
        start(eager, returns)  # a missing argument
    assert start(eager, returns, 2) == (4, None, None)


async def test_a_suspended_run_is_cancelled_through_its_driver() -> None:
    eager = EagerStart()
    stopped = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    _, _, task = start(eager, waits)
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert stopped.is_set()


async def test_the_run_sees_its_current_task_before_and_after_a_suspension() -> None:
    eager = EagerStart()
    _, _, task = start(eager, sees_current)
    assert task is not None
    assert await asyncio.wait_for(task, 5) == (_CURRENT, _CURRENT)
    assert current_task() is None  # the worker's own context is untouched


async def test_a_start_from_inside_a_first_step_gets_a_driver_of_its_own() -> None:
    """A first step that starts another run at once (nothing in the worker does, but a
    driver already running cannot be sent to: ``generator already executing``)."""
    eager = EagerStart()
    inner: list[Any] = []

    async def outer() -> int:
        inner.append(start(eager, returns, 20))
        return 1

    assert start(eager, outer) == (1, None, None)
    assert inner == [(40, None, None)]
    assert start(eager, returns, 3) == (6, None, None)  # the runner's driver still serves
