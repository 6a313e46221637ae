"""Group commit: one coroutine writes completions, many per round-trip under load.

Completions queue up while one batch is in flight and all go in the next; there is no timer, so
at light load a completion costs one round-trip of latency and under heavy load hundreds share
one. A batch holds at most ``max_batch`` completions and ``max_bytes`` bytes (at least one).

A batch that fails while the server is down, failing over or starting (a connection error,
``READONLY``, ``LOADING``, ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``: whatever node answers
PING meanwhile), or that it refuses for lack of memory (``OOM`` at ``maxmemory`` under
``noeviction``), is kept and retried with backoff until it is applied or fenced, never dropped
and never turned into a failure. While
that lasts, and while more than :data:`MAX_BACKLOG` completions wait, :attr:`Flusher.writable`
is clear and the fetch loops fetch nothing (backpressure): the worker takes no work it could
not record, and its backlog stays bounded (about its concurrency).
A batch the server *refuses* (an error reply, or a connection it drops while reading a write
it will not take, such as an argument over its ``proto-max-bulk-len``, while it still answers
PING: only a batch of :data:`BIG_WRITE` bytes or more can be that) is split: the other
completions commit, and a completion refused on its own is replaced by a small one that
acknowledges the delivery with a ``failed`` record saying why.

A batch the broker applies in part (:class:`~blitzq.broker.values.HeldBack`: on a Redis
Cluster's spread layout each queue's completions go to that queue's slot, and one slot may be
migrating or its node failing over) is split by queue: the applied ones are done, the held
ones are *parked* with their queue, and so are that queue's next completions (in order): the
queue's *lane* is retried on its own (backoff from 20 ms to 2 s) while the other queues'
completions go on being written; only that queue's fetch loop pauses
(:meth:`Flusher.lane_blocked`). The leases of the deliveries whose completions wait here
(parked or not) are renewed with the running tasks' (:meth:`Flusher.tokens`), so a long
wait never lets another worker recover them.

While the worker fetches from a backlog, the next batch may be *held* until the fetch in
flight returns (:meth:`Flusher.hold`, at most :data:`MAX_HOLD` seconds): the server then
answers the fetch first and applies the completions while the worker starts what it fetched,
instead of the worker waiting for both in turn (see :mod:`.fetch`).

In fast mode on one server a fetch loop may take the next batch instead (:meth:`Flusher.board`)
and send it in its own round trip with its next non-blocking pop (``broker/redis/carrying.py``);
the writer waits until that fetch tells what became of it (:meth:`Flusher.landed`), and writes
it itself, with the retries above, when it is not known to be applied.

Fencing: the broker applies a completion only while its delivery is still leased to this
worker. The stale ones it hands back (no longer pending under this worker: the lease lapsed,
e.g. the process was paused, and another worker took the message over; or the server lost
the delivery, e.g. a restart without persistence) are counted in :attr:`Flusher.stale` and each is
logged once at WARNING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..broker import Broker, Completion
from ..broker.effects import op_size
from ..broker.values import HeldBack
from ..exceptions import BrokerError
from ..limits import COMPLETION_BATCH_BYTES, COMPLETION_BATCH_ITEMS
from .lanes import Lanes
from .refusals import replacement_of

logger = logging.getLogger("blitzq.worker")

#: Longest a batch waits for a hold to be released (seconds); then it goes anyway.
MAX_HOLD = 0.05

#: Completions waiting past which the fetch loops pause until the backlog is written.
MAX_BACKLOG = 4 * COMPLETION_BATCH_ITEMS

#: Bytes under which no server refuses a write for its size (1 MiB: the smallest
#: ``proto-max-bulk-len`` and ``client-query-buffer-limit`` Redis allows): a connection
#: error under a smaller completion batch is the connection's, retried, never a refusal.
BIG_WRITE = 1 << 20

#: Types of a completion's record whose size ``_take`` reads in place.
_RECORD_TYPES = frozenset({bytes, type(None)})


def completion_size(c: Completion) -> int:
    """Approximate bytes ``c`` sends to the broker (its records, messages and op bytes).

    Never raises: a malformed completion (a bug) counts as 64 bytes and is isolated when the
    broker cannot send it.
    """
    try:
        size = 64 + len(c.record or b"") + len(c.reschedule or b"") + len(c.requeue or b"")
        if c.dead_letter is not None:
            size += len(c.dead_letter.message) + len(c.dead_letter.error)
        for op in c.ops:
            size += op_size(op)
    except Exception:
        return 64
    return size


class Flusher:
    """Collects completions and applies them in batches.

    Args:
        broker: where to apply them.
        max_batch: most completions in one round-trip.
        max_bytes: most bytes of completions in one round-trip (a single larger completion
            still goes, alone).
    """

    def __init__(
        self,
        broker: Broker,
        max_batch: int = COMPLETION_BATCH_ITEMS,
        max_bytes: int = COMPLETION_BATCH_BYTES,
    ) -> None:
        self.broker = broker
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self._pending: list[Completion] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        #: Holds taken and not yet released (:meth:`hold`), and what a held writer awaits.
        self._holds = 0
        self._released: asyncio.Future[None] | None = None
        #: Completions the broker refused as stale (fencing), since this flusher started.
        self.stale = 0
        #: Called with each batch the broker applied and the stale completions it refused
        #: (the worker's metrics count the applied ones), or ``None``.
        self.on_written: Callable[[list[Completion], list[Completion]], None] | None = None
        #: Called with the completions the broker refused as stale (the ending takes their
        #: runs back from the worker's counts), or ``None``.
        self.on_stale: Callable[[list[Completion]], None] | None = None
        #: Set while completions can be written and the backlog is under MAX_BACKLOG; the
        #: fetch loops wait for it before each fetch (backpressure).
        self.writable = asyncio.Event()
        self.writable.set()
        self._refused_since: float | None = None  # the broker refuses writes since then
        #: Fetch loops waiting for a free slot before a fetch that carries completions
        #: (:meth:`board`): while any waits, a woken writer lets one turn of the event loop
        #: pass first, so a loop that a run's end woke can hold the batch for its fetch.
        self.riders = 0
        self._busy = False  # a batch of the writer's own is being written
        self._riding: list[Completion] | None = None  # the batch a fetch carries
        self._landed = asyncio.Event()
        self._taken_bytes = 0  # about the bytes of the last batch taken (with one more)
        #: Batches written by a fetch that carried them (:meth:`board`), since the start.
        self.carried = 0
        #: The queues whose completions the broker holds back for now (:mod:`.lanes`).
        self._lanes = Lanes()
        #: The completion :meth:`call_when_applied` watches, and what to call then.
        self._watch: tuple[Completion, Callable[[], None]] | None = None

    def add(self, completion: Completion) -> None:
        """Queue a completion for the next batch (behind its queue's parked ones, if any)."""
        lanes = self._lanes
        if lanes.parked and lanes.take(completion):  # a lane parked: a call, else none
            return
        pending = self._pending
        if not pending:  # else the writer is busy, will look again, and is not idle
            self._idle.clear()
            self._wake.set()
        pending.append(completion)
        if len(pending) > MAX_BACKLOG:
            self.writable.clear()

    def call_when_applied(self, completion: Completion, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the broker applied ``completion`` (added with :meth:`add`),
        right after its batch was written; not when it was refused as stale or replaced (a
        refused write). One completion is watched at a time: a later call replaces the
        earlier one. ``callback`` must not raise."""
        self._watch = (completion, callback)

    def _applied(self, batch: list[Completion], stale: list[Completion]) -> None:
        """Call the watched completion's callback when ``batch`` applied it."""
        assert self._watch is not None
        completion, callback = self._watch
        if any(c is completion for c in batch) and not any(c is completion for c in stale):
            self._watch = None
            callback()

    def hold(self) -> None:
        """Keep the next batch back until :meth:`release` (each hold released once), at
        most :data:`MAX_HOLD` seconds; a batch already sent is not affected."""
        self._holds += 1

    def release(self) -> None:
        """End one :meth:`hold`; the last one lets the held batch go at the next turn of
        the event loop."""
        self._holds -= 1
        released = self._released
        if not self._holds and released is not None and not released.done():
            released.set_result(None)

    def board(self) -> list[Completion] | None:
        """The next batch, for a fetch that sends it in its own round trip
        (:attr:`~blitzq.broker.Broker.carry`), or ``None``: nothing waits, the writer is
        writing a batch (or retrying one the broker refused), another fetch carries one, or
        the batch is of :data:`BIG_WRITE` bytes or more (a server may refuse it for its
        size: the writer's own path tells that from an outage, and splits it).

        The batch stays first in line and the writer waits until :meth:`landed` is called,
        exactly once, with what became of it."""
        if not self._pending or self._busy or self._riding is not None:
            return None
        if self._refused_since is not None:
            return None
        batch = self._take()
        if self._taken_bytes >= BIG_WRITE:  # one a server may refuse for its size: the
            return None  # writer's own path tells a refusal from an outage and splits it
        self._riding = batch
        self._landed.clear()
        return batch

    def board_open(self, batch: list[Completion]) -> bool:
        """Whether ``batch`` (from :meth:`board`) is still waiting for :meth:`landed`."""
        return self._riding is batch

    def landed(self, stale: list[Completion] | None) -> None:
        """End the :meth:`board` in flight: ``stale`` are the completions the broker refused
        as stale (the batch was applied), ``None`` when the batch is not known to be applied
        (the writer writes it itself, with its retries)."""
        batch, self._riding = self._riding, None
        self._landed.set()
        if batch is None or stale is None:
            return
        self.carried += 1
        del self._pending[: len(batch)]
        self._done(batch, stale)

    @property
    def held(self) -> int:
        """Holds taken and not yet released."""
        return self._holds

    async def _held(self) -> None:
        """Return once every hold is released, or after :data:`MAX_HOLD` seconds."""
        loop = asyncio.get_running_loop()
        released = self._released = loop.create_future()
        timer = loop.call_later(MAX_HOLD, _resolve, released)
        try:
            await released
        finally:
            timer.cancel()
            self._released = None

    @property
    def backlog(self) -> int:
        """Completions not yet written (parked ones included)."""
        return len(self._pending) + self._lanes.size

    def lane_blocked(self, queue: str) -> asyncio.Event | None:
        """The event set once the parked completions of base queue ``queue`` are written,
        or ``None`` when none are parked (its fetch loop waits for it: backpressure)."""
        return self._lanes.blocked(queue)

    def tokens(self, queue: str) -> list[bytes]:
        """Delivery tokens of physical queue ``queue`` whose completions are not written
        yet: their leases must be renewed until they are (the maintenance loop's
        heartbeats, with the running tasks')."""
        out = [c.token for c in self._pending if c.queue == queue and c.token is not None]
        return out + self._lanes.tokens(queue)

    def _take(self) -> list[Completion]:
        """The next batch: the oldest completions within ``max_batch`` and ``max_bytes``."""
        pending = self._pending
        n = min(len(pending), self.max_batch)
        total, limit = 0, self.max_bytes
        for i in range(n):
            c = pending[i]
            record = c.record
            if (
                c.reschedule is None
                and c.requeue is None
                and c.dead_letter is None
                and not c.ops
                and type(record) in _RECORD_TYPES
            ):  # completion_size() of the common completion, inlined
                total += 64 + (len(record) if record is not None else 0)
            else:
                total += completion_size(c)
            if total > limit and i > 0:
                n = i
                break
        self._taken_bytes = total
        return pending[:n]

    async def run(self) -> None:
        """Write batches until :meth:`close` is called and nothing is left."""
        delay = 0.05
        while True:
            self._busy = False
            if self._riding is not None:  # a fetch carries the next batch
                await self._landed.wait()
                continue
            if self._lanes:
                due = self._lanes.due()
                if due:
                    self._busy = True
                    for name in due:
                        await self._retry_lane(name)
                    continue
            if not self._pending:
                if self._refused_since is not None:
                    # What the refusals held back was written in parts or dropped since:
                    # no backlog holds the fetches back any more (else they stay paused
                    # with nothing left to write, and the worker takes no task again).
                    self._refused_since = None
                    self.writable.set()
                if not self._lanes:
                    self._idle.set()
                    if self._closing:
                        return
                self._wake.clear()
                if self._lanes:  # until the next parked lane is due, or a new completion
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self._lanes.wait_for())
                else:
                    await self._wake.wait()
                continue
            if self.riders and not self._holds:
                await asyncio.sleep(0)  # a fetch loop a run's end woke may take a hold
            if self._holds:
                await self._held()
            if self._riding is not None or not self._pending:
                continue
            self._busy = True
            batch = self._take()
            try:
                stale = await self.broker.complete(batch)
            except HeldBack as exc:  # a queue's slot migrates: its lane waits, the rest went
                del self._pending[: len(batch)]
                self._done(exc.applied, exc.stale)
                self._park(exc.held, exc)
                continue
            except BrokerError as exc:
                if await self._retry_later(exc, batch):
                    # The first refusal is logged at WARNING (by _refusing), the retries
                    # of the same outage at DEBUG until a batch is written again.
                    level = logging.DEBUG if self._refused_since is not None else logging.INFO
                    self._refusing(exc)
                    logger.log(
                        level,
                        "completion batch of %d failed, retrying in %.2f s: %s",
                        len(batch),
                        delay,
                        exc,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                del self._pending[: len(batch)]
                await self._isolate(batch, exc)
                continue
            except Exception as exc:  # a completion that cannot even be sent (a bug)
                logger.exception("completion batch of %d could not be sent", len(batch))
                del self._pending[: len(batch)]
                await self._isolate(batch, _unsendable(exc))
                continue
            delay = 0.05
            del self._pending[: len(batch)]
            self._done(batch, stale)

    def _done(self, applied: list[Completion], stale: list[Completion]) -> None:
        """Completions the broker applied (``stale``: those it refused as stale); none
        applied (all of a batch held back) tells nothing of the broker's writes."""
        if not applied:
            return
        self._writing()
        if self.on_written is not None:
            self.on_written(applied, stale)
        if self._watch is not None:
            self._applied(applied, stale)
        if stale:
            self._report(stale)

    def _park(self, held: list[Completion], error: BrokerError) -> None:
        """Park ``held`` (completions the broker could not apply now) with their queues;
        the pending completions of those queues follow them, in order."""
        self._lanes.park(held, self._pending, error)
        if len(self._pending) <= MAX_BACKLOG and self._refused_since is None:
            self.writable.set()

    async def _retry_lane(self, name: str) -> None:
        """Try the oldest parked completions of lane ``name`` again."""
        parked = self._lanes.parked[name]
        part = parked[: self.max_batch]
        try:
            stale = await self.broker.complete(part)
        except HeldBack as exc:
            applied = {id(c) for c in exc.applied}
            parked[:] = [c for c in parked if id(c) not in applied]
            self._done(exc.applied, exc.stale)
            self._lanes.backoff(name, exc)
            return
        except BrokerError as exc:
            if await self._retry_later(exc, part):
                self._lanes.backoff(name, exc)
                return
            del parked[: len(part)]
            await self._isolate(part, exc)
        except Exception as exc:  # a completion that cannot even be sent (a bug)
            logger.exception("completion batch of %d could not be sent", len(part))
            del parked[: len(part)]
            await self._isolate(part, _unsendable(exc))
        else:
            del parked[: len(part)]
            self._done(part, stale)
        self._lanes.settled(name)  # written: the lane's fetch loop goes again

    def _refusing(self, error: BrokerError) -> None:
        """The broker refuses writes for now (down, or out of memory): pause the fetches."""
        if self._refused_since is None:
            self._refused_since = asyncio.get_running_loop().time()
            logger.warning(
                "completions cannot be written (%s): fetching paused until they are; they are "
                "kept and retried, never dropped",
                error,
            )
        self.writable.clear()

    def _writing(self) -> None:
        """A batch was written: let the fetches go again once the backlog is short."""
        if self._refused_since is not None:
            took = asyncio.get_running_loop().time() - self._refused_since
            self._refused_since = None
            logger.warning("completions written again after %.1f s: fetching resumed", took)
        if len(self._pending) <= MAX_BACKLOG:
            self.writable.set()

    def _report(self, stale: list[Completion]) -> None:
        """Count and log completions the broker dropped because their lease was lost."""
        self.stale += len(stale)
        if self.on_stale is not None:
            self.on_stale(stale)
        if getattr(self.broker.transport, "fenced_by_takes", False):
            for c in stale:
                logger.warning(
                    "stale completion of task %s from queue %s dropped, nothing was written: "
                    "RabbitMQ took its delivery back (this worker's channel closed: missed "
                    "heartbeats, a stall) and another delivery of the message was taken",
                    c.task_id,
                    c.queue,
                )
            return
        for c in stale:
            logger.warning(
                "stale completion of task %s from queue %s dropped, nothing was written: its "
                "delivery is no longer pending under this worker (its lease lapsed and another "
                "worker took the message over, or the server lost it: a restart without "
                "persistence, a flush, a failover; or this is a retry of a write whose reply "
                "was lost, and the first try was applied)",
                c.task_id,
                c.queue,
            )

    async def _retry_later(self, error: BrokerError, part: list[Completion]) -> bool:
        """Whether a failed write of ``part`` should wait and go again whole, never turning
        into ``failed`` records: the server is down, out of memory (``OOM`` under
        ``noeviction``: it takes writes again once drained), failing over or starting
        (:attr:`~blitzq.BrokerError.unavailable`: ``READONLY``, ``LOADING``, ``CLUSTERDOWN``,
        ``TRYAGAIN`` ..., whatever answers PING meanwhile), or the connection failed under a
        write smaller than any server refuses for its size (:data:`BIG_WRITE`). A connection
        dropped under a bigger write while the server answers PING is a refusal (an
        argument over ``proto-max-bulk-len``)."""
        if error.out_of_memory or "OOM " in str(error) or error.unavailable:
            return True
        if not error.transient:
            return False
        if sum(completion_size(c) for c in part) < BIG_WRITE:
            return True
        return not await self._answers()

    async def _answers(self) -> bool:
        """Whether the broker answers a PING now (a failed write with a live server means
        the server refused that write)."""
        try:
            await self.broker.ping()
        except BrokerError:
            return False
        return True

    async def _isolate(self, batch: list[Completion], error: BrokerError) -> None:
        """A batch the server refused (or that could not be sent): write it in parts, find
        the refused completions.

        The largest completion is tried apart first (the usual culprit), then the rest is
        halved until each part commits or is one refused completion. Parts that fail
        because the server went away go back to the pending list.
        """
        logger.error(
            "completion batch of %d refused by the broker, writing it in parts: %s",
            len(batch),
            error,
        )
        largest = max(range(len(batch)), key=lambda i: completion_size(batch[i]))
        parts = [[batch[largest]], batch[:largest] + batch[largest + 1 :]]
        while parts:
            part = parts.pop()
            if not part:
                continue
            failure = await self._try(part)
            if failure is None:
                continue
            if await self._retry_later(failure, part):
                self._refusing(failure)
                for rest in (part, *parts):
                    self._pending.extend(rest)
                return
            if len(part) > 1:
                mid = len(part) // 2
                parts += [part[mid:], part[:mid]]
                continue
            await self._refused(part[0], failure)

    async def _try(self, part: list[Completion]) -> BrokerError | None:
        """Apply ``part``; the error, or ``None`` when it committed."""
        try:
            stale = await self.broker.complete(part)
        except HeldBack as exc:  # applied in part: the rest waits with its queue
            self._done(exc.applied, exc.stale)
            self._park(exc.held, exc)
            return None
        except BrokerError as exc:
            return exc
        except Exception as exc:  # cannot even be sent (a bug): refused, never retried whole
            return _unsendable(exc)
        self._writing()
        if self.on_written is not None:
            self.on_written(part, stale)
        if stale:
            self._report(stale)
        return None

    async def _refused(self, completion: Completion, error: BrokerError) -> None:
        """One completion the server will not take: acknowledge its delivery with a
        ``failed`` record instead (small ops kept), so the task is not run again.

        When even that fails, the completion is dropped; its delivery is then not
        acknowledged, so in reliable mode it is delivered again and dead-lettered after
        ``max_deliveries``.
        """
        size = completion_size(completion)
        logger.error(
            "the broker refused the completion of task %s (%d bytes): %s",
            completion.task_id,
            size,
            error,
        )
        try:
            replacement = replacement_of(completion, size, error)
        except Exception:  # a malformed completion (a bug): nothing sensible to write
            logger.exception("dropped the completion of task %s", completion.task_id)
            return
        failure = await self._try([replacement])
        if failure is None:
            return
        if await self._retry_later(failure, [replacement]):
            self._refusing(failure)
            self._pending.append(replacement)
            return
        logger.error("dropped the completion of task %s: %s", completion.task_id, failure)

    async def flush(self) -> None:
        """Return once everything queued so far is written (parked lanes included)."""
        while self._pending or self._lanes:
            self._wake.set()
            await self._idle.wait()

    def close(self) -> None:
        """Ask :meth:`run` to return once the backlog is written."""
        self._closing = True
        self._wake.set()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _unsendable(exc: Exception) -> BrokerError:
    """A non-transient :class:`BrokerError` for a completion that could not be sent."""
    return BrokerError(f"{type(exc).__name__}: {exc}", False)
