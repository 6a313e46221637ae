"""The eager test mode: every Queue of the process runs what it enqueues, in-process.

While :func:`eager` is active (the ``blitzq_eager`` pytest fixture), each
:class:`~blitzq.Queue` of the process -- made before or inside it, used from async or sync
code -- publishes to the in-process memory backend (``memory://``: this process's private
Valkey, no TCP, nothing on disk; never the embedded server of ``./.blitzq``), a namespace of
its own per activation. After each enqueue (``enqueue``, ``enqueue_many``, ``send``,
``apply``, ``retry`` of a dead letter) a real :class:`~blitzq.Worker` runs on the caller's
event loop until the Queue's queues are drained (:func:`blitzq.testing.harness.drain`), so
``enqueue()`` returns once the task has run and ``handle.result()`` /
``handle.result_sync()`` answer at once. Messages are encoded and decoded exactly as in
production: an argument that cannot be serialized fails here too.

What it does not do: a task delayed beyond the horizon (5 s by default) stays on the
schedule; a Queue given a ready ``broker=`` keeps it. An enqueue made while the Queue is
already being drained (a task enqueuing another) returns at once: the running drain takes
the new message.

Source: the eager modes of Celery (``task_always_eager``) and the stub brokers of dramatiq
and taskiq, with the real worker instead of a second code path.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import Iterator

from ..client import testmode
from ..queue import Queue
from .harness import WorkerHarness


class EagerMode:
    """The active eager mode (what :func:`eager` yields).

    Args:
        horizon: seconds; scheduled tasks due within it run before an enqueue returns.
        concurrency: the drain worker's concurrency.
        timeout: seconds one drain may take at most.

    Attributes:
        id: this activation's id (part of each memory namespace).
    """

    def __init__(self, horizon: float, concurrency: int, timeout: float) -> None:
        self.id = uuid.uuid4().hex[:10]
        self.horizon = horizon
        self.concurrency = concurrency
        self.timeout = timeout
        self._draining: set[str] = set()
        self._lock = threading.Lock()
        self.queues: weakref.WeakSet[Queue] = weakref.WeakSet()
        #: The memory names this activation used (their keys are deleted at its end).
        self.names: set[str] = set()

    def url(self, queue: Queue) -> str:
        """The memory URL of ``queue`` while active (one namespace per Queue namespace)."""
        name = f"eager-{self.id}.{queue.namespace}"
        self.queues.add(queue)
        self.names.add(name)
        return "memory://" + name

    async def run_enqueued(self, queue: Queue) -> None:
        """Run a worker on ``queue`` in this loop until its queues are drained (or return at
        once when a drain of that namespace is already running: it takes the message).

        Raises:
            TimeoutError: not drained within ``timeout`` seconds.
        """
        key = queue.namespace
        with self._lock:
            if key in self._draining:
                return
            self._draining.add(key)
        try:
            async with WorkerHarness(
                queue, horizon=self.horizon, concurrency=self.concurrency, handle_signals=False
            ) as harness:
                await harness.drain(self.timeout)
        finally:
            with self._lock:
                self._draining.discard(key)


@contextlib.contextmanager
def eager(
    *, horizon: float = 5.0, concurrency: int = 10, timeout: float = 60.0
) -> Iterator[EagerMode]:
    """Turn the eager mode on for the ``with`` block (module docstring).

    Args:
        horizon: seconds; tasks scheduled within it (a retry's backoff, a short delay) run
            before the enqueue returns.
        concurrency: concurrency of the worker that runs the tasks.
        timeout: seconds one drain may take before the enqueue raises ``TimeoutError``.

    Raises:
        RuntimeError: the eager mode is already on (they do not nest).
    """
    if testmode.forced_url is not None:
        raise RuntimeError("blitzq's eager mode is already on")
    mode = EagerMode(horizon, concurrency, timeout)
    testmode.switch(mode.url, mode.run_enqueued)
    try:
        yield mode
    finally:
        for queue in list(mode.queues):  # the sync API's connections of this mode
            with contextlib.suppress(Exception):
                queue.close_sync()
        testmode.switch(None, None)
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
