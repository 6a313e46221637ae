"""Burst mode (``Worker(burst=True)``, ``blitzq worker --burst``): drain the queues, then stop.

A burst worker runs like any other and, next to its fetch loops, watches for the moment its
work is done. It stops (gracefully, exit code 0 from the CLI) once all of these hold at once:

* nothing runs in the worker and no start is pending (start checks, cancel confirmations);
* every completion is written (the flusher is idle);
* no scheduled message is due by the broker's clock, nor due within :data:`BURST_HORIZON`
  seconds (short waits: rate-limit tokens, lock waits, quick retries); ones due later stay
  scheduled for the next worker;
* the worker's physical queues (but those of a paused queue: ``blitzq queue pause``) hold
  no waiting and no in-flight message (in reliable mode
  that includes messages another worker holds: a burst worker waits for them too, since a
  lost lease would come back to the queue);
* every fetch that was in a fetch command when the queues were read has returned empty
  since (a fast-mode pop leaves the list before the worker sees the message).

With ``burst_idle_timeout`` (``blitzq worker --burst --burst-idle-timeout SECONDS``) the worker
stops only once these have held for that many seconds in a row: work enqueued in the meantime
is run, and the count starts again after it. Work enqueued after the worker stopped is left
for the next one. Scheduled messages due
later than the horizon (delays, long retry backoffs, unknown tasks deferred during a rolling
deploy) are not waited for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from ..exceptions import BrokerError
from ..routing import base_queue

if TYPE_CHECKING:
    from collections.abc import Collection

    from ..broker import Broker
    from .fetch import Fetcher
    from .flusher import Flusher

logger = logging.getLogger("blitzq.worker")

#: Scheduled messages due within this many seconds count as work a burst worker waits for.
BURST_HORIZON = 2.0

#: Seconds between two idleness checks of a burst worker.
CHECK_INTERVAL = 0.1


class _Idle(Protocol):
    @property
    def idle(self) -> bool: ...


class Draining(Protocol):
    """What burst mode sees of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def id(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def runner(self) -> _Idle: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def physical_queues(self) -> list[str]: ...

    @property
    def paused(self) -> Collection[str]: ...

    @property
    def block_timeout(self) -> float: ...

    @property
    def burst_idle_timeout(self) -> float: ...

    idle_since: float | None

    def stop(self) -> None: ...


async def drain(worker: Draining, fetcher: Fetcher, flusher: Flusher) -> None:
    """Stop ``worker`` (:meth:`~blitzq.worker.Worker.stop`) once its queues are drained.

    Call it as a task next to the fetch loops of a running worker (``fetcher``: its fetch
    loops, ``flusher``: its completion writer); it returns when the worker stops for any
    reason. With the worker's ``burst_idle_timeout`` (seconds) it stops once the queues have
    stayed drained that long in a row (:attr:`Worker.idle_since
    <blitzq.worker.Worker.idle_since>` is when they last became so). A broker error only
    delays the check (logged, tried again).
    """
    loop = asyncio.get_running_loop()
    while not worker.stopping:
        await asyncio.sleep(CHECK_INTERVAL)
        try:
            drained = await settled(worker, fetcher, flusher)
        except BrokerError as exc:
            logger.warning("burst check failed, trying again: %s", exc)
            continue
        if not drained:
            worker.idle_since = None
            continue
        if worker.idle_since is None:
            worker.idle_since = loop.time()
        if loop.time() - worker.idle_since >= worker.burst_idle_timeout:
            logger.info("worker %s drained its queues (burst): stopping", worker.id)
            worker.stop()
            return


async def settled(
    worker: Draining, fetcher: Fetcher, flusher: Flusher, horizon: float = BURST_HORIZON
) -> bool:
    """Whether the running ``worker`` (its ``fetcher`` and ``flusher``) has nothing left to
    do (the conditions of the module docstring, with scheduled messages due within
    ``horizon`` seconds counted as work); due scheduled messages are promoted on the way.
    :meth:`blitzq.Worker.settled` asks it for :mod:`blitzq.testing`.

    Raises:
        BrokerError: the broker could not be reached.
    """
    runner = worker.runner
    if not runner.idle:
        return False
    seen = fetcher.delivered
    await flusher.flush()
    moved, next_eta, now = await worker.broker.promote_due(1000)
    if moved or (next_eta is not None and next_eta - now <= horizon):
        return False
    # A paused queue (`blitzq queue pause`) is not waited for: nothing will take its messages.
    physical = [p for p in worker.physical_queues if base_queue(p) not in worker.paused]
    stats = await worker.broker.queue_stats(physical) if physical else {}
    if any(counts.get("waiting") or counts.get("in_flight") for counts in stats.values()):
        return False
    # A fetch inside its command when the queues were read may hold what they no longer show.
    fetching = fetcher.in_fetch()
    for _ in range(int((worker.block_timeout + 5.0) / 0.01)):  # a fetch returns by then
        if worker.stopping or all(fetcher.done[q] > n for q, n in fetching.items()):
            break
        await asyncio.sleep(0.01)
    else:
        return False
    return fetcher.delivered == seen and runner.idle and flusher.backlog == 0
