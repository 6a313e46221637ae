"""The heartbeat a supervised worker's event loop writes and its supervisor reads, and the
mark it writes once it made progress.

The supervisor gives every worker the write end of a pipe (its descriptor number and the
beat interval in ``BLITZQ_HEARTBEAT``, ``"FD,SECONDS"``); the worker's event loop writes one
byte to it every interval (:func:`beat`). The supervisor reads the other end and replaces a
worker whose beats stop for ``--heartbeat-timeout`` seconds: a process stopped (SIGSTOP) or
an event loop blocked by synchronous code in an ``async def`` task beats no more, although
the process is alive. The channel is a local pipe, not the broker, so it works while Redis
is down (a worker waiting for its broker keeps beating).

The *progress mark* is a second pipe (its descriptor in ``BLITZQ_PROGRESS``): the worker
writes one byte to it once the completion of its first run (returned, raised, timed out or
cancelled) was applied by the broker (:func:`progress_mark`). A supervisor does not count the
death of a worker that made progress against its restart budget
(:class:`~blitzq.worker.restarts.RestartBudget`): the budget stops crash loops, a worker that
cannot start or cannot get one task done, not a worker that a task killed now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping

__all__ = [
    "HEARTBEAT_ENV",
    "PROGRESS_ENV",
    "beat",
    "heartbeat_channel",
    "progress_mark",
    "start_beating",
]

logger = logging.getLogger("blitzq.worker")

#: Environment variable naming the heartbeat pipe: ``"FD,SECONDS"`` (descriptor, interval).
HEARTBEAT_ENV = "BLITZQ_HEARTBEAT"
#: Environment variable naming the progress pipe's descriptor (:func:`progress_mark`).
PROGRESS_ENV = "BLITZQ_PROGRESS"


def heartbeat_channel(env: Mapping[str, str] | None = None) -> tuple[int, float] | None:
    """The ``(descriptor, interval in seconds)`` of ``BLITZQ_HEARTBEAT`` in ``env`` (default:
    this process's environment), or ``None`` when unset or malformed (not supervised)."""
    raw = (os.environ if env is None else env).get(HEARTBEAT_ENV, "")
    fd, _, interval = raw.partition(",")
    try:
        channel = int(fd), float(interval)
    except ValueError:
        return None
    return channel if channel[0] >= 0 and channel[1] > 0 else None


async def beat(fd: int, interval: float) -> None:
    """Write one byte to ``fd`` every ``interval`` seconds until cancelled.

    A full pipe (the supervisor is behind) skips a beat; a pipe whose reader is gone (the
    supervisor exited) ends the heartbeat. Closes ``fd`` when it ends.
    """
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                os.write(fd, b".")
            except BlockingIOError:
                pass
            except OSError as exc:
                logger.debug("heartbeat pipe closed: %s", exc)
                return
            await asyncio.sleep(interval)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def start_beating() -> asyncio.Task[None] | None:
    """Start :func:`beat` on the running loop when ``BLITZQ_HEARTBEAT`` names a pipe (the
    variable is removed so that processes this worker starts do not inherit it); ``None``
    when this process is not supervised."""
    channel = heartbeat_channel()
    os.environ.pop(HEARTBEAT_ENV, None)
    if channel is None:
        return None
    with contextlib.suppress(OSError):  # programs this worker runs do not hold the pipe
        os.set_inheritable(channel[0], False)
    return asyncio.get_running_loop().create_task(beat(*channel), name="blitzq-heartbeat")


def progress_mark(env: MutableMapping[str, str] | None = None) -> Callable[[], None] | None:
    """The mark a supervised worker writes once it made progress, when ``BLITZQ_PROGRESS`` in
    ``env`` (default: this process's environment) names a pipe; ``None`` when unset or
    malformed (not supervised). The variable is removed from ``env`` so that processes this
    worker starts do not inherit it.

    The mark writes one byte to the pipe and closes it, once (later calls do nothing); it
    never blocks and never raises (a supervisor that is gone is no error).
    """
    environ = os.environ if env is None else env
    raw = environ.pop(PROGRESS_ENV, "")
    try:
        fd = int(raw)
    except ValueError:
        return None
    if fd < 0:
        return None
    with contextlib.suppress(OSError):  # programs this worker runs do not hold the pipe
        os.set_inheritable(fd, False)
    written = False

    def mark() -> None:
        nonlocal written
        if written:
            return
        written = True
        with contextlib.suppress(OSError):
            os.set_blocking(fd, False)
            os.write(fd, b"!")
        with contextlib.suppress(OSError):
            os.close(fd)

    return mark
