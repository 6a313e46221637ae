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
newest). Process and CPU-pool tasks (``executor="process"``, ``"cpu"``) have no task context
and cannot report progress.

This module holds the :class:`Progress` type and the stored form (:func:`encode_progress`,
:func:`decode_progress`); the Queue's reads (``get_progress``, ``watch_progress``) are in
:mod:`blitzq.client.reading`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .exceptions import ConfigurationError, SerializationError
from .serialization import dumps, loads

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


__all__ = [
    "MAX_MESSAGE",
    "Progress",
    "decode_progress",
    "encode_progress",
]
