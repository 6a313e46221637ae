"""The worker's progress writer: coalesces each running task's updates and writes them.

Tasks report with ``current_task().update_progress(...)`` (see :mod:`blitzq.progress` for the
stored form and the reads). Writes are coalesced per task to at most about 20 per second
(``MIN_INTERVAL``): the first update is written at once, later ones within 50 ms only as the
newest value when that window ends. When the run ends, its newest update is added to the run's
completion (one atomic write), marked final when the run is, so a watcher sees it before (or
together with) the end of the task; each write carries its time and the broker keeps the
newest, so an older write still in flight never overwrites a newer one. Each write is fenced by
the run's lease: a worker that lost it writes nothing.

From a thread task the update is handed to the worker's event loop
(``loop.call_soon_threadsafe``); the calling thread never waits for Redis. Tasks that never
report cost nothing: :meth:`ProgressReporter.finish` is called only while ``active`` is not
empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..broker import Completion
from ..broker.effects import Progress
from ..exceptions import BrokerError
from ..log_episodes import Episode
from ..progress import decode_progress, encode_progress

if TYPE_CHECKING:
    from ..broker import Broker
    from .execution import Job

logger = logging.getLogger("blitzq.progress")

#: Seconds between two progress writes of one task (about 20 writes per second at most).
MIN_INTERVAL = 0.05


class _State:
    __slots__ = ("at", "data", "fence", "last_write", "timer")

    def __init__(self) -> None:
        self.data = b""
        self.at = 0.0
        self.last_write = -math.inf
        self.timer: asyncio.TimerHandle | None = None
        #: ``(queue, token)`` of the run's delivery, looked up at the first write.
        self.fence: tuple[str, bytes] | None = None


class ProgressReporter:
    """One worker's progress writer: coalesces updates per task and writes them.

    Made on the worker's event loop; :meth:`report` may be called from any thread.

    Args:
        broker: the worker's broker.
        ttl: seconds a progress entry lives (the queue's ``result_ttl``).
        lease_of: maps a running task's id to its delivery ``(queue, token)``, or ``None``;
            each write is fenced by it (a worker that lost the lease writes nothing).
    """

    def __init__(
        self,
        broker: Broker,
        ttl: int,
        lease_of: Callable[[str], tuple[str, bytes] | None] | None = None,
    ) -> None:
        self.broker = broker
        self.ttl = ttl
        self._lease_of = lease_of
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        #: Tasks that reported during their current run, by id (empty on the hot path).
        self.active: dict[str, _State] = {}
        self._inbox: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()
        self._writes: set[asyncio.Task[None]] = set()
        #: Failed writes while the broker is in trouble: one line, not one per task's write.
        self.failures = Episode(logger, "could not store the progress of tasks", settle=30.0)

    def report(
        self, task_id: str, current: float, total: float | None, message: str | None
    ) -> None:
        """Record an update of ``task_id`` (any thread); it is written soon, coalesced."""
        at = time.time()
        data = encode_progress(current, total, message, at)
        if threading.get_ident() == self._thread:
            self._update(task_id, data, at)
            return
        with self._lock:
            first = not self._inbox
            self._inbox[task_id] = (data, at)
        if first:
            # A closed loop (the worker stopped): nobody is left to write it.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, {}
        for task_id, (data, at) in inbox.items():
            self._update(task_id, data, at)

    def _update(self, task_id: str, data: bytes, at: float) -> None:
        state = self.active.get(task_id)
        if state is None:
            state = self.active[task_id] = _State()
        if at < state.at:
            return
        state.data, state.at = data, at
        if state.timer is not None:
            return  # the pending write will take the newest value
        wait = state.last_write + MIN_INTERVAL - time.monotonic()
        if wait <= 0:
            self._write(task_id, state)
        else:
            state.timer = self._loop.call_later(wait, self._flush, task_id)

    def _flush(self, task_id: str) -> None:
        state = self.active.get(task_id)
        if state is not None:
            state.timer = None
            self._write(task_id, state)

    def _write(self, task_id: str, state: _State) -> None:
        state.last_write = time.monotonic()
        task = self._loop.create_task(self._set(task_id, state.data, state.at, state))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _set(self, task_id: str, data: bytes, at: float, state: _State) -> None:
        if state.fence is None and self._lease_of is not None:
            state.fence = self._lease_of(task_id)
        try:
            await self.broker.set_progress(task_id, data, at, self.ttl, state.fence)
            self.failures.cleared()
        except BrokerError as exc:
            self.failures.failed(f"task {task_id}: {exc}")
        except Exception:
            logger.exception("could not store progress of task %s", task_id)

    def finish(self, job: Job, completion: Completion | None) -> Completion | None:
        """Called with a run's completion: add its newest update to it (one atomic write)
        and stop following the task. Returns the completion to write."""
        task_id = job.envelope.id
        with self._lock:
            pending = self._inbox.pop(task_id, None)
        if pending is not None:
            self._update(task_id, *pending)
        state = self.active.pop(task_id, None)
        job.reporter = None  # later updates (an abandoned thread) are ignored
        if job.context is not None:
            job.context._reporter = None
        if state is None:
            return completion
        if state.timer is not None:
            state.timer.cancel()
        d = job.delivery
        if completion is None:
            completion = Completion(d.queue, d.token, task_id)
        final = completion.reschedule is None and completion.requeue is None
        data = state.data
        if final:
            progress, _ = decode_progress(data)
            data = encode_progress(
                progress.current, progress.total, progress.message, state.at, True
            )
        completion.ops = (*completion.ops, Progress(task_id, state.at, data, self.ttl))
        return completion

    async def close(self) -> None:
        """Wait for writes in flight."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


__all__ = ["MIN_INTERVAL", "ProgressReporter"]
