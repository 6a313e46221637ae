"""Background loops of a worker: promoter, event listener, registration, leases, recovery.

- The promoter moves due scheduled messages (delays, retries, rate-limited tasks) to their
  queues. Due times are decided on the broker's clock (Redis ``TIME`` inside the scripts),
  never this worker's: the promoter sleeps the broker-relative remaining seconds until the
  earliest due time, and is woken early when any process schedules an earlier one (a push
  on the namespace's event channel, naming a due time on the broker's clock), so it never
  polls blindly; a 5 s ceiling (and a wake-up each time the listener subscribes again)
  covers a lost push.
- The event listener follows cancellations as they are published and cancels running tasks
  at once; a full resynchronisation every few seconds (and after each reconnection) covers a
  lost push, cancelling running tasks it finds cancelled. A malformed push is logged and
  skipped; any error makes the listener subscribe again.
- Maintenance registers the worker (with its visibility timeout) and, in reliable mode,
  renews the leases of running tasks (and of ended ones not yet written) every
  ``visibility_timeout / 3`` and recovers messages abandoned by dead workers (on the queues
  that hold any message: :meth:`~blitzq.broker.transport.Transport.occupied`), each queue on
  its own (:mod:`.queue_steps`); the leases of a live
  worker with a longer timeout are left alone until idle that long (one read of the live
  timeouts per round, :meth:`~blitzq.broker.Broker.worker_timeouts`), and prunes the consumer
  groups' idle consumers, one stream in turn (:mod:`.pruning`). Between those rounds the
  registration is written again once a second while the worker's counts
  (running, processed, failed) change, so ``queue stats`` and the dashboard are at most about
  a second behind a busy worker; an idle worker writes nothing more.
- The outbox relay (only for a state store paired with a transport it does not ack:
  ``broker.relay``, :mod:`blitzq.broker.outbox`) publishes on the transport what the store
  wrote into queues: woken by this process's own writes, and sweeping every queue's outbox
  and lapsed relay leases every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._checks import integer
from ..broker import Broker
from ..exceptions import BlitzQError, BrokerError, ConfigurationError, describe_error
from ..log_episodes import Episode
from .limiter import Slots
from .pausing import Pausable, Pausing
from .peers import PeerGrace, reap_lapsed
from .pruning import Pruning
from .queue_steps import QueueSteps, recover_queue
from .stalls import StallWatch
from .unknown import Handed, take_handed

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from ..extensions.registry import Extensions
    from ..seams import QueueSettings
    from .admission import Admission
    from .ending import Ending
    from .execution import Job

logger = logging.getLogger("blitzq.worker")

#: Longest the promoter sleeps without a push (seconds): every write to the schedule pushes
#: its due time on the event channel, so this only bounds the lateness after a lost push
#: (the listener also wakes the promoter each time it subscribes again).
PROMOTER_CEILING = 5.0
#: Messages moved per promote call.
PROMOTE_BATCH = 1000
#: Seconds between full re-reads of the cancelled task ids.
REVOCATION_SYNC = 5.0
#: Seconds between registrations while the worker's counts change (between maintenance rounds).
COUNTS_REFRESH = 1.0
#: Seconds the event listener waits before subscribing again after an error (doubling).
EVENT_RETRY_MIN = 0.5
EVENT_RETRY_MAX = 5.0
#: Runs a worker's registration lists at most (``blitzq worker list``).
REGISTERED_RUNS = 20


def running_tasks(jobs: Iterable[Job]) -> list[dict[str, Any]]:
    """What a registration says the worker runs: ``id``, ``task``, ``queue`` and
    ``started_at`` (Unix seconds) of its oldest :data:`REGISTERED_RUNS` runs."""
    runs = sorted(jobs, key=lambda job: job.started_at)[:REGISTERED_RUNS]
    return [
        {
            "id": j.envelope.id,
            "task": j.envelope.task,
            "queue": j.envelope.queue,
            "started_at": j.started_at,
        }
        for j in runs
    ]


def maintenance_interval(visibility_timeout: float) -> float:
    """Seconds between maintenance rounds (lease renewals, recovery checks, the keeping of
    running records): a third of ``visibility_timeout`` (seconds), so two renewals can fail
    before a lease lapses; at most 10 s."""
    return max(0.05, min(visibility_timeout / 3, 10.0))


def keep_margin(visibility_timeout: float) -> int:
    """Seconds of life a ``running`` record (``track_state``) must have left at a
    maintenance round, or that round extends it: three rounds and 5 s."""
    return math.ceil(3 * maintenance_interval(visibility_timeout)) + 5


def running_record_ttl(result_ttl: int, visibility_timeout: float) -> int:
    """TTL (seconds) of a ``running`` record: ``result_ttl``, but at least two
    :func:`keep_margin` s, so the record outlives the rounds that keep it while the run goes
    on (a run longer than ``result_ttl`` keeps its record; docs/guarantees.md)."""
    return max(result_ttl, 2 * keep_margin(visibility_timeout))


class _Cancelling(Protocol):
    @property
    def admission(self) -> Admission: ...

    @property
    def extensions(self) -> Extensions: ...

    @property
    def jobs(self) -> Collection[Job]: ...

    @property
    def result_ttl(self) -> int: ...

    @property
    def track_state(self) -> bool: ...

    revoked: dict[str, float]
    ending: Ending

    def cancel(self, task_id: str) -> bool: ...


class Maintained(Handed, Pausable, Protocol):
    """What the background loops see of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def runner(self) -> _Cancelling: ...

    @property
    def queue(self) -> QueueSettings: ...

    @property
    def queues(self) -> list[str]: ...

    @property
    def processed(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def failure_log_level(self) -> int: ...

    concurrency: int

    def info(self) -> bytes: ...

    def running_tokens(self, queue: str) -> list[bytes]: ...

    def stop(self) -> None: ...


#: The background steps whose transient failures are logged once per episode
#: (:class:`~blitzq.log_episodes.Episode`), and the start of their lines.
_STEPS = {
    "promoter": "promoter",
    "handed": "taking handed messages",
    "register": "maintenance: could not register the worker",
    "lapsed": "maintenance: reading lapsed registrations",
    "records": "maintenance: could not keep running records",
    "round": "maintenance",
    "revocations": "maintenance: reading cancelled tasks",
}


class Maintenance:
    """Runs the worker's background loops.

    Args:
        worker: the owning worker.
        broker: its broker.
        slots: its slots of each base queue name (what it hands over goes through them).
    """

    def __init__(self, worker: Maintained, broker: Broker, slots: Mapping[str, Slots]) -> None:
        self.worker = worker
        self.broker = broker
        self.slots = slots
        vt = worker.queue.visibility_timeout
        #: seconds between lease renewals / recovery checks: a third of the visibility
        #: timeout, so two renewals can fail before a lease lapses.
        self.interval = maintenance_interval(vt)
        self._steps = QueueSteps()  # each queue's renewal and recovery alone (one slot moving)
        #: Running jobs (track_state) and the Unix time their record lives until at least.
        self._kept: dict[Job, float] = {}
        self._wake = asyncio.Event()
        self._handed = asyncio.Event()
        self._next_wake = 0.0
        #: (processed, failed) as the registrations written so far reported them at most.
        self.registered_counts = (0, 0)
        #: Maintenance rounds whose recovery was done (every occupied queue looked at).
        self.recovery_rounds = 0
        #: Pushes on the event channel that were ignored as malformed.
        self.malformed_events = 0
        self._malformed_logged = -math.inf
        #: The paused queues, followed and applied to the transport (``pausing.py``).
        self.pausing = Pausing(worker, broker)
        #: The event loop's stalls, noticed by a sleeper of its own (``stalls.py``).
        self.stalls = StallWatch.of(vt, broker)
        #: No judging of other workers right after a pause of this one (``peers.py``).
        self.peers = PeerGrace(vt, self.interval, self.stalls)
        #: Each background step's transient failures, logged once while they last.
        self.episodes = {step: Episode(logger, what) for step, what in _STEPS.items()}

    def _failed(self, step: str, exc: BrokerError) -> None:
        """A transient failure of ``step``, at DEBUG when its lost connection was logged."""
        self.episodes[step].failed(exc, logging.DEBUG if exc.reported else logging.WARNING)

    async def start(self) -> list[asyncio.Task[None]]:
        """Register the worker and load the cancelled ids, then start the loops; the worker
        cancels them at shutdown. The registration comes before the first fetch, so what a
        worker counts is all in registrations that observers (the dashboard's rates) see."""
        await self._sync_size(earlier=True)
        try:
            await self.register()
        except BrokerError as exc:  # the maintenance loop tries again
            logger.warning("could not register the worker: %s", exc)
        try:
            await self._sync_revocations()
        except Exception as exc:  # the periodic resynchronisation tries again
            logger.warning("could not read cancelled tasks: %s", exc)
        await self.pausing.sync()
        loops = [
            asyncio.create_task(self._promote_loop(), name="blitzq-promoter"),
            asyncio.create_task(self._event_loop(), name="blitzq-events"),
            asyncio.create_task(self._maintain_loop(), name="blitzq-maintenance"),
            asyncio.create_task(self.stalls.run(), name="blitzq-stalls"),
        ]
        if self.broker.supports_recovery:  # messages other workers hand over (unknown.py)
            loops.append(asyncio.create_task(self._handed_loop(), name="blitzq-handed"))
        if self.interval > COUNTS_REFRESH:
            loops.append(asyncio.create_task(self._counts_loop(), name="blitzq-counts"))
        if self.broker.relay is not None:  # a foreign transport: relay the store's outbox
            loops.append(asyncio.create_task(self.broker.relay.run(), name="blitzq-relay"))
        return loops

    def schedule_changed(self, eta: float) -> None:
        """Wake the promoter if ``eta`` (Unix seconds, broker's clock) is before its next
        planned wake-up (also on the broker's clock)."""
        if eta < self._next_wake:
            self._wake.set()

    async def _promote_loop(self) -> None:
        broker = self.broker
        while True:
            self._wake.clear()
            # A push that arrives while promote_due is in flight may name a due time the
            # answer does not include: let it wake the next wait.
            self._next_wake = float("inf")
            try:
                moved, next_eta, now = await broker.promote_due(PROMOTE_BATCH)
            except BrokerError as exc:
                self._failed("promoter", exc)
                await asyncio.sleep(1.0)
                continue
            self.episodes["promoter"].cleared()
            if moved >= PROMOTE_BATCH:
                continue
            # ``now`` and ``next_eta`` are both the broker's clock: only their difference
            # (the remaining seconds) is used here, so this worker's clock plays no part.
            # Jittered (80-100 %): in step with the maintenance round, the two would meet
            # and keep a second pooled connection open for nothing.
            wait = PROMOTER_CEILING * (0.8 + 0.2 * random.random())
            if next_eta is not None:
                wait = min(wait, max(0.0, next_eta - now))
            self._next_wake = now + wait
            if wait <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _handed_loop(self) -> None:
        """Start the messages other workers hand to this one (a task they do not know:
        :mod:`blitzq.worker.unknown`) as soon as the event channel says so, and every
        ``interval`` in case a push was lost."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._handed.wait(), timeout=self.interval)
            self._handed.clear()
            try:
                await take_handed(self.worker, self.slots)
                self.episodes["handed"].cleared()
            except NotImplementedError:
                return
            except BrokerError as exc:  # a slot migrating: once, not each round
                self._failed("handed", exc)
            except Exception:  # a bug must not end the loop: the leases recover the messages
                logger.exception("taking handed messages failed")

    async def _event_loop(self) -> None:
        """Follow the event channel for good: a malformed push is logged and skipped, any
        error ends the subscription, which is made again (cancellations published in
        between are caught up by a resynchronisation)."""
        backoff = EVENT_RETRY_MIN
        while True:
            try:
                async for kind, value in self.broker.events():
                    self._on_event(kind, value)
                    backoff = EVENT_RETRY_MIN
            except NotImplementedError:
                return
            except BrokerError as exc:
                logger.debug("event listener: %s", exc)
            except Exception:  # whatever it was, the listener must go on
                logger.exception("event listener failed; subscribing again in %.1f s", backoff)
            finally:  # pushes are no longer heard: idle reads poll until it subscribes again
                self.broker.transport.hearing(False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, EVENT_RETRY_MAX)
            self._wake.set()  # a schedule push may have been lost meanwhile
            try:
                await self._sync_revocations()
            except Exception as exc:  # the periodic resynchronisation tries again
                logger.debug("event listener: resynchronisation failed: %s", exc)

    def _on_event(self, kind: str, value: str) -> None:
        """Act on one push; never raises (anyone can publish on the channel)."""
        try:
            if kind == "revoke":
                runner = self.worker.runner
                runner.revoked[value] = time.time() + self.worker.queue.result_ttl
                if runner.cancel(value):
                    logger.info("cancelled running task %s", value)
                return
            if kind in ("pause", "resume"):  # blitzq queue pause / resume
                self.pausing.pushed(kind, value)
                return
            if kind == "shutdown":  # blitzq worker shutdown ID
                if value in (self.worker.key, self.worker.id):
                    logger.info("shutting down: asked on the event channel")
                    self.worker.stop()
                return
            if kind == "resize":  # the dashboard: c:<concurrency>:<worker id>
                count, _, target = value.partition(":")
                if target == self.worker.id:
                    self.resize(int(count))
                return
            if kind == "handed":  # another worker handed this one a message (unknown.py)
                if value == self.worker.key:
                    self._handed.set()
                return
            if kind == "ready":  # a watched queue got a message (a cluster: doorbell.py)
                self.broker.transport.arrived(value)
                return
            if kind == "subscribed":  # a push may have been missed before: look once
                self._wake.set()
                self.broker.transport.hearing(True)  # rings every queue
                return
            if kind == "schedule":
                eta = float(value)
                if math.isfinite(eta):  # a NaN would never compare earlier
                    self.schedule_changed(eta)
                    return
            self._malformed(kind, value, None)
        except Exception as exc:
            self._malformed(kind, value, exc)

    def _malformed(self, kind: str, value: str, error: Exception | None) -> None:
        """Log a push that could not be used: a WARNING at most once a minute."""
        self.malformed_events += 1
        now = time.monotonic()
        if now - self._malformed_logged < 60.0:
            return
        self._malformed_logged = now
        logger.warning(
            "ignored a malformed push on the event channel (%d so far): %s %.200r%s",
            self.malformed_events,
            kind,
            value,
            f" ({describe_error(error)[0]}: {describe_error(error)[1][:200]})" if error else "",
        )

    def resize(self, concurrency: int) -> None:
        """Run at most ``concurrency`` tasks at once from now on (the dashboard's resize,
        :meth:`~blitzq.broker.Broker.request_resize`): the worker's global limiter holds that
        many slots; running tasks go on (when shrinking, none starts until fewer run); the
        thread pool keeps its size.

        Raises:
            ConfigurationError: ``concurrency`` is not an int in [1, 100000].
        """
        if integer("concurrency", concurrency, minimum=1) > 100_000:
            raise ConfigurationError("concurrency must be at most 100000")
        self.worker.concurrency = concurrency
        for slots in list(self.slots.values())[:1]:  # they share the one global limiter
            slots.global_limiter.resize(concurrency)
        logger.info("worker %s resized: concurrency=%d", self.worker.id, concurrency)

    async def _sync_size(self, earlier: bool = False) -> None:
        """Take a resize asked of this worker whose push it missed (the dashboard's); at
        start (``earlier``), drop one asked of an earlier process under this id instead."""
        try:
            size = await self.broker.take_resize(self.worker.id)
            if size is not None and size != self.worker.concurrency and not earlier:
                self.resize(size)
        except (BlitzQError, NotImplementedError) as exc:
            logger.debug("maintenance: reading a resize: %s", exc)

    async def _sync_revocations(self) -> None:
        """Re-read the cancelled ids; cancel running tasks among them (a push was lost)."""
        runner = self.worker.runner
        try:
            revoked = await self.broker.revoked()
        except NotImplementedError:
            return
        now = time.time()
        runner.revoked = {task_id: expiry for task_id, expiry in revoked.items() if expiry > now}
        if runner.revoked:
            missed = {
                job.envelope.id
                for job in runner.jobs
                if job.envelope.id in runner.revoked
                and (job.context is None or not job.context.cancelled)
            }
            for task_id in missed:
                if runner.cancel(task_id):
                    logger.info("cancelled running task %s (resynchronised)", task_id)

    async def _maintain_loop(self) -> None:
        worker, broker = self.worker, self.broker
        queue = worker.queue
        vt = queue.visibility_timeout
        pruning = Pruning(broker, vt)
        next_sync = time.monotonic() + REVOCATION_SYNC
        while True:
            try:  # alone: a refused registration (server out of memory) must not stop renewals
                await self.register()
                self.episodes["register"].cleared()
            except BrokerError as exc:
                self._failed("register", exc)
            await self.pausing.sync()
            await self._sync_size()
            try:
                if self.peers.may_judge():  # not right after a pause of this worker
                    signals = worker.runner.extensions.signals
                    await reap_lapsed(broker, worker.id, signals)
                self.episodes["lapsed"].cleared()
            except BrokerError as exc:
                self._failed("lapsed", exc)
            except Exception:  # a bug must not stop lease renewal
                logger.exception("maintenance: reading lapsed registrations failed")
            if worker.runner.track_state:
                try:
                    await self._keep_records()
                    self.episodes["records"].cleared()
                except BrokerError as exc:
                    self._failed("records", exc)
            try:
                if broker.supports_recovery:
                    for q in worker.physical_queues:
                        tokens = worker.running_tokens(q)
                        if tokens:  # renewals only for the leases this worker holds
                            await self._steps.alone("leases", q, broker.heartbeat(q, tokens))
                    # Only a queue that holds a message can hold an abandoned one: one read
                    # over all (an idle worker's round costs one command, not one per queue).
                    judged = self.peers.may_judge()  # not right after a pause of this worker
                    queues = worker.physical_queues if judged else []
                    occupied = await broker.transport.occupied(queues) if queues else []
                    # Live workers with a longer timeout keep their leases that long.
                    holders = await broker.worker_timeouts(vt) if occupied else {}
                    for q in occupied:
                        judge = self.peers.may_judge  # asked again right before each call
                        recovery = recover_queue(broker, worker, q, vt, holders, judge)
                        await self._steps.alone("recovery", q, recovery)
                    self.recovery_rounds += judged and self.peers.may_judge()
                    await pruning.step(worker.physical_queues)  # one stream, in turn
                self.episodes["round"].cleared()
            except BrokerError as exc:
                self._failed("round", exc)
            except Exception:  # a bug must not stop lease renewal for good
                logger.exception("maintenance round failed")
            if time.monotonic() >= next_sync:
                next_sync = time.monotonic() + REVOCATION_SYNC
                try:
                    await self._sync_revocations()
                    self.episodes["revocations"].cleared()
                except BrokerError as exc:
                    self._failed("revocations", exc)
                except Exception:
                    logger.exception("maintenance: reading cancelled tasks failed")
            self.peers.sleeping(self.interval)
            await asyncio.sleep(self.interval)
            self.peers.woke()

    async def _keep_records(self) -> None:
        """Extend the ``running`` records of this worker's runs that have less than
        :func:`keep_margin` s left (one script for all; none while every record has time)."""
        runner = self.worker.runner
        vt = self.worker.queue.visibility_timeout
        ttl = running_record_ttl(runner.result_ttl, vt)
        margin = keep_margin(vt)
        now = time.time()
        kept = self._kept
        due: list[Job] = []
        for job in runner.jobs:
            if job.finished or not job.started_at:
                continue
            until = kept.setdefault(job, job.started_at + ttl)
            if until - now < margin:
                due.append(job)
        for job in [j for j in kept if j not in runner.jobs]:
            del kept[job]
        if due:
            await self.broker.state.records.keep_running([job.envelope.id for job in due], ttl)
            for job in due:
                kept[job] = now + ttl

    async def register(self) -> None:
        """Register the worker (its :meth:`~blitzq.Worker.info`) for three maintenance
        intervals and five seconds, with its counts of the runs no completion write counted
        (``Ending.unwritten_runs``), which the broker adds to the namespace's counters as far
        as they grew (see ``Broker.register_worker``).

        Raises:
            BrokerError: the registration could not be written.
        """
        worker = self.worker
        counts = worker.runner.ending.unwritten
        ttl = 3 * self.interval + 5
        await self.broker.register_worker(
            worker.key,
            worker.info(),
            ttl,
            counts,
            self.registered_counts,
            worker.queue.visibility_timeout,
            worker.physical_queues,
        )
        done = self.registered_counts  # another write may have ended meanwhile
        self.registered_counts = max(done[0], counts[0]), max(done[1], counts[1])

    async def unregister(self, timeout: float) -> None:
        """Remove the worker's registration at its shutdown with its last counts (as
        :meth:`register`: the broker adds what they grew by to the namespace's counters).
        Waits ``timeout`` seconds at most: a server that stopped answering must not hold the
        exit (the registration then expires)."""
        worker = self.worker
        counts = worker.runner.ending.unwritten
        with contextlib.suppress(BrokerError, TimeoutError):
            await asyncio.wait_for(self.broker.unregister_worker(worker.key, counts), timeout)

    async def _counts_loop(self) -> None:
        """Register the worker again each second its counts changed (the maintenance loop
        registers it every ``interval`` regardless)."""
        worker = self.worker
        last = (worker.processed, worker.failed, len(worker.runner.jobs))
        while True:
            await asyncio.sleep(COUNTS_REFRESH)
            now = (worker.processed, worker.failed, len(worker.runner.jobs))
            if now == last:
                continue
            last = now
            try:
                await self.register()
            except BrokerError as exc:
                logger.debug("could not refresh the worker's registration: %s", exc)
