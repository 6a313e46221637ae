"""Noticing that this worker's event loop did not run for a while.

The maintenance loop renews the leases of running tasks every third of the visibility
timeout. :class:`StallWatch` sleeps beside it in short steps; when a step overshoots by half
the visibility timeout or more, nothing of this worker ran meanwhile: the renewals stopped,
so other workers may recover and run its tasks again (a user-style test: a thread task doing
``sum(range(2 * 10**8))``, 15 s holding the GIL, ran five times with
``visibility_timeout=6`` and was dead-lettered as "probably crashed").
:class:`StallWatch` says so once per stall, with the usual causes and the remedy.
"""

from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["StallWatch"]

logger = logging.getLogger("blitzq.worker")


class StallWatch:
    """Sleep in short steps beside the maintenance loop and compare each sleep with what
    it asked for (:meth:`run`, :meth:`woke`).

    Args:
        visibility_timeout: the worker's visibility timeout (seconds).
    """

    def __init__(self, visibility_timeout: float) -> None:
        self.visibility_timeout = visibility_timeout
        #: Stalls noticed (sleeps late by half the visibility timeout or more).
        self.stalls = 0

    async def run(self) -> None:
        """Sleep in steps (at most a second, a quarter of the visibility timeout) and note
        each one (:meth:`woke`), until cancelled: a step that overshot means nothing of this
        worker ran meanwhile, whatever it was waiting on."""
        step = max(0.05, min(1.0, self.visibility_timeout / 4))
        while True:
            asleep = time.monotonic()
            await asyncio.sleep(step)
            self.woke(step, time.monotonic() - asleep)

    def woke(self, asked: float, slept: float) -> bool:
        """Note a sleep of ``asked`` seconds that lasted ``slept``; whether it was a stall
        (then logged at WARNING)."""
        late = slept - asked
        if late < max(0.5, self.visibility_timeout / 2):
            return False
        self.stalls += 1
        logger.warning(
            "this worker's event loop did not run for %.1f s: its lease renewals stopped, so "
            "after visibility_timeout (%s s) other workers may have recovered its running "
            "tasks and run them again. A thread task holding the GIL (a long call into C "
            "code, such as sum() over a huge range), blocking code in an async def task, or "
            "a paused process (SIGSTOP, a VM pause) does this: run CPU-bound work in the "
            "CPU pool (@queue.task(executor='cpu')), or raise visibility_timeout",
            slept,
            self.visibility_timeout,
        )
        return True
