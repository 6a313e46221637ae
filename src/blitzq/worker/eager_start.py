"""Eager start of async tasks: the coroutine's first step runs inline in the worker.

Only a coroutine that actually suspends gets an ``asyncio.Task`` (the same idea as Python
3.12's ``asyncio.eager_task_factory``, done by hand so it also works on 3.11). A task that
completes without suspending costs no task object, no scheduling and no done-callback; the
call and its first step share one ``Context.run`` in the run's own context.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any

from ..context import Deferred, TaskContext, enter_current


class TaskExit(Exception):
    """Carries a ``SystemExit`` or ``KeyboardInterrupt`` raised by an async task after its
    first step out of the ``asyncio.Task`` running it (asyncio re-raises those two out of
    the event loop, which would end the worker). The runner unwraps it.

    Args:
        error: the exception the task raised.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _Resume:
    """Awaitable that continues a coroutine whose first step already ran."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.coro
        value = self.first
        self.first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _continue(coro: Coroutine[Any, Any, Any], first: Any) -> Any:
    try:
        return await _Resume(coro, first)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise TaskExit(exc) from None


def _first_step(
    current: TaskContext | Deferred, fn: Any, args: list[Any], kwargs: dict[str, Any]
) -> tuple[Coroutine[Any, Any, Any] | None, Any, BaseException | None]:
    """Inside a run's own context: make ``current`` the current task, call ``fn`` (an error
    of the call itself propagates) and run the coroutine's first step: ``(coro, yielded,
    None)`` if it suspended, ``(None, result, None)`` if it returned, ``(None, None, exc)``."""
    enter_current(current)
    coro = fn(*args, **kwargs)
    try:
        return coro, coro.send(None), None
    except StopIteration as stop:
        return None, stop.value, None
    except BaseException as exc:
        return None, None, exc


def start_eagerly(
    context: contextvars.Context,
    current: TaskContext | Deferred,
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
) -> tuple[Any, BaseException | None, asyncio.Task[Any] | None]:
    """Call the async task function ``fn`` and run its first step now, in ``context`` (one
    ``Context.run`` for both), with ``current`` as :func:`~blitzq.current_task` (a
    :class:`~blitzq.context.Deferred`: the run, whose context is made when first asked for).

    Returns:
        ``(result, None, None)`` if it returned, ``(None, exc, None)`` if it raised, or
        ``(None, None, task)`` with an ``asyncio.Task`` (run in ``context``) that continues
        it if it suspended. The task's exception is a :class:`TaskExit` for
        ``SystemExit``/``KeyboardInterrupt``.

    Raises:
        BaseException: whatever calling ``fn`` raised (a ``TypeError``: arguments that do
            not fit its signature), before any step ran.
    """
    coro, value, error = context.run(_first_step, current, fn, args, kwargs)
    if coro is None:
        return value, error, None
    task = asyncio.get_running_loop().create_task(_continue(coro, value), context=context)
    return None, None, task


def unwrap(error: BaseException) -> BaseException:
    """The exception task code raised, from the exception its run's future ended with."""
    return error.error if type(error) is TaskExit else error
