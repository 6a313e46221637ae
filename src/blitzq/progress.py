"""Progress of running tasks: reported by the task, read or followed by anyone.

Inside a task (async or thread executor)::

    current_task().update_progress(3, 10, "resizing images")

Elsewhere::

    progress = await queue.get_progress(task_id)      # latest Progress, or None
    async for p in queue.watch_progress(task_id):     # pushed updates until the task ends
        print(p.current, p.total, p.message)

Storage: the latest update of a task is kept in ``{ns}:p:<id>`` for the queue's
``result_ttl`` and published on a pub/sub channel. The worker writes it
(:class:`blitzq.worker.progress.ProgressReporter`): coalesced per task to at most about 20
writes per second, and the run's newest update atomically with the run's completion, so a
watcher sees it before (or together with) the end of the task, and an older write still in
flight can never overwrite a newer one (each write carries its time and the broker keeps the
newest). Process tasks (``executor="process"``) have no task context and cannot report
progress.

This module holds the :class:`Progress` type, the stored form (:func:`encode_progress`,
:func:`decode_progress`) and the Queue's reads (``get_progress``, ``watch_progress``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .client.sync import Portal, blocking
from .exceptions import ConfigurationError, ResultTimeout, SerializationError
from .records import TaskRecord
from .serialization import dumps, loads

if TYPE_CHECKING:
    from .broker import Broker

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
    "MAX_MESSAGE",
    "Progress",
    "ProgressOperations",
    "decode_progress",
    "encode_progress",
]
