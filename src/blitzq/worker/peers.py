"""A worker's judgement of the other workers of its namespace, and its pause before judging.

Each maintenance round, a worker removes the registrations of workers that stopped renewing
them (:func:`reap_lapsed`, emitting ``WORKER_HEARTBEAT_LOST``) and, in reliable mode, recovers
the deliveries whose leases were not renewed within the visibility timeout
(:func:`~blitzq.worker.queue_steps.recover_queue`). Both judge the silence of others. When this
worker itself did not run for a while (:class:`PeerGrace`: its maintenance sleep came back
late, measured on the monotonic and boot clocks, :mod:`~blitzq.stall_clock`), the
others most likely did not run either: the whole host was frozen (a VM pause, a suspend, a
``SIGSTOP`` of the process tree). Their registrations and leases look lapsed, yet they are
healthy and renew within their next round. So the round right after such a pause renews this
worker's own registration and leases but judges no one; the next round, one maintenance
interval later, judges as usual, after every live peer had a round of its own to renew.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import BlitzQError
from ..extensions.signals import Signal, SignalEvent
from ..serialization import loads
from ..stall_clock import StallClock

if TYPE_CHECKING:
    from ..broker import Broker
    from ..extensions.signals import Signals
    from .stalls import StallWatch

__all__ = ["PeerGrace", "reap_lapsed"]

logger = logging.getLogger("blitzq.worker")


def _registration(raw: bytes) -> dict[str, Any]:
    """The fields of a worker's registration record (empty when it cannot be read)."""
    try:
        info = loads(raw) if raw else {}
    except BlitzQError:
        return {}
    return info if isinstance(info, dict) else {}


async def reap_lapsed(broker: Broker, worker_id: str, signals: Signals) -> None:
    """Remove the registrations of workers whose heartbeat (their registration's renewal)
    lapsed; emit ``WORKER_HEARTBEAT_LOST`` on ``signals`` for each one this worker (id
    ``worker_id``) took (each is taken by one live worker of the namespace only).

    Raises:
        BrokerError: the broker could not be reached.
    """
    lapsed = await broker.lapsed_workers()
    if not lapsed:
        return
    logger.warning(
        "worker(s) %s stopped renewing their registration (heartbeat lost)",
        ", ".join(sorted(lapsed)),
    )
    if not signals.has(Signal.WORKER_HEARTBEAT_LOST):
        return
    for lost_id, raw in sorted(lapsed.items()):
        info = _registration(raw)
        # The worker's id (host:pid-slot under the supervisor) and its registry key.
        lost = info.get("id") if isinstance(info.get("id"), str) else lost_id
        extra: dict[str, Any] = {"lost_worker": lost, "lost_key": lost_id}
        for key in ("instance", "host", "pid", "queues", "heartbeat_at", "running_tasks"):
            if key in info:
                extra[key] = info[key]
        event = SignalEvent(Signal.WORKER_HEARTBEAT_LOST, worker=worker_id, extra=extra)
        # Never awaited here: a slow handler must not hold up the renewal of leases.
        signals.emit_soon(Signal.WORKER_HEARTBEAT_LOST, event)


class PeerGrace:
    """Whether this maintenance round may judge other workers (see the module docstring).

    Three signs of a pause of this worker count: the maintenance sleep came back late by the
    slack or more (:meth:`sleeping`, :meth:`woke`); the loop's stall watch
    (:class:`~blitzq.worker.stalls.StallWatch`) noticed a stall within the last maintenance
    interval; or the watch's last turn is older than its step plus the slack, i.e. the loop
    just stalled and the watch has not had its turn yet (a pause in the middle of a round,
    whose judgements would otherwise come first).

    Args:
        visibility_timeout: the worker's visibility timeout (seconds, > 0). A maintenance
            sleep that comes back a quarter of it late (at least 0.25 s) counts as a pause:
            a whole-host pause shorter than that leaves every peer's last renewal (each
            comes every third of it) younger than the visibility timeout.
        interval: seconds between maintenance rounds (the grace after a pause).
        watch: the event loop's stall watch, when one runs.
        clock: the stall clock (default: one on the host's clocks with that slack).
    """

    def __init__(
        self,
        visibility_timeout: float,
        interval: float,
        watch: StallWatch | None = None,
        clock: StallClock | None = None,
    ) -> None:
        self.clock = clock or StallClock(max(0.25, visibility_timeout / 4))
        self.interval = interval
        self.watch = watch
        #: ``time.monotonic()`` when the last pause of this worker was noticed here.
        self.paused_at = -math.inf

    def sleeping(self, seconds: float) -> None:
        """The maintenance loop is about to sleep ``seconds``."""
        self.clock.expect(seconds)

    def woke(self) -> None:
        """The maintenance sleep ended: note a pause when it came back late (logged at INFO
        with what the next round leaves out)."""
        paused = self.clock.stalled()
        if not paused:
            return
        self.paused_at = time.monotonic()
        logger.info(
            "this worker did not run for %.1f s more than it slept (paused, perhaps with its "
            "whole host): this round renews its own registration and leases but neither "
            "recovers other workers' tasks nor reports their registrations lapsed; the next "
            "round does, once workers paused with it have renewed theirs",
            paused,
        )

    def may_judge(self) -> bool:
        """Whether other workers may be judged now: not within one interval after a pause
        of this worker noticed by :meth:`woke` or by the stall watch, nor while the watch
        is behind (a round asks before each judgement)."""
        now = time.monotonic()
        watch = self.watch
        if watch is None:
            return now - self.paused_at >= self.interval
        if now - watch.ticked_at >= watch.step + self.clock.slack:
            return False
        return now - max(self.paused_at, watch.noticed_at) >= self.interval
