"""Where task code runs: coroutines on the loop, threads, or a process pool.

Async tasks start *eagerly*: the coroutine's first step runs inline in the worker, and only a
coroutine that actually suspends gets an ``asyncio.Task`` (the same idea as Python 3.12's
``asyncio.eager_task_factory``, done by hand so it also works on 3.11). A task that completes
without suspending costs no task object, no scheduling and no done-callback.

Isolation: every run gets a :class:`contextvars.Context` of its own (the runner passes a copy
of the worker's base context), so a context variable a task sets is never seen by the next
one; a pool process runs each call in a fresh copy of its own base context. Whatever task
code raises ends as that run's exception: ``SystemExit`` and ``KeyboardInterrupt``, which
asyncio would re-raise out of the event loop (ending the worker), travel wrapped in
:class:`TaskExit`; an exception a pool process cannot send back (it does not pickle, or not
back) arrives as a :class:`RemoteError` describing it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib
import multiprocessing
import os
import pickle
import sys
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from ..exceptions import SerializationError, describe_error
from .execution import format_traceback

_PENDING: Any = object()

#: Types of return values sent back from a pool process without checking they unpickle.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, list, dict, tuple})


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


class RemoteError(Exception):
    """Stands for an exception a pool process raised but could not send back as it is
    (it cannot be pickled, or not unpickled).

    The record shows the original's type name and message.

    Args:
        error_type: qualified type name of the original exception.
        message: its message.
        traceback: its formatted traceback in the pool process.
    """

    def __init__(self, error_type: str, message: str, traceback: str = "") -> None:
        super().__init__(error_type, message, traceback)
        self.error_type = error_type
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


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


def start_eagerly(
    coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> tuple[Any, BaseException | None, asyncio.Task[Any] | None]:
    """Run ``coro``'s first step now, in ``context``.

    Args:
        coro: the task's coroutine, not started.
        context: the run's own context; the first step and the ``asyncio.Task`` that
            continues the coroutine both run in it.

    Returns:
        ``(result, None, None)`` if it returned, ``(None, exc, None)`` if it raised, or
        ``(None, None, task)`` with an ``asyncio.Task`` that continues it if it suspended.
        The task's exception is a :class:`TaskExit` for ``SystemExit``/``KeyboardInterrupt``.
    """
    try:
        first = context.run(coro.send, None)
    except StopIteration as stop:
        return stop.value, None, None
    except BaseException as exc:
        return None, exc, None
    task = asyncio.get_running_loop().create_task(_continue(coro, first), context=context)
    return None, None, task


def unwrap(error: BaseException) -> BaseException:
    """The exception task code raised, from the exception its run's future ended with."""
    return error.error if type(error) is TaskExit else error


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` itself when it survives the trip back from a pool process, else a
    :class:`RemoteError` describing it (only ever called on a failure)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except BaseException:  # any failure to cross: describe it instead
        pass
    else:
        return exc
    error_type, message = describe_error(exc)
    return RemoteError(error_type, message, format_traceback(exc))


def _run_by_reference(module: str, attribute: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Entry point inside a pool process: import the task object and call its function."""
    if module == "__main__" and "__mp_main__" in sys.modules:
        module = "__mp_main__"
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    fn = getattr(target, "fn", target)
    try:
        # A fresh copy of this process's base context per call: nothing one call sets in a
        # context variable is seen by the next call this process runs.
        result = contextvars.copy_context().run(fn, *args, **kwargs)
    except BaseException as exc:
        sendable = _sendable(exc)
        if sendable is exc:
            raise
        raise sendable from None
    if type(result) not in _PLAIN:
        # A value that pickles but does not unpickle would break the whole pool in the
        # worker (every call in it fails): check the trip here, where it costs one call.
        try:
            pickle.loads(pickle.dumps(result))
        except BaseException as exc:
            error_type, message = describe_error(exc)
            raise SerializationError(
                f"the return value ({type(result).__qualname__}) cannot be sent back from "
                f"the pool process: {error_type}: {message}"
            ) from None
    return result


class ProcessPool:
    """A lazily started process pool (spawned processes, so no forked locks or threads).

    Args:
        size: number of processes.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def submit(
        self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a pool process; the function must be importable.

        A pool found broken (a process died, or a result could not be read back) is replaced
        by a new one, so one bad run never stops every later process task.
        """
        pool = self._pool
        if pool is not None and getattr(pool, "_broken", False):
            self.shutdown(kill=True)
        if self._pool is None:
            from ..supervisor import die_with_parent

            # Pool processes die with this worker, even when it is SIGKILLed (Linux).
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
        future = self._pool.submit(_run_by_reference, fn.__module__, fn.__qualname__, args, kwargs)
        return asyncio.wrap_future(future)

    def shutdown(self, kill: bool = False) -> None:
        """Stop the pool; ``kill=True`` terminates running processes at once."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=not kill, cancel_futures=True)
