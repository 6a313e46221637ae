"""The sync API: one private event loop per Queue in a daemon thread, and :func:`blocking`,
which makes each ``*_sync`` twin from its async method.

``*_sync`` methods submit their coroutine to the :class:`Portal`'s loop and block the calling
thread for the answer, so plain scripts and threaded web apps use the same async code
underneath. The loop has its own broker connections (brokers are made per event loop). Calling
a ``*_sync`` method from a thread that is running an event loop raises ``RuntimeError`` instead
of blocking that loop. After ``fork()`` the child starts a fresh loop and thread on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="HasPortal")


class Portal:
    """A background event loop that runs coroutines for synchronous callers.

    Args:
        name: the name of its daemon thread.
        closer: makes the coroutine that closes what runs on the loop (the Queue's
            ``close``), run at interpreter exit if the loop still runs then
            (:func:`_close_at_exit`).
    """

    def __init__(
        self,
        name: str = "blitzq-sync",
        closer: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._name = name
        self.closer = closer
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's thread does not exist here
                self._loop, self._thread, self._pid = None, None, os.getpid()
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                thread = threading.Thread(target=run, name=self._name, daemon=True)
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
                _open_portals.add(self)
            return self._loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The background loop (started on first use)."""
        return self._ensure_loop()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the background loop and return its result.

        Raises:
            RuntimeError: called from a thread whose event loop is running (use the async API).
            Whatever ``coro`` raises.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "a *_sync method was called from a running event loop; "
                "await the async method instead"
            )
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:  # pragma: no cover - defensive
            coro.close()
            raise RuntimeError("*_sync called from the blitzq background loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def close(
        self, cleanup: Coroutine[Any, Any, None] | None = None, timeout: float = 10.0
    ) -> None:
        """Run ``cleanup`` on the loop (if given), then stop the loop and its thread; each
        step waits at most ``timeout`` seconds.

        Raises:
            TimeoutError: ``cleanup`` did not end within ``timeout`` seconds.
            Whatever ``cleanup`` raises.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        _open_portals.discard(self)
        if loop is None or thread is None or self._pid != os.getpid():
            if cleanup is not None:
                cleanup.close()
            return
        if cleanup is not None and thread.is_alive():
            asyncio.run_coroutine_threadsafe(cleanup, loop).result(timeout=timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=timeout)
        if not thread.is_alive():
            loop.close()


async def _wind_down(closer: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
    """End what runs on this loop, within :data:`EXIT_GRACE` seconds: ``closer()`` first
    (the Queue's close: its connections end as they would by ``close_sync()``), then every
    task still there, given a moment to end by itself (a connection's own closing tasks),
    then cancelled; again while closing them makes more."""
    loop = asyncio.get_running_loop()
    end = loop.time() + EXIT_GRACE
    if closer is not None:
        with contextlib.suppress(Exception):  # exiting anyway: the tasks are ended below
            await asyncio.wait_for(closer(), EXIT_GRACE / 2)
    current = asyncio.current_task()
    while True:
        pending = {task for task in asyncio.all_tasks() if task is not current}
        if not pending or loop.time() >= end:
            return
        _, pending = await asyncio.wait(pending, timeout=min(0.1, end - loop.time()))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, end - loop.time()))


#: Seconds a Portal's loop gets to end what runs on it at interpreter exit
#: (:func:`_close_at_exit`).
EXIT_GRACE = 2.0

#: The Portals whose loop runs (a Portal closed, or collected, leaves it).
_open_portals: weakref.WeakSet[Portal] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """At interpreter exit, close what runs on every open Portal's loop (its Queue's
    connections, :func:`_wind_down`) and stop it: a task left waiting (a result listener's
    read of a Queue nobody closed) would otherwise be collected pending with the
    application's globals and print "Task was destroyed but it is pending!"."""
    for portal in list(_open_portals):
        with contextlib.suppress(Exception):  # exiting anyway: the rest still get their turn
            portal.close(_wind_down(portal.closer), timeout=EXIT_GRACE + 1.0)


class HasPortal(Protocol):
    """What a ``*_sync`` twin runs on: an object with the :class:`Portal` of its Queue (a
    Queue, or a task, bound task or handle that belongs to one)."""

    @property
    def _portal(self) -> Portal: ...


def blocking(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], T]:
    """The blocking twin of the async method ``method``: ``x_sync = blocking(x)`` in a class body.

    The twin takes the same arguments (checked by the type checker through ``P``; the runtime
    signature, shown by :func:`inspect.signature` and help(), is ``method``'s through
    ``__wrapped__``), makes ``method``'s coroutine and runs it on ``self._portal``: the calling
    thread blocks until it ends. Its name is ``method``'s with ``_sync`` appended; its
    docstring refers to ``method``.

    Args:
        method: an ``async def`` method of a class whose instances have a ``_portal``.

    Returns:
        A plain (not async) function, to be assigned in the same class body.

    The twin raises what ``method`` raises, and ``RuntimeError`` when it is called from a
    thread whose event loop is running (await ``method`` there instead).
    """

    def twin(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._portal.call(method(self, *args, **kwargs))

    name = method.__name__
    twin.__module__ = method.__module__
    twin.__name__ = f"{name}_sync"
    twin.__qualname__ = f"{method.__qualname__}_sync"
    twin.__doc__ = (
        f"Blocking :meth:`{name}` for code without an event loop: same arguments, result "
        "and errors, and ``RuntimeError`` when called from a running event loop."
    )
    twin.__annotations__ = dict(method.__annotations__)
    # inspect.signature (and help) show ``method``'s parameters; iscoroutinefunction does not
    # follow ``__wrapped__``, so the twin stays a plain function.
    twin.__wrapped__ = method  # type: ignore[attr-defined]
    return twin


__all__ = ["HasPortal", "Portal", "blocking"]
