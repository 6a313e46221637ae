"""Where task code runs: coroutines on the loop, threads, or a process pool.

Async tasks start *eagerly*: the coroutine's first step runs inline in the worker, and only a
coroutine that actually suspends gets an ``asyncio.Task`` (the same idea as Python 3.12's
``asyncio.eager_task_factory``, done by hand so it also works on 3.11). A task that completes
without suspending costs no task object, no scheduling and no done-callback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Coroutine, Generator
from typing import Any

_PENDING: Any = object()


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
    return await _Resume(coro, first)


def start_eagerly(
    coro: Coroutine[Any, Any, Any],
) -> tuple[Any, BaseException | None, asyncio.Task[Any] | None]:
    """Run ``coro``'s first step now.

    Returns:
        ``(result, None, None)`` if it returned, ``(None, exc, None)`` if it raised, or
        ``(None, None, task)`` with an ``asyncio.Task`` that continues it if it suspended.
    """
    try:
        first = coro.send(None)
    except StopIteration as stop:
        return stop.value, None, None
    except BaseException as exc:
        return None, exc, None
    return None, None, asyncio.get_running_loop().create_task(_continue(coro, first))


def _run_by_reference(module: str, attribute: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Entry point inside a pool process: import the task object and call its function."""
    if module == "__main__" and "__mp_main__" in sys.modules:
        module = "__mp_main__"
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    fn = getattr(target, "fn", target)
    return fn(*args, **kwargs)


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
        """Run ``fn(*args, **kwargs)`` in a pool process; the function must be importable."""
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
