"""Noticing that this worker's event loop did not run for a while.

The maintenance loop renews the leases of running tasks every third of the visibility
timeout. :class:`StallWatch` sleeps beside it in short steps; when a step overshoots by half
the visibility timeout or more, nothing of this worker ran meanwhile: the renewals stopped,
so other workers may recover and run its tasks again (a user-style test: a thread task doing
``sum(range(2 * 10**8))``, 15 s holding the GIL, ran five times with
``visibility_timeout=6`` and was dead-lettered as "probably crashed").
:class:`StallWatch` says so once per stall, with the usual causes and the remedy, in the
terms of the worker's transport (:data:`RECOVERY`): Redis streams recover a lapsed lease;
RabbitMQ redelivers the unacked messages of a connection whose AMQP heartbeats stopped
(a third of the visibility timeout each, so after about the visibility timeout); fast mode's
lists recover nothing (a popped task is at most once), so there the stall only delayed the
worker's own upkeep (timeouts, cancellations, its registration). The threshold is the same
in every mode: the maintenance interval and the registration's lifetime follow the
visibility timeout in fast mode too. A sleep is measured on the monotonic and the boot clock
(:func:`~blitzq.stall_clock.host_clocks`), so a suspended host counts as a stall too;
:attr:`StallWatch.noticed_at` tells the maintenance loop when the last one was noticed (it
then judges no other worker for a round, :mod:`~blitzq.worker.peers`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Literal

from ..stall_clock import host_clocks

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["RECOVERY", "StallWatch"]

logger = logging.getLogger("blitzq.worker")

#: How the worker's running tasks are taken back when it stops answering: ``"leases"``
#: (Redis streams: other workers claim a lease not renewed within the visibility timeout),
#: ``"heartbeats"`` (RabbitMQ closes the connection and redelivers), ``"none"`` (fast mode).
RECOVERY = ("leases", "heartbeats", "none")

_CAUSES = (
    "A thread task holding the GIL (a long call into C code, such as sum() over a huge "
    "range), blocking code in an async def task, or a paused process (SIGSTOP, a VM pause) "
    "does this: run CPU-bound work in the CPU pool (@queue.task(executor='cpu'))"
)

_WHAT = {
    "leases": "its lease renewals stopped, so after visibility_timeout ({vt} s) other workers "
    "may have recovered its running tasks and run them again",
    "heartbeats": "it sent no AMQP heartbeats, so after about visibility_timeout ({vt} s; "
    "the heartbeat is a third of it unless the URL sets ?heartbeat=) RabbitMQ may have "
    "closed its connection and redelivered its running tasks to other workers, which run "
    "them again",
    "none": "in fast mode nothing recovers its running tasks (popped: at most once) and no "
    "other worker runs them, but its own upkeep waited: task timeouts, cancellations and "
    "the renewal of its registration (past its lifetime, about visibility_timeout ({vt} s) "
    "+ 5 s, other workers report it lost until it registers again)",
}


class StallWatch:
    """Sleep in short steps beside the maintenance loop and compare each sleep with what
    it asked for (:meth:`run`, :meth:`woke`).

    Args:
        visibility_timeout: the worker's visibility timeout (seconds).
        recovery: how the worker's transport takes back the tasks of a worker that stopped
            answering, one of :data:`RECOVERY` (it sets what the warning says).
    """

    def __init__(
        self,
        visibility_timeout: float,
        recovery: Literal["leases", "heartbeats", "none"] = "leases",
    ) -> None:
        self.visibility_timeout = visibility_timeout
        self.recovery = recovery
        #: Stalls noticed (sleeps late by half the visibility timeout or more).
        self.stalls = 0
        #: ``time.monotonic()`` when the last stall was noticed (-inf: none yet).
        self.noticed_at = -math.inf
        #: Seconds of each sleep of :meth:`run`.
        self.step = max(0.05, min(1.0, visibility_timeout / 4))
        #: ``time.monotonic()`` of the last wake of :meth:`run` (or of its start, or of
        #: this watch's making): one far older than :attr:`step` means the loop stalled
        #: and the watch has not had its turn yet to say so.
        self.ticked_at = time.monotonic()

    @classmethod
    def of(cls, visibility_timeout: float, broker: Broker) -> StallWatch:
        """The watch of a worker with ``visibility_timeout`` (seconds) on ``broker``: its
        recovery read from its transport (none without recovery: fast mode; heartbeats when
        the server takes back a silent connection's deliveries: RabbitMQ; else leases)."""
        if not broker.supports_recovery:
            return cls(visibility_timeout, "none")
        silent = broker.transport.recovers_on_silence
        return cls(visibility_timeout, "heartbeats" if silent else "leases")

    async def run(self) -> None:
        """Sleep in steps (at most a second, a quarter of the visibility timeout) and note
        each one (:meth:`woke`), until cancelled: a step that overshot means nothing of this
        worker ran meanwhile, whatever it was waiting on."""
        step = self.step
        clocks = host_clocks()
        self.ticked_at = time.monotonic()
        while True:
            asleep = [clock() for clock in clocks]
            await asyncio.sleep(step)
            self.ticked_at = time.monotonic()
            self.woke(step, max(clock() - at for clock, at in zip(clocks, asleep, strict=True)))

    def message(self, slept: float) -> str:
        """The warning of a stall of ``slept`` seconds, in the terms of :attr:`recovery`."""
        what = _WHAT[self.recovery].format(vt=self.visibility_timeout)
        remedy = "" if self.recovery == "none" else ", or raise visibility_timeout"
        return f"this worker's event loop did not run for {slept:.1f} s: {what}. {_CAUSES}{remedy}"

    def woke(self, asked: float, slept: float) -> bool:
        """Note a sleep of ``asked`` seconds that lasted ``slept``; whether it was a stall
        (then logged at WARNING)."""
        late = slept - asked
        if late < max(0.5, self.visibility_timeout / 2):
            return False
        self.stalls += 1
        self.noticed_at = time.monotonic()
        logger.warning("%s", self.message(slept))
        return True
