"""Run a real :class:`~blitzq.Worker` in a test and wait until its queues are drained.

:class:`WorkerHarness` is what the ``blitzq_worker`` pytest fixture hands out; :func:`drain`
waits until the worker's queues are drained. (The eager mode, :mod:`blitzq.testing.eager`,
runs no Worker: see :mod:`blitzq.testing.inline`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from ..queue import Queue
from ..worker import Worker

#: Seconds between two looks at the queues while draining.
POLL = 0.01


async def drain(worker: Worker, *, horizon: float = 5.0, timeout: float = 60.0) -> None:
    """Wait until ``worker`` (running in this loop) has nothing left to do.

    Done when none of its queues holds a waiting or unacknowledged message, it runs and
    starts nothing and has written every completion, no fetch holds a message, and nothing
    on the schedule (a retry's backoff, a delay) is due within ``horizon`` seconds -- twice
    in a row (the checks of burst mode, :meth:`blitzq.Worker.settled`).

    Args:
        worker: a running worker (``WorkerHarness.worker``, or one started by hand).
        horizon: scheduled tasks due within this many seconds (float) are waited for; later
            ones are left on the schedule.
        timeout: seconds (float) to wait at most.

    Raises:
        TimeoutError: still busy after ``timeout`` seconds (a task that never ends, or a
            schedule that keeps refilling).
        RuntimeError: the worker is not running.
    """
    deadline = time.monotonic() + timeout
    calm = 0
    while calm < 2:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker's queues were not drained within {timeout} s")
        calm = calm + 1 if await worker.settled(horizon) else 0
        await asyncio.sleep(POLL)


class WorkerHarness:
    """A :class:`~blitzq.Worker` on ``queue``'s own backend, for the length of an
    ``async with`` block: ``async with WorkerHarness(queue) as w: ...; await w.drain()``.

    Args:
        queue: the Queue to serve.
        horizon: see :func:`drain` (seconds).
        options: :class:`~blitzq.Worker` arguments (``concurrency``, ``queues``, ...);
            ``block_timeout`` defaults to 0.05 s so that the worker stops at once.

    Attributes:
        worker: the running worker (``None`` outside the block).
    """

    def __init__(self, queue: Queue, *, horizon: float = 5.0, **options: Any) -> None:
        options.setdefault("block_timeout", 0.05)
        self.queue = queue
        self.horizon = horizon
        self.options = options
        self.worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WorkerHarness:
        worker = self.worker = Worker(self.queue, **self.options)
        self._task = asyncio.create_task(worker.run())
        await _started(worker, self._task)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        worker, task = self.worker, self._task
        self.worker = self._task = None
        if worker is None or task is None:
            return
        worker.stop()
        await asyncio.wait_for(task, worker.shutdown_timeout + 10)

    async def drain(self, timeout: float = 60.0) -> None:
        """Wait until the worker has run everything waiting (see :func:`drain`).

        Raises:
            TimeoutError: not drained within ``timeout`` seconds.
            RuntimeError: called outside the ``async with`` block.
        """
        if self.worker is None:
            raise RuntimeError("drain() is for inside `async with WorkerHarness(...)`")
        await drain(self.worker, horizon=self.horizon, timeout=timeout)


async def _started(worker: Worker, task: asyncio.Task[None], timeout: float = 30.0) -> None:
    """Wait until ``worker`` runs (its runner exists), or re-raise why its task ended."""
    deadline = time.monotonic() + timeout
    while True:
        if task.done():
            task.result()  # raises why it stopped
            raise RuntimeError("the worker stopped before it started")
        with contextlib.suppress(RuntimeError):
            worker.runner  # noqa: B018 - raises RuntimeError until the worker runs
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not start within {timeout} s")
        await asyncio.sleep(POLL)
