"""Progress of running tasks: reported by the task, read or followed by anyone.

Inside a task (async or thread executor)::

    current_task().update_progress(3, 10, "resizing images")

Elsewhere::

    progress = await queue.get_progress(task_id)      # latest Progress, or None
    async for p in queue.watch_progress(task_id):     # pushed updates until the task ends
        print(p.current, p.total, p.message)

Storage: the latest update of a task is kept in ``{ns}:p:<id>`` for the queue's
``result_ttl`` and published on a pub/sub channel. Writes are coalesced per task to at most
about 20 per second: the first update is written at once, later ones within 50 ms only as
the newest value when that window ends. When the run ends, its newest update is written
atomically with the run's completion, so a watcher sees it before (or together with) the end
of the task, and an older write still in flight can never overwrite a newer one (each write
carries its time and the broker keeps the newest).

From a thread task the update is handed to the worker's event loop
(``loop.call_soon_threadsafe``); the calling thread never waits for Redis. Process tasks
(``executor="process"``) have no task context and cannot report progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .client.sync import Portal, blocking
from .exceptions import BrokerError, ConfigurationError, ResultTimeout, SerializationError
from .records import TaskRecord
from .serialization import dumps, loads

if TYPE_CHECKING:
    from .broker.base import Broker, Completion
    from .worker.execution import Job

logger = logging.getLogger("blitzq.progress")

#: Seconds between two progress writes of one task (about 20 writes per second at most).
MIN_INTERVAL = 0.05
#: Longest progress message kept, in characters.
MAX_MESSAGE = 1000


@dataclass(frozen=True, slots=True)
class Progress:
    """A task's latest progress report.

    Attributes:
        current: work done so far (any unit the task chose).
        total: work in all, or ``None`` when unknown.
        message: a short text, or ``None``.
        updated_at: Unix time (seconds) the task reported it.
    """

    current: float
    total: float | None
    message: str | None
    updated_at: float

    @property
    def fraction(self) -> float | None:
        """``current / total`` (``None`` when ``total`` is unknown or 0)."""
        if not self.total:
            return None
        return self.current / self.total


def encode_progress(
    current: float, total: float | None, message: str | None, at: float, final: bool = False
) -> bytes:
    """The stored form of one update (``final``: written with the run's last completion).

    Raises:
        ConfigurationError: ``current``/``total`` are not finite numbers, or ``message`` is
            not a string.
    """
    if (
        isinstance(current, bool)
        or not isinstance(current, int | float)
        or not math.isfinite(current)
    ):
        raise ConfigurationError(f"progress current must be a finite number, got {current!r}")
    if total is not None and (
        isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total)
    ):
        raise ConfigurationError(f"progress total must be a finite number or None, got {total!r}")
    if message is not None:
        if not isinstance(message, str):
            raise ConfigurationError(f"progress message must be a str, got {message!r}")
        message = message[:MAX_MESSAGE]
    return dumps([current, total, message, at, final])


def decode_progress(data: bytes) -> tuple[Progress, bool]:
    """``(progress, final)`` from the stored form.

    Raises:
        SerializationError: the bytes are not a progress update.
    """
    raw = loads(data)
    if not isinstance(raw, list) or len(raw) < 4:
        raise SerializationError("progress is not a list")
    final = bool(raw[4]) if len(raw) > 4 else False
    return Progress(raw[0], raw[1], raw[2], float(raw[3])), final


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
        except BrokerError as exc:
            logger.warning("could not store progress of task %s: %s", task_id, exc)
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
        if job.context is not None:
            job.context._reporter = None  # later updates (an abandoned thread) are ignored
        if state is None:
            return completion
        if state.timer is not None:
            state.timer.cancel()
        from .broker.base import Completion

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
        completion.ops = (*completion.ops, ("progress", task_id, repr(state.at), data, self.ttl))
        return completion

    async def close(self) -> None:
        """Wait for writes in flight."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


class ProgressOperations:
    """Mixin of :class:`~blitzq.Queue`: reading and following progress."""

    _portal: Portal

    @property
    def broker(self) -> Broker:  # provided by Queue
        raise NotImplementedError

    async def get_progress(self, task_id: str) -> Progress | None:
        """The latest progress a task reported, or ``None`` (none reported, or expired).

        Raises:
            BrokerError: the broker could not be reached.
        """
        data = await self.broker.get_progress(task_id)
        if data is None:
            return None
        return decode_progress(data)[0]

    get_progress_sync = blocking(get_progress)

    async def watch_progress(
        self, task_id: str, timeout: float | None = None
    ) -> AsyncIterator[Progress]:
        """Yield a task's progress updates as they are pushed, until the task ends.

        The latest stored update (if any) comes first; then each update published (pub/sub,
        not polling; with a re-read every second as a fallback should the connection drop).
        Updates coalesced by the worker are not all seen, but the newest always is. The
        iterator ends when the task reaches a final state (succeeded, failed,
        dead-lettered, cancelled), after yielding the update written with its end.

        A task that writes no record when it succeeds (``store_result=False`` without
        ``track_state``) and never reports progress gives no sign of its end: pass a
        ``timeout``.

        Args:
            task_id: the task's id.
            timeout: seconds to follow at most; ``None`` for no limit.

        Raises:
            ResultTimeout: the task did not end within ``timeout`` seconds.
            BrokerError: the broker could not be reached.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_at = -math.inf
        events = self.broker.watch_progress(task_id)
        try:
            while True:
                if deadline is None:
                    kind, data = await anext(events)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ResultTimeout(f"task {task_id} did not end within {timeout} s")
                    try:
                        kind, data = await asyncio.wait_for(anext(events), left)
                    except TimeoutError:
                        raise ResultTimeout(
                            f"task {task_id} did not end within {timeout} s"
                        ) from None
                if kind == "progress":
                    try:
                        progress, final = decode_progress(data)
                    except SerializationError:
                        continue
                    if progress.updated_at > last_at:
                        last_at = progress.updated_at
                        yield progress
                    if final:
                        return
                elif kind == "record":
                    try:
                        record = TaskRecord.from_bytes(data)
                    except SerializationError:
                        continue
                    if record.state.is_final:
                        # The run's last update is written with its completion: read it now.
                        latest = await self.get_progress(task_id)
                        if latest is not None and latest.updated_at > last_at:
                            yield latest
                        return
        finally:
            await events.aclose()


__all__ = [
    "MIN_INTERVAL",
    "Progress",
    "ProgressOperations",
    "ProgressReporter",
    "decode_progress",
    "encode_progress",
]
