"""The fetch loops of a worker: one per subscribed queue, slots reserved before every fetch.

A loop reserves slots from its queue's and the global limiter *before* it fetches, takes up
to that many messages from the queue's priority levels (``<q>:high``, ``<q>``, ``<q>:low``, in
that order) without blocking, and blocks for a message on all levels at once (at most
``block_timeout`` seconds) only when they are empty; what that read returns beyond the slots
free at that moment is handed back at once, so the worker never holds a message it cannot
start. Excess work stays in the broker. Where the transport can (every shipped one:
``broker.transport.shared_block``) the idle loops do not block each on its own: they join the
worker's one blocking read over all their levels (:class:`~blitzq.worker.idle.SharedRead`),
and a loop whose last shared read brought nothing joins the next without looking first, so
an idle worker costs one command per ``block_timeout`` whatever the number of its queues (on
a cluster's spread layout looks woken by announced arrivals, and one safety look per
``doorbell.REVISIT_GAP`` at most, on RabbitMQ nothing: ``broker/redis/doorbell.py``,
``AmqpTransport.block_first``).
What is fetched goes to the :class:`~blitzq.worker.runner.Runner`, which frees the slots
when the run ends.

While a backlog lasts (the last fetch filled every slot it had, :data:`_OVERLAP_MIN` or
more), the completions of the batch just started wait for the next fetch to return
(:meth:`~blitzq.worker.flusher.Flusher.hold`) and go out before that fetch's messages
start: the server applies one batch's completions while the worker starts the next, where
it would otherwise apply them first and answer the fetch after, each side idle while the
other works (a drain with results stored: about 1.2x, see ``bench/README.md``). At light
load the completions go first, before the next fetch (the round trip's path), and a fetch
that finds the levels empty releases the hold before it blocks.

Outside a backlog, in fast mode on one server (:attr:`~blitzq.broker.Broker.carry`,
``broker/redis/carrying.py``), the completions go *with* the next fetch instead: a loop
waiting for a free slot (every slot taken) is counted among the flusher's riders, takes a
hold the moment a run's end frees a slot, and its non-blocking fetch takes the flusher's
waiting batch (:meth:`~.flusher.Flusher.board`) and sends it in the same round trip, so a
task costs the worker no round trip of its own for its completion. (In a backlog the overlap
above is worth more: a carried batch would put the server's work on it before the fetch's
reply, where the overlap does it while the worker starts the batch.) The flusher keeps
writing by itself whenever no such fetch is due (an idle queue, a fetch that blocks, a batch
it is retrying), so a completion never waits for work to arrive.

A worker whose Queue has tasks declared ``@queue.task(mode="fast")`` and whose broker has a
fast lane (:attr:`~blitzq.broker.Broker.fast_lane`: the lists of a reliable Redis broker)
runs a second loop per queue on the lane, sharing the queue's slots: what it pops carries no
lease (at-most-once), as in fast mode.

A loop of a paused queue (``blitzq queue pause``, :mod:`.pausing`) fetches nothing, and a
fetch in flight when the pause came hands back what it returns, unstarted.

While the flusher cannot write completions (the server is down or out of memory) or holds
too many, a loop fetches nothing until it can (:attr:`~blitzq.worker.flusher.Flusher.writable`):
backpressure, so that the worker pops no work whose outcome it could not record. While only
its own queue's completions wait (a Redis Cluster slot migrating:
:meth:`~blitzq.worker.flusher.Flusher.lane_blocked`), only that queue's loop waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..broker import Broker, Delivery
from ..broker.transport import Transport
from ..exceptions import BrokerError
from .bad_keys import BadKeys, wrong_type
from .idle import SharedRead
from .limiter import Slots

if TYPE_CHECKING:
    from collections.abc import Collection

    from .admission import Admission
    from .execution import Job
    from .flusher import Flusher

logger = logging.getLogger("blitzq.worker")

#: Turns of the event loop a fetch waits, holding the free slots it has, for runs still
#: going to end when it could fill more (see ``Fetcher._gather``).
_GATHER_TURNS = 2

#: Seconds a fetch loop of a paused queue waits between looks at the pause.
PAUSE_POLL = 0.2

#: Fewest messages a full fetch must have brought for the next one to overlap the
#: completions (smaller batches gain little, and their results go out first).
_OVERLAP_MIN = 32


class FetchFirst(Protocol):
    """A ``fetch_first`` of the broker or of its fast lane (see
    :meth:`~blitzq.broker.transport.Transport.fetch_first`)."""

    def __call__(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> Awaitable[list[Delivery]]:
        """Take up to ``count`` messages from the first of ``queues`` that has any."""
        ...


class Fetching(Protocol):
    """What the fetch loops see of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def stopping(self) -> bool: ...

    @property
    def levels(self) -> Mapping[str, list[str]]: ...

    @property
    def paused(self) -> Collection[str]: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def block_timeout(self) -> float: ...

    @property
    def key(self) -> str: ...

    handed_back: int


class FetchingRunner(Protocol):
    """What the fetch loops see of the runner (a :class:`~.runner.Runner`): where a
    delivery starts, where one that found no slot goes back, the runs going and the
    writer a backlog's fetch holds."""

    @property
    def admission(self) -> Admission: ...

    @property
    def jobs(self) -> Collection[Job]: ...

    @property
    def flusher(self) -> Flusher: ...

    def hand_back(self, d: Delivery) -> None: ...


class Fetcher:
    """Runs and stops the fetch loops of one worker.

    Args:
        worker: the owning worker (its ``levels``, ``batch_size``, ``block_timeout`` and
            ``stopping`` flag are read; its ``handed_back`` counter is raised).
        broker: the broker fetched from.
        runner: the runner that starts (or hands back) every fetched delivery.
        slots: the slots of each base queue name the worker consumes.
        lane: the broker's fast lane to fetch from too (a second loop per queue, keyed
            ``<queue> (fast)``), or ``None``.
    """

    def __init__(
        self,
        worker: Fetching,
        broker: Broker,
        runner: FetchingRunner,
        slots: Mapping[str, Slots],
        lane: Transport | None = None,
    ) -> None:
        self.worker = worker
        self.broker = broker
        self.runner = runner
        self.slots = slots
        self.lane = lane
        self._fetching: dict[str, bool] = {}
        self._holding: dict[str, bool] = {}  # whose fetch holds the flusher's next batch
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Fetches that returned (or failed), per loop (its queue, or ``<queue> (fast)``);
        #: fetches that returned messages.
        self.done: dict[str, int] = dict.fromkeys(slots, 0)
        if lane is not None:
            self.done.update(dict.fromkeys((f"{q} (fast)" for q in slots), 0))
        self.delivered = 0
        #: The one blocking read of the idle loops, made by :meth:`start` (``None``: each
        #: blocks on its own, a transport that cannot share one).
        self.shared: SharedRead | None = None
        #: Queues whose last shared read brought nothing, or fewer than it takes from each
        #: level (:meth:`_drained`): their next fetch skips the look
        #: (each looks first at start: a backlog is taken in order, most urgent level first).
        self._quiet: dict[str, bool] = dict.fromkeys(slots, False)
        #: Levels set aside because their key holds another type (:mod:`.bad_keys`): the
        #: broker's, and its fast lane's.
        self.bad = BadKeys(broker.transport, worker.key)
        self.bad_lane = BadKeys(lane, worker.key, " (fast lane)") if lane is not None else None
        #: The broker's fetch that carries completions (fast mode on one server), used by
        #: the loops of the main transport (see :meth:`_look`).
        self.carry = broker.carry

    def start(self) -> None:
        """Start one fetch loop per queue of :attr:`slots` (two with a :attr:`lane`: the
        lane's loops block each on its own, never in the shared read)."""
        if self.broker.transport.shared_block:
            worker, runner = self.worker, self.runner
            levels = {q: worker.levels[q] for q in self.slots}
            self.shared = SharedRead(
                self.broker, levels, worker.block_timeout, runner.hand_back, self.bad.healthy
            )
        self._tasks = {
            q: asyncio.create_task(
                self._loop(q, q, self.broker.fetch_first), name=f"blitzq-fetch-{q}"
            )
            for q in self.slots
        }
        if self.lane is not None:
            for q in self.slots:
                key = f"{q} (fast)"
                loop = self._loop(q, key, self.lane.fetch_first)
                self._tasks[key] = asyncio.create_task(loop, name=f"blitzq-fetch-{q}-fast")

    def running(self) -> dict[str, bool]:
        """Whether each fetch loop runs, by queue name (the readiness check reads it)."""
        return {q: not t.done() for q, t in self._tasks.items()}

    async def stop(self, wait: float) -> None:
        """End every fetch loop; call after the worker's stop was requested.

        A loop inside a fetch command finishes it (its messages are handed back); any other
        loop holds no message and is cancelled. A fetch still running ``wait`` seconds later
        (a server that stopped answering) is cancelled too.
        """
        if self.shared is not None:
            self.shared.stop()  # the blocked read ends at once, taking nothing
        for q, t in self._tasks.items():
            if not self._fetching.get(q):
                t.cancel()
        if not self._tasks:
            return
        _, stuck = await asyncio.wait(self._tasks.values(), timeout=wait)
        for t in stuck:
            logger.warning("a fetch still running %.1f s after the stop: cancelled", wait)
            t.cancel()
        for t in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def in_fetch(self) -> dict[str, int]:
        """Queues whose loop is inside a fetch command, with their :attr:`done` count."""
        return {q: self.done[q] for q, busy in self._fetching.items() if busy}

    def _stop_requested(self) -> bool:
        # A call, not the property: a property read would be narrowed by mypy across awaits.
        return self.worker.stopping

    async def _loop(self, queue: str, key: str, fetch_first: FetchFirst) -> None:
        """Fetch ``queue``'s levels with ``fetch_first`` until the worker stops; ``key``
        names the loop (its flags and :attr:`done` count)."""
        worker = self.worker
        slots = self.slots[queue]
        runner = self.runner
        batch = worker.batch_size
        backoff = 0.1
        backlog = False  # the last fetch filled every slot it had (at least _OVERLAP_MIN)
        failing = False  # the last fetch failed as the server or cluster switches (logged)
        writable = runner.flusher.writable
        bad = self.bad if key == queue or self.bad_lane is None else self.bad_lane
        carrying = self.carry is not None and key == queue
        while not self._stop_requested():
            if not writable.is_set():  # completions refused: take no work it cannot record
                await writable.wait()
                continue
            lane = runner.flusher.lane_blocked(queue)
            if lane is not None:  # this queue's completions wait (its slot migrates)
                await lane.wait()
                continue
            if queue in worker.paused:  # `blitzq queue pause` (kept by maintenance.py)
                await asyncio.sleep(PAUSE_POLL)
                continue
            if carrying and not backlog:
                n = await self._reserve_carrying(key, slots, batch)
            else:
                n = await slots.reserve(batch)
            if n < batch and runner.jobs:
                try:
                    n += await self._gather(slots, batch - n)
                except asyncio.CancelledError:  # stopped meanwhile: the slots held go back
                    slots.release(n)
                    self._release_hold(key)
                    raise
            if self._stop_requested():
                slots.release(n)
                self._release_hold(key)
                return
            # While this flag is set the loop may hold messages, so shutdown waits for it
            # instead of cancelling it.
            self._fetching[key] = True
            try:
                if backlog:
                    self._holding[key] = True
                    runner.flusher.hold()
                carry = carrying and not backlog
                deliveries = await self._fetch(queue, key, slots, n, fetch_first, carry)
                if deliveries and self._holding.get(key):
                    self._release_hold(key)
                    await asyncio.sleep(0)  # the held completions go to the server first
            except Exception as exc:  # the loop must outlive any error; BrokerError is usual
                self._fetching[key] = False
                if isinstance(exc, BrokerError) and await self._timed_out_here(queue, exc):
                    continue
                if wrong_type(exc) and await self._sort_out(bad, queue):
                    continue  # the other levels are fetched at once
                if isinstance(exc, BrokerError):  # at DEBUG when the loss was logged already
                    # or this condition (its slot migrating, ...) was, by an earlier retry
                    again = exc.unavailable and failing
                    level = logging.DEBUG if exc.reported or again else logging.WARNING
                    logger.log(
                        level, "fetch from %s failed, retry in %.1f s: %s", queue, backoff, exc
                    )
                    failing = failing or exc.unavailable
                else:
                    logger.exception("fetch from %s failed, retrying in %.1f s", queue, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                self._release_hold(key)
                self._fetching[key] = False
                self.done[key] += 1
            backoff = 0.1
            if failing:
                failing = False
                logger.info("fetch from %s works again", queue)
            if deliveries:
                self.delivered += 1
            if self._stop_requested():
                # Fetched after the stop: put back untouched, never dropped.
                for d in deliveries:
                    runner.hand_back(d)
                slots.release(len(deliveries))
                return
            if deliveries and queue in worker.paused:
                # Paused while the fetch was in flight (a blocking read): put back, unstarted.
                for d in deliveries:
                    runner.hand_back(d)
                slots.release(len(deliveries))
                worker.handed_back += len(deliveries)
                continue
            backlog = len(deliveries) == n >= _OVERLAP_MIN
            start = runner.admission.start  # the per-delivery entry, looked up once per batch
            for d in deliveries:
                try:
                    start(d, slots)
                except Exception:  # a bug here must not stop the queue; the lease recovers it
                    logger.exception("could not start a message from %s", queue)
                    slots.release()
            if deliveries and not backlog and not carrying:
                # Let the runs' first steps and the flusher go before the next fetch: a task
                # that ended at once has its completion written first (the round trip's path).
                await asyncio.sleep(0)

    async def _reserve_carrying(self, key: str, slots: Slots, wanted: int) -> int:
        """:meth:`Slots.reserve` for a fetch that carries completions. When every slot is
        taken (the worker is saturated) the loop is counted among the flusher's riders while
        it waits, then holds the flusher's next batch (released when the fetch takes it,
        see :meth:`_look`), so the completions of the runs whose end freed the slots go
        with this fetch instead of a round trip of their own. With a slot free at once
        nothing is held: at light load a completion goes at once, as it ends."""
        q = slots.queue_limiter
        if slots.global_limiter.free > 0 and (q is None or q.free > 0):
            return await slots.reserve(wanted)
        flusher = self.runner.flusher
        flusher.riders += 1
        try:
            n = await slots.reserve(wanted)
        finally:
            flusher.riders -= 1
        if not self._holding.get(key):
            self._holding[key] = True
            flusher.hold()
        return n

    async def _look(
        self, key: str, names: Sequence[str], n: int, fetch_first: FetchFirst, carrying: bool
    ) -> list[Delivery]:
        """The non-blocking fetch of up to ``n`` from ``names``: with ``carrying``, the
        flusher's waiting batch goes in the same round trip (:attr:`carry`), else
        ``fetch_first`` alone."""
        carry = self.carry
        if carry is None or not carrying:
            return await fetch_first(names, n, 0)
        flusher = self.runner.flusher
        batch = flusher.board()
        self._release_hold(key)  # the batch is taken (or there is none to take)
        if batch is None:
            return await fetch_first(names, n, 0)
        try:
            return await carry(names, n, batch, flusher.landed)
        finally:
            if flusher.board_open(batch):  # cancelled before the carrier settled it
                flusher.landed(None)

    async def _timed_out_here(self, queue: str, error: BrokerError) -> bool:
        """Whether a fetch that ended in a client-side timeout met a server that answers at
        once (then logged as such, and fetched again at once): the reply was not read in
        time on this side, as after a pause of this process (SIGSTOP, a VM pause) or a
        blocked event loop, not a failure of the server."""
        if not str(error).startswith("TimeoutError"):
            return False
        try:
            await self.broker.ping()
        except Exception:
            return False
        logger.warning(
            "fetch from %s: no reply read within the client's time limit (%s), yet the server "
            "answers at once: this process's event loop did not run (a thread task holding "
            "the GIL, blocking code in an async def task, a paused process: SIGSTOP, a VM "
            "pause) or the network stalled for a moment; fetching again",
            queue,
            error,
        )
        return True

    async def _sort_out(self, bad: BadKeys, queue: str) -> bool:
        """Set aside the levels of ``queue`` whose key holds another type; whether any."""
        try:
            return await bad.sort_out(self.worker.levels[queue])
        except Exception:  # the server went away meanwhile: an ordinary failed fetch
            return False

    def _release_hold(self, queue: str) -> None:
        """Let the flusher's held batch go, if this queue's fetch holds it."""
        if self._holding.pop(queue, False):
            self.runner.flusher.release()

    async def _gather(self, slots: Slots, wanted: int) -> int:
        """Let runs whose replies already arrived end (two turns of the event loop: the
        reply's read, then the task's step), and take the slots they free, so that at low
        concurrency one fetch serves several ended runs instead of one. Returns the slots
        taken (up to ``wanted``)."""
        taken = 0
        try:
            for _ in range(_GATHER_TURNS):
                await asyncio.sleep(0)
                taken += slots.take(wanted - taken)
                if taken >= wanted:
                    break
        except asyncio.CancelledError:
            slots.release(taken)
            raise
        return taken

    async def _fetch(
        self,
        queue: str,
        key: str,
        slots: Slots,
        n: int,
        fetch_first: FetchFirst,
        carrying: bool = False,
    ) -> list[Delivery]:
        """Fetch with ``n`` reserved slots; on return, exactly one slot is held per delivery
        (``carrying``: the look takes the flusher's waiting batch along, see :meth:`_look`).

        Takes what is waiting on the queue's levels without blocking. When all are empty it
        blocks on all levels at once holding only the queue's own slot, so an idle queue
        never keeps global capacity from busy ones. What arrives gets the slots free at that
        moment; the rest is handed back to its queue at once (see :meth:`_grant`). So the
        loop never waits for a slot while it holds a message: a message it has not started
        is never left here with a lease nobody renews.
        """
        lane = key != queue
        bad = self.bad_lane if lane and self.bad_lane is not None else self.bad
        names = bad.healthy(self.worker.levels[queue])
        if not names:  # every level set aside: wait as an empty fetch would, then look again
            slots.release(n)
            self._release_hold(key)
            await asyncio.sleep(self.worker.block_timeout)
            return []
        shared = self.shared if not lane else None  # a lane's loop blocks on its own
        if shared is None or not self._quiet[queue]:
            try:
                deliveries = await self._look(key, names, n, fetch_first, carrying)
            except BaseException:  # a failed or cancelled fetch holds no slot (shutdown waits)
                slots.release(n)
                raise
            if deliveries or self._stop_requested():
                slots.release(n - len(deliveries))
                return deliveries
        slots.release(n - 1)
        slots.global_limiter.release(1)
        self._release_hold(key)  # never hold completions while blocked on empty levels
        try:
            # The levels were empty a moment ago (or at the last shared read): block at once,
            # one command less per idle fetch; what arrived meanwhile comes back at once,
            # most urgent level first.
            if shared is not None:
                deliveries = await shared.wait(queue, slots.room(1))
                self._quiet[queue] = self._drained(deliveries, shared.counts.get(queue, 1))
            else:
                deliveries = await fetch_first(
                    names, 1, self.worker.block_timeout, look_first=False
                )
        except BaseException:
            slots.release_queue(1)
            # A failed wait (a blocking read whose WAIT fell short, say) may have taken and
            # left entries: the next fetch looks, taking a batch, before it blocks again.
            self._quiet[queue] = False
            raise
        if not deliveries:
            slots.release_queue(1)
            return deliveries
        return self._grant(queue, slots, deliveries)

    @staticmethod
    def _drained(deliveries: list[Delivery], count: int) -> bool:
        """Whether a shared read's ``deliveries`` of one queue show its levels empty behind
        them: none came, or each level gave fewer than the read asked of each (``count``,
        up to :attr:`~blitzq.broker.transport.Transport.block_count`); then the next fetch
        blocks at once (an idle worker's round trip: read, run, complete, read, no look)."""
        if len(deliveries) < count:
            return True
        per_level: dict[str, int] = {}
        for d in deliveries:
            per_level[d.queue] = per_level.get(d.queue, 0) + 1
        return max(per_level.values()) < count

    def _grant(self, queue: str, slots: Slots, deliveries: list[Delivery]) -> list[Delivery]:
        """Keep the deliveries of a blocking fetch that free slots allow; hand back the rest.

        A blocking read over several levels returns entries from *each* level that got
        data on Redis >= 7.2 and Valkey (the promoter may move several due messages at
        once), up to ``block_count`` of each, and the worker's slots may have filled up
        while the read was blocked. The levels come in priority order, so the most urgent
        ones are kept; after a hand-back the next fetch looks first.
        """
        granted = slots.grant(len(deliveries), 1)
        if granted < len(deliveries):
            self._quiet[queue] = False  # the surplus goes back: the next fetch looks first
            surplus = deliveries[granted:]
            for d in surplus:
                self.runner.hand_back(d)
            logger.debug("no free slot for %d message(s) from %s: handed back", len(surplus), queue)
            self.worker.handed_back += len(surplus)
        return deliveries[:granted]
