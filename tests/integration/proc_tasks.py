"""Importable helpers of the integration tests.

The module-level functions run in ``executor="process"`` tasks: a spawned pool process imports
them by module and qualified name, so they must live at module level in an importable module.
``running``, ``worker_thread`` and ``eventually`` are shared by the integration test modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from blitzq import Queue, Worker

T = TypeVar("T")


def square(x: int) -> int:
    """Return ``x * x`` (runs in a pool process)."""
    return x * x


def process_id() -> int:
    """Return the pid of the process running the call."""
    return os.getpid()


def fail_in_process(message: str) -> None:
    """Raise ``ValueError(message)`` inside a pool process."""
    raise ValueError(message)


def no_retry_in_process(reason: str) -> None:
    """Raise ``NoRetry(reason)`` inside a pool process."""
    from blitzq import NoRetry

    raise NoRetry(reason)


def retry_once_in_process(path: str, delay: float) -> int:
    """Append a line to ``path``; on the first call raise ``Retry(delay=delay)``, after it
    return how many calls there were (runs in a pool process)."""
    from blitzq import Retry

    with open(path, "a") as f:
        f.write("call\n")
    with open(path) as f:
        calls = len(f.readlines())
    if calls == 1:
        raise Retry(delay=delay, reason="first call")
    return calls


def sleep_with_pid_file(path: str, seconds: float) -> None:
    """Write this pool process's pid to ``path``, then sleep ``seconds`` (a cancellable task)."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)


def make_worker(queue: Queue, **options: Any) -> Worker:
    """A Worker for tests: short blocking fetches so that a stop takes little time.

    Args:
        queue: the Queue to serve.
        options: Worker arguments (``block_timeout`` defaults to 0.2 s here).
    """
    options.setdefault("block_timeout", 0.2)
    return Worker(queue, **options)


@contextlib.contextmanager
def worker_thread(queue: Queue, **options: Any) -> Iterator[Worker]:
    """Run a Worker (:func:`make_worker` with ``options``) for ``queue`` in a thread with its
    own event loop, for the ``*_sync`` API; stop it, then close the queue, on exit."""
    worker = make_worker(queue, **options)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run(),), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(15)
        assert not thread.is_alive()
        loop.run_until_complete(queue.close())
        loop.close()


@contextlib.asynccontextmanager
async def running(worker: Worker, stop_timeout: float = 30.0) -> AsyncIterator[Worker]:
    """Run ``worker`` in a task of the current loop; stop it gracefully on exit.

    Raises:
        TimeoutError: the worker did not stop within ``stop_timeout`` seconds.
    """
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_timeout)


async def eventually(
    probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], timeout: float = 60.0
) -> T:
    """Poll ``probe`` every 20 ms until ``accept`` holds for its value.

    Raises:
        AssertionError: the condition did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            last = repr(value)[:500]
            raise AssertionError(f"condition not reached within {timeout} s; last: {last}")
        await asyncio.sleep(0.02)
