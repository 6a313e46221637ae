"""Eager start of async tasks: the coroutine's first step runs inline in the worker.

Only a coroutine that actually suspends gets an ``asyncio.Task`` (the same idea as Python
3.12's ``asyncio.eager_task_factory``, done by hand so it also works on 3.11). A task that
completes without suspending costs no task object, no scheduling and no done-callback; the
call and its first step share one ``Context.run`` in the run's own context, and the first step
runs in a driver (:func:`_steps`) that passes a returned value on without the
``StopIteration`` a bare ``coro.send`` raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Generator
from typing import Any, cast

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


#: What a driver (:func:`_steps`) yields when the coroutine it was sent returned: its value
#: is then in the driver's box. Nothing else can yield it (a coroutine run by asyncio yields
#: futures or ``None``).
_DONE: Any = object()


@types.coroutine
def _steps(box: list[Any]) -> Generator[Any, Any, None]:
    """A driver of coroutines: each coroutine sent to it is run (``yield from``) until it
    suspends, its yield passed out as the driver's, or returns: its value is put in
    ``box[0]`` and the driver yields :data:`_DONE`, ready for the next coroutine.

    A coroutine that returns at once so costs no ``StopIteration`` (which ``coro.send``
    raises, about 1,500 instructions of the worker's path per task). A driver whose
    coroutine suspended belongs to that coroutine's task from then on; one whose coroutine
    raised has ended (its send raised): :class:`EagerStart` makes a fresh one for each."""
    coro = yield None
    while True:
        box[0] = yield from coro
        coro = yield _DONE


def _fresh() -> tuple[types.GeneratorType[Any, Any, None], list[Any]]:
    """A new driver (:func:`_steps`), started, and its box."""
    box: list[Any] = [None]
    steps = cast("types.GeneratorType[Any, Any, None]", _steps(box))
    steps.send(None)
    return steps, box


class _Resume:
    """Awaitable that continues a coroutine whose first step already ran, through the
    driver (:func:`_steps`) that ran it, until the driver yields :data:`_DONE`."""

    __slots__ = ("box", "first", "steps")

    def __init__(self, steps: Generator[Any, Any, None], box: list[Any], first: Any) -> None:
        self.steps = steps
        self.box = box
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.steps
        value = self.first
        self.first = None
        try:
            while True:
                try:
                    sent = yield value
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    value = steps.throw(exc)
                else:
                    value = steps.send(sent)
                if value is _DONE:
                    result, self.box[0] = self.box[0], None
                    return result
        finally:
            steps.close()  # the coroutine too, if it is still suspended


async def _continue(steps: Generator[Any, Any, None], box: list[Any], first: Any) -> Any:
    try:
        return await _Resume(steps, box, first)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise TaskExit(exc) from None


def _first_step(
    steps: Generator[Any, Any, None],
    current: TaskContext | Deferred,
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
) -> tuple[Any, BaseException | None]:
    """Inside a run's own context: make ``current`` the current task, call ``fn`` (an error
    of the call itself propagates) and run the coroutine's first step in the driver
    ``steps``: ``(yielded, None)`` (:data:`_DONE` if it returned), ``(None, exc)``."""
    enter_current(current)
    coro = fn(*args, **kwargs)
    try:
        return steps.send(coro), None
    except BaseException as exc:
        return None, exc


class EagerStart:
    """Starts the async runs of one worker eagerly (module docstring), through a driver of
    its own (:func:`_steps`; a worker's runs all start on its event loop's thread)."""

    __slots__ = ("box", "steps")

    def __init__(self) -> None:
        self.steps, self.box = _fresh()

    def start(
        self,
        context: contextvars.Context,
        current: TaskContext | Deferred,
        fn: Any,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> tuple[Any, BaseException | None, asyncio.Task[Any] | None]:
        """Call the async task function ``fn`` and run its first step now, in ``context``
        (one ``Context.run`` for both), with ``current`` as :func:`~blitzq.current_task` (a
        :class:`~blitzq.context.Deferred`: the run, whose context is made when first asked
        for).

        Returns:
            ``(result, None, None)`` if it returned, ``(None, exc, None)`` if it raised, or
            ``(None, None, task)`` with an ``asyncio.Task`` (run in ``context``) that
            continues it if it suspended. The task's exception is a :class:`TaskExit` for
            ``SystemExit``/``KeyboardInterrupt``.

        Raises:
            BaseException: whatever calling ``fn`` raised (a ``TypeError``: arguments that
                do not fit its signature), before any step ran.
        """
        steps, box = self.steps, self.box
        if steps.gi_running:  # a start from inside a first step: that one keeps the driver
            steps, box = _fresh()
            self.steps, self.box = steps, box
        value, error = context.run(_first_step, steps, current, fn, args, kwargs)
        if value is _DONE:
            result, box[0] = box[0], None
            return result, None, None
        if self.steps is steps:
            self.steps, self.box = _fresh()  # this one ended, or goes on with the task
        if error is not None:
            return None, error, None
        loop = asyncio.get_running_loop()
        task = loop.create_task(_continue(steps, box, value), context=context)
        return None, None, task


def unwrap(error: BaseException) -> BaseException:
    """The exception task code raised, from the exception its run's future ended with."""
    return error.error if type(error) is TaskExit else error
