"""The small time series the dashboard charts: each worker adds what it did to 10 s slots.

Every :data:`SLOT` seconds a worker adds to the slot ``{ns}:series:<Unix seconds // SLOT>``
(one pipelined transaction, :meth:`~blitzq.broker.Broker.add_sample`): the tasks it
finished (``done``) and of those the failed ones (``failed``) since its last sample, the
count of each run's wait (enqueued to started) and run time (started to ended) in the
buckets :data:`BOUNDS` (``w<i>`` / ``r<i>``: a histogram, so the workers' samples add up and
percentiles come from their sum), and the depth of each queue it consumes (``q:<queue>``,
messages waiting on all its levels; the last worker to sample sets it). A slot expires
after :data:`KEEP` seconds, so the series holds the last hour at most, whatever the load:
about 40 fields per slot, 360 slots. Nothing runs outside the workers.

Per task the cost is one bucket search per latency (:meth:`Series.observe`); per worker one
round trip every 10 s, and none while it stays idle (nothing counted or running, its queues
empty at its last sample: the depths it would write are 0, which an absent field reads as),
so an idle worker's cost does not grow with its queues.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

from ..exceptions import BrokerError
from ..routing import levels

if TYPE_CHECKING:
    from ..broker import Broker, Completion
    from .execution import Job
    from .recent import EndNotes

    Tap = Callable[..., Completion | None]

__all__ = ["BOUNDS", "KEEP", "SLOT", "Fed", "Sampled", "Series", "start_feeds"]

logger = logging.getLogger("blitzq.worker")

#: Seconds of one slot.
SLOT = 10
#: Seconds a slot is kept.
KEEP = 3600
#: Upper bounds (seconds) of the latency buckets; one more bucket holds what is above.
BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Sampled(Protocol):
    """What the series reads of its worker (a :class:`~blitzq.Worker`)."""

    broker: Broker

    @property
    def queues(self) -> list[str]: ...

    @property
    def processed(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def paused(self) -> set[str]: ...

    @property
    def runner(self) -> _Running: ...


class _Running(Protocol):
    """What the series reads of the worker's runner: the runs going."""

    @property
    def jobs(self) -> Collection[Job]: ...


class Series:
    """One worker's part of the time series (module docstring).

    Args:
        worker: the worker (its counters, queues and broker).
    """

    def __init__(self, worker: Sampled) -> None:
        self.worker = worker
        self._wait = [0] * (len(BOUNDS) + 1)
        self._run = [0] * (len(BOUNDS) + 1)
        self._done = 0
        self._failed = 0
        #: Whether the last sample read every queue empty (see :meth:`sample`).
        self._empty = False

    def observe(self, job: Job) -> None:
        """Count the wait (enqueued to started) and run time (started to now) of ``job``."""
        started = job.started_at
        if not started:
            return
        wait = started - (job.envelope.enqueued_at or started)
        self._wait[bisect.bisect_left(BOUNDS, wait)] += 1
        self._run[bisect.bisect_left(BOUNDS, time.time() - started)] += 1

    def tapping(self, inner: Tap) -> Tap:
        """``inner`` (the last look :class:`~.ending.Ending` takes at each commit, its
        ``tap``) with each run observed first (:meth:`observe`, inlined: once per run)."""
        series, first, search, clock = self, BOUNDS[0], bisect.bisect_left, time.time

        def tap(
            job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
        ) -> Completion | None:
            started = job.started_at
            if started:  # a value under the first bound needs no search
                wait = started - (job.envelope.enqueued_at or started)
                series._wait[0 if wait < first else search(BOUNDS, wait)] += 1
                ran = clock() - started
                series._run[0 if ran < first else search(BOUNDS, ran)] += 1
            return inner(job, completion, error, cancelled)

        return tap

    async def sample(self) -> None:
        """Add what was counted since the last sample to the current slot.

        Raises:
            BrokerError: the broker could not be reached (that sample's counts are lost).
        """
        worker = self.worker
        done, failed = worker.processed + worker.failed, worker.failed
        counts = {"done": done - self._done, "failed": failed - self._failed}
        wait, run = self._wait, self._run
        self._done, self._failed = done, failed
        self._wait, self._run = [0] * len(wait), [0] * len(run)
        counts.update({f"w{i}": n for i, n in enumerate(wait) if n})
        counts.update({f"r{i}": n for i, n in enumerate(run) if n})
        names = list(worker.queues)
        physical = [p for q in names for p in levels(q)]
        if self._empty and self._idle(counts, names):
            return  # nothing to add, and the depths read 0 already (an absent field is 0)
        broker = worker.broker
        stats = await broker.queue_stats(physical)
        gauges = {
            f"q:{q}": sum(int(stats.get(p, {}).get("waiting", 0)) for p in levels(q)) for q in names
        }
        self._empty = not any(gauges.values())
        await broker.state.browse.add_sample(int(time.time()) // SLOT, counts, gauges, KEEP)

    async def close(self, timeout: float) -> None:
        """Add the counts of the current slot at the worker's shutdown (at most ``timeout``
        seconds; a broker error or a timeout loses them, as the loop's would). Nothing it
        raises ends the shutdown: a broker error is logged at DEBUG (the connection's loss
        was logged where it was noticed), any other error at WARNING with its traceback."""
        try:
            await asyncio.wait_for(self.sample(), timeout)
        except (BrokerError, TimeoutError) as exc:
            logger.debug("series: could not add the last sample: %s", exc)
        except Exception:  # a bug: logged, but the worker still stops cleanly
            logger.warning("series: the last sample failed", exc_info=True)

    def _idle(self, counts: dict[str, int], names: list[str]) -> bool:
        """Whether the worker did nothing since its last sample: nothing counted, nothing
        running, none of its queues paused (a paused queue may fill while nobody fetches).
        Its queues were empty at that sample, and a message arriving since would have been
        fetched and run (then counted, or running): their depths are still 0."""
        worker = self.worker
        if any(counts.values()) or worker.paused.intersection(names):
            return False
        return not worker.runner.jobs

    async def loop(self) -> None:
        """Sample every :data:`SLOT` seconds until cancelled (a broker error is logged at
        DEBUG; the counts wait for the next sample)."""
        while True:
            await asyncio.sleep(SLOT - time.time() % SLOT + 0.05)
            try:
                await self.sample()
            except BrokerError as exc:
                logger.debug("series: could not sample: %s", exc)


class _Tapped(Protocol):
    tap: Tap


class Fed(Protocol):
    """What :func:`start_feeds` sets up of the worker's runner."""

    @property
    def notes(self) -> EndNotes | None: ...

    @property
    def ending(self) -> _Tapped: ...


def start_feeds(worker: Sampled, runner: Fed) -> tuple[Series, list[asyncio.Task[None]]]:
    """Start what feeds the dashboard: the writes of the ended-task notes (:mod:`.recent`,
    when the Queue keeps ``recent_index``) and this worker's part of the time series.

    Returns:
        The worker's :class:`Series` and the loops started (cancelled at its shutdown).
    """
    loops = []
    if runner.notes is not None:  # notes are written once a second from now on
        runner.notes.broker = worker.broker
        loops.append(asyncio.create_task(runner.notes.loop(), name="blitzq-recent"))
    series = Series(worker)
    runner.ending.tap = series.tapping(runner.ending.tap)
    loops.append(asyncio.create_task(series.loop(), name="blitzq-series"))
    return series, loops
