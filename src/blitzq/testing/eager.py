"""The eager test mode: every Queue of the process runs what it enqueues, in-process.

While :func:`eager` is active (the ``blitzq_eager`` pytest fixture), each
:class:`~blitzq.Queue` of the process -- made before or inside it, used from async or sync
code -- publishes to the in-process memory backend (``memory://``: this process's private
Valkey, no TCP, nothing on disk; never the embedded server of ``./.blitzq``), a namespace of
its own per activation. After each enqueue (``enqueue``, ``enqueue_many``, ``send``,
``apply``, ``retry`` of a dead letter) the enqueued messages run on the caller's event loop
through the worker's own path for one delivery (:class:`~blitzq.testing.inline.InlineWorker`:
middleware, start checks, ``Depends()`` resources, executors, timeouts, retry decisions,
completions), so ``enqueue()`` returns once the task has run and ``handle.result()`` /
``handle.result_sync()`` answer at once. Messages are encoded and decoded exactly as in
production: an argument that cannot be serialized fails at the enqueue here too.

Delays, ``eta`` and retry backoffs run in virtual time: not waited for, as long as one drain
skips at most ``horizon`` seconds (600 by default) of waiting in all; a task due later stays
on the schedule. A task that failed for good makes ``result()`` raise the exception the task
raised (``propagate=True``, the default), or :class:`~blitzq.TaskFailed` as in production
(``propagate=False``).

What it does not do: a Queue given a ready ``broker=`` keeps it. An enqueue made while the
Queue's namespace is being drained (a task enqueuing another) returns at once: the running
drain takes the new message.

Source: Celery's ``task_always_eager`` with ``task_eager_propagates``, dramatiq's
``StubBroker`` and taskiq's ``InMemoryBroker``; blitzq runs the worker's code instead of a
second code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
import weakref
from collections.abc import Iterator

from .._checks import flag, integer, seconds
from ..client import testmode
from ..queue import Queue
from .inline import InlineWorker

#: Seconds of schedule waits (delays, retry backoffs) one drain may skip by default: ten
#: minutes, which holds every retry of a task with the default retry policy and up to nine
#: retries (each backoff is capped at 300 s, the sum of nine at 511 s).
DEFAULT_HORIZON = 600.0


class EagerMode:
    """The active eager mode (what :func:`eager` yields; the ``blitzq_eager`` fixture).

    Args:
        horizon: seconds of schedule waits one drain may skip (see :func:`eager`).
        concurrency: tasks running at once per Queue.
        timeout: seconds one drain may take.
        propagate: ``result()`` of a failed task raises the task's own exception (``True``)
            or :class:`~blitzq.TaskFailed` (``False``); may be changed while active.

    Attributes:
        id: this activation's id (part of each memory namespace).
        failures: the exception of each task that failed for good, by task id.
    """

    def __init__(
        self, horizon: float, concurrency: int, timeout: float, propagate: bool = True
    ) -> None:
        self.id = uuid.uuid4().hex[:10]
        self.horizon = horizon
        self.concurrency = concurrency
        self.timeout = timeout
        self.propagate = propagate
        self.failures: dict[str, BaseException] = {}
        self._draining: dict[str, InlineWorker] = {}
        self._lock = threading.Lock()
        self._workers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[int, InlineWorker]
        ] = weakref.WeakKeyDictionary()  # per loop, by id(queue)
        self.queues: weakref.WeakSet[Queue] = weakref.WeakSet()
        #: The memory names this activation used (their keys are deleted at its end).
        self.names: set[str] = set()

    def url(self, queue: Queue) -> str:
        """The memory URL of ``queue`` while active (one namespace per Queue namespace)."""
        name = f"eager-{self.id}.{queue.namespace}"
        self.queues.add(queue)
        self.names.add(name)
        return "memory://" + name

    def failure(self, task_id: str) -> BaseException | None:
        """The exception task ``task_id`` failed with, when this mode propagates errors."""
        return self.failures.get(task_id) if self.propagate else None

    def _worker(self, queue: Queue) -> InlineWorker:
        """The inline worker of ``queue``'s namespace on the running loop (made on first
        use; made again when the Queue's broker of this loop changed)."""
        loop = asyncio.get_running_loop()
        workers = self._workers.get(loop)
        if workers is None:
            workers = self._workers[loop] = {}
        key = id(queue)
        worker = workers.get(key)
        if worker is None or worker.queue is not queue or worker.broker is not queue.broker:
            if worker is not None:
                worker.close()
            worker = workers[key] = InlineWorker(queue, self.concurrency, self.failures)
        return worker

    async def run_enqueued(self, queue: Queue) -> None:
        """Run what ``queue`` enqueued, in this loop, until nothing is left (or, while a
        drain of that namespace is running, tell it and return at once: it takes the
        message).

        Raises:
            TimeoutError: not drained within ``timeout`` seconds.
        """
        key = queue.namespace
        with self._lock:
            running = self._draining.get(key)
            if running is None:
                worker = self._draining[key] = self._worker(queue)
        if running is not None:
            running.poke()
            return
        try:
            await worker.drain(self.horizon, self.timeout)
        finally:
            with self._lock:
                self._draining.pop(key, None)

    def cancelled(self, queue: Queue, task_id: str) -> None:
        """``task_id`` of ``queue``'s namespace was cancelled: tell the inline workers of
        that namespace (a running task is cancelled, a waiting one skipped)."""
        with self._lock:
            workers = [
                w
                for per_loop in self._workers.values()
                for w in per_loop.values()
                if w.queue.namespace == queue.namespace
            ]
        for worker in workers:
            worker.revoke(task_id)

    def close(self) -> None:
        """Stop the inline workers' thread and process pools."""
        with self._lock:
            workers = [w for per_loop in self._workers.values() for w in per_loop.values()]
            self._workers = weakref.WeakKeyDictionary()
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.close()


@contextlib.contextmanager
def eager(
    *,
    horizon: float = DEFAULT_HORIZON,
    concurrency: int = 10,
    timeout: float = 60.0,
    propagate: bool = True,
) -> Iterator[EagerMode]:
    """Turn the eager mode on for the ``with`` block (module docstring).

    Args:
        horizon: seconds of waiting on the schedule (delays, ``eta``, retry backoffs) one
            drain may skip, in all; what is due later stays scheduled. 0 skips nothing.
        concurrency: tasks of one Queue running at once.
        timeout: seconds one drain may take before the enqueue raises ``TimeoutError``.
        propagate: ``result()`` (and a workflow's ``get()``) of a task that failed raises
            the task's own exception (``True``), or :class:`~blitzq.TaskFailed` as in
            production (``False``).

    Raises:
        RuntimeError: the eager mode is already on (they do not nest).
        ConfigurationError: an option of the wrong type or out of range.
    """
    horizon = seconds("horizon", horizon, strict=False)
    integer("concurrency", concurrency, minimum=1)
    timeout = seconds("timeout", timeout)
    flag("propagate", propagate)
    if testmode.forced_url is not None:
        raise RuntimeError("blitzq's eager mode is already on")
    mode = EagerMode(float(horizon), concurrency, float(timeout), propagate)
    testmode.switch(mode.url, mode.run_enqueued, mode.failure, mode.cancelled)
    try:
        yield mode
    finally:
        for queue in list(mode.queues):  # the sync API's connections of this mode
            with contextlib.suppress(Exception):
                queue.close_sync()
        testmode.switch(None, None)
        mode.close()
        _forget(mode.names)


def _forget(names: set[str]) -> None:
    """Delete the keys of the memory namespaces ``names`` (an activation's) from this
    process's private Valkey, so that test after test does not fill it."""
    if not names:
        return
    import redis

    from ..broker.redis.ephemeral import ensure_server, memory_namespace

    client = redis.Redis.from_url(ensure_server())
    try:
        for name in names:
            doomed = list(client.scan_iter(match="{" + memory_namespace(name) + "}*", count=1000))
            for start in range(0, len(doomed), 500):
                client.unlink(*doomed[start : start + 500])
    finally:
        client.close()
