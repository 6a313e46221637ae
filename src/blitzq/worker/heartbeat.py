"""The heartbeat a supervised worker's event loop writes and its supervisor reads.

The supervisor gives every worker the write end of a pipe (its descriptor number and the
beat interval in ``BLITZQ_HEARTBEAT``, ``"FD,SECONDS"``); the worker's event loop writes one
byte to it every interval (:func:`beat`). The supervisor reads the other end and replaces a
worker whose beats stop for ``--heartbeat-timeout`` seconds: a process stopped (SIGSTOP) or
an event loop blocked by synchronous code in an ``async def`` task beats no more, although
the process is alive. The channel is a local pipe, not the broker, so it works while Redis
is down (a worker waiting for its broker keeps beating).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping

__all__ = ["HEARTBEAT_ENV", "beat", "heartbeat_channel", "start_beating"]

logger = logging.getLogger("blitzq.worker")

#: Environment variable naming the heartbeat pipe: ``"FD,SECONDS"`` (descriptor, interval).
HEARTBEAT_ENV = "BLITZQ_HEARTBEAT"


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
