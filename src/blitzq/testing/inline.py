"""The eager mode's worker: what a Queue enqueued, run in this process through the worker's own
path for one delivery, without a worker's fetch loops, connections or background loops.

An :class:`InlineWorker` serves one Queue namespace on one event loop for the length of an
eager activation (:mod:`blitzq.testing.eager`). It holds what a running
:class:`~blitzq.Worker` holds for its runs -- a ``Worker`` object (never run: its options and
resources), a :class:`~blitzq.worker.runner.Runner`, the slots of its queues -- and
:meth:`InlineWorker.drain` takes the messages waiting on the namespace's queues and hands each
to the runner's :meth:`~blitzq.worker.admission.Admission.start`, as a fetch loop does.
Decoding, start checks (rate limits, locks, unique keys, expiry), middleware, ``Depends()``
resources, executors, timeouts, retry decisions, workflow steps and completions (written by a
:class:`~blitzq.worker.flusher.Flusher`) are the worker's own code. A drain opens the Queue's
lifespans and runs its startup hooks first, and its shutdown hooks and the lifespans' ends
last, as the worker the eager mode started per enqueue before did.

A drain returns once no message waits, nothing runs or starts, every completion is written,
the middleware's after-hooks have run, and nothing on the schedule is due within the horizon.

**Virtual time.** A message on the schedule (a delay, an ``eta``, a retry's backoff) is not
waited for: when nothing else is left, the drain moves the earliest ones to their queues at
once (:meth:`~blitzq.broker.state.ScheduleState.promote_due` with ``ahead``), as if their
due time had come, and charges that wait to the drain's ``horizon``: the seconds of waiting
one drain may skip in all. A message due later than what is left of it stays on the
schedule. Attempts, records and outcomes are those of production; only the waits are
skipped. A message put back
on the schedule *without running* (a rate limit's or a lock's wait) is not hurried, since the
server's token buckets and leases keep real time (and a rate-limited message holds the token
its bucket reserved for its due time): the drain notes each such message's due time as its
completion is written (:attr:`InlineWorker.real_waits`), never moves time ahead past one,
waits in real time for one due within :data:`PATIENCE` seconds and leaves the rest (also
when moving ahead ran nothing). ``max_age`` counts real time only (docs/testing.md).

The task's own exception: the runner's observer (:class:`OutcomeKeeper`) keeps the exception
of every run that failed for good, by task id, for ``result()`` to raise in the eager mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from typing import TYPE_CHECKING

from ..broker import Completion, Transport
from ..dependencies import Resources
from ..extensions.registry import extensions_of
from ..routing import base_queue, levels
from ..worker import Worker
from ..worker.execution import Job, cause_of
from ..worker.flusher import Flusher
from ..worker.limiter import Limiter, Slots
from ..worker.runner import Runner
from ..worker.tally import RunTally

if TYPE_CHECKING:
    from ..queue import Queue

logger = logging.getLogger("blitzq.testing")

#: Most messages taken from one queue (all its priority levels) in one fetch.
BATCH = 100
#: Most scheduled messages moved to their queues per call.
PROMOTE_BATCH = 1000
#: Seconds between two looks at the queues while tasks run (a message published from a
#: thread, or by another event loop, is seen by then at the latest).
POLL = 0.05
#: Seconds the drain waits in real time for a message that went back on the schedule without
#: running (a rate limit's or a lock's wait); one due later stays scheduled.
PATIENCE = 5.0


class _Watched(Limiter):
    """A limiter that also sets ``changed`` whenever slots come back (a run or a start
    ended), so the drain wakes up."""

    __slots__ = ("changed",)

    def __init__(self, capacity: int, changed: asyncio.Event) -> None:
        super().__init__(capacity)
        self.changed = changed

    def release(self, n: int = 1) -> None:
        super().release(n)
        self.changed.set()


class OutcomeKeeper(RunTally):
    """The runner's observer in the eager mode: counts what happened and keeps the exception
    of each run that failed for good (no retry left).

    Args:
        failures: where the exceptions go, by task id (the eager activation's, shared by
            every InlineWorker of it); a later success of the same id removes its entry.

    Attributes:
        events: runs started, cancellations and deliveries ended unrun (rejected, expired)
            so far: the drain's measure of progress.
    """

    def __init__(self, failures: dict[str, BaseException]) -> None:
        super().__init__()
        self.failures = failures
        self.events = 0

    def started(self, job: Job) -> None:
        """A run started."""
        self.events += 1

    def ended(
        self, queue: str, task: str, outcome: str, completion: Completion | None = None
    ) -> None:
        """A delivery ended before it ran (rejected, expired)."""
        self.events += 1

    def committed(
        self, job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
    ) -> None:
        """A run's completion was handed to the writer: keep its exception when it failed for
        good (a retry or a run put back is not final)."""
        if cancelled:
            self.events += 1
            return
        failed = error if error is not None else job.encode_error
        task_id = job.envelope.id
        if failed is None:
            if self.failures:
                self.failures.pop(task_id, None)
            return
        if completion is not None and (
            completion.reschedule is not None or completion.requeue is not None
        ):
            return
        self.failures[task_id] = cause_of(failed)


class InlineWorker:
    """Runs what one Queue namespace enqueued, on the running event loop (module docstring).

    Args:
        queue: the Queue (its tasks, settings, middleware and broker of this loop).
        concurrency: tasks running at once.
        failures: the activation's exceptions of failed tasks, by id (:class:`OutcomeKeeper`).

    Attributes:
        worker: the ``Worker`` whose options and resources the runs use (never run).
        runner: the worker's runner.
        loop: the event loop it belongs to.
    """

    def __init__(self, queue: Queue, concurrency: int, failures: dict[str, BaseException]) -> None:
        self.queue = queue
        self.loop = asyncio.get_running_loop()
        self.broker = queue.broker
        # unknown_task_grace=0: in the eager mode no other worker would take a task this
        # Queue does not know, so it is dead-lettered at once ("unknown task").
        self.worker = Worker(
            queue,
            concurrency=concurrency,
            name=f"eager-{uuid.uuid4().hex[:8]}",
            unknown_task_grace=0.0,
            freeze_gc=False,
        )
        self.activity = asyncio.Event()
        self.limiter = _Watched(concurrency, self.activity)
        self.flusher = Flusher(self.broker)
        self.runner = Runner(self.worker, self.broker, self.flusher)
        self.keeper = OutcomeKeeper(failures)
        self.runner.observer = self.keeper
        #: The slots every delivery holds (one limiter: ``concurrency`` runs at once).
        self.slots = Slots(self.limiter, None)
        self._physical: list[str] = []  # the physical queues served, in fetch order
        self._shape: tuple[int, ...] = ()
        self._prepared: set[str] = set()
        #: The broker's fast lane while the Queue has a task declared ``mode="fast"`` (its
        #: messages travel there: fetched too, as a worker's second loop per queue does).
        self._lane: Transport | None = None
        self._lane_prepared: set[str] = set()
        #: Task id -> Unix time its message is due, of messages a start check put back on the
        #: schedule unrun (a rate limit's reserved token, a lock's lease): virtual time never
        #: brings them forward, the server's buckets and leases keep real time.
        self.real_waits: dict[str, float] = {}
        #: Completion batches written so far.
        self.written = 0

    def _count_written(self, applied: list[Completion], stale: list[Completion]) -> None:
        """The flusher applied a batch (it may have published: a workflow's next step); note
        the messages it put back on the schedule without a run (:attr:`real_waits`)."""
        self.written += 1
        for c in applied:
            if c.reschedule is not None and c.tally == 0:  # no run ended: a start check's wait
                self.real_waits[c.task_id] = time.time() + c.delay

    def _next_real_wait(self, now: float) -> float | None:
        """When the first of :attr:`real_waits` still ahead of ``now`` is due (Unix
        seconds), or ``None``; those due by ``now`` are dropped (promoted as usual)."""
        waits = self.real_waits
        for task_id in [t for t, due in waits.items() if due <= now]:
            del waits[task_id]
        return min(waits.values(), default=None)

    def poke(self) -> None:
        """Tell the drain that something was published (callable from any thread)."""
        try:
            here = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            here = False
        if here:
            self.activity.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to wake
            self.loop.call_soon_threadsafe(self.activity.set)

    def revoke(self, task_id: str) -> None:
        """``task_id`` was cancelled: skip it from now on and cancel its run if it runs here,
        as a worker does on the broker's ``revoke`` event (callable from any thread)."""

        def apply() -> None:
            runner = self.runner
            runner.revoked[task_id] = time.time() + self.queue.result_ttl
            runner.cancel(task_id)

        try:
            here = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            here = False
        if here:
            apply()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing runs
            self.loop.call_soon_threadsafe(apply)

    # ------------------------------------------------------------------ drain
    async def drain(self, horizon: float, timeout: float) -> None:
        """Run what waits, then what the schedule holds within ``horizon`` seconds of
        virtual time, until nothing is left (module docstring).

        Args:
            horizon: seconds of schedule waits this drain may skip in all.
            timeout: seconds the drain may take.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds (a task that never ends);
                what still runs is put back on its queue, as at a worker's shutdown.
            Exception: what a startup hook or a lifespan raised.
            BrokerError: the memory backend could not be reached.
        """
        queue, worker, runner = self.queue, self.worker, self.runner
        # The context tasks start from: the enqueuer's, as a worker started here would have.
        runner.base_context = contextvars.copy_context()
        await self._refresh_queues()
        worker.resources = Resources()
        await extensions_of(queue).worker_started(worker)  # on_startup, lifespan, middleware
        flusher = self.flusher = runner.flusher = Flusher(self.broker)
        flusher.on_written = self._count_written
        writer = self.loop.create_task(flusher.run(), name="blitzq-eager-flusher")
        try:
            await self._sync_revocations()
            await self._run(horizon, time.monotonic() + timeout, timeout)
        finally:
            await self._finish(writer)

    async def _run(self, horizon: float, deadline: float, timeout: float) -> None:
        runner, broker, flusher = self.runner, self.broker, self.flusher
        budget = horizon
        moved_at: int | None = None  # keeper.events when the drain last moved time ahead
        hooks_done = False
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the eager mode's drain did not end within {timeout} s")
            written = self.written
            if await self._start_waiting():
                hooks_done = False
                await asyncio.sleep(0)  # first steps and the writer go before the next look
                continue
            if not runner.idle:
                await self._wait_activity(deadline)
                continue
            if flusher.backlog:
                await flusher.flush()
                continue  # a completion may have published (a workflow's next step)
            if self.written != written:
                continue  # written while the queues were read: look again
            if runner.extensions.enabled and not hooks_done:
                await self.queue.signals.drain()  # after-hooks and signals (may enqueue)
                hooks_done = True
                continue
            moved, next_eta, now = await broker.promote_due(PROMOTE_BATCH)
            if moved:
                continue
            if next_eta is None:
                return
            wait = max(0.0, next_eta - now)
            real = self._next_real_wait(now)  # the memory server's clock is this process's
            # Noted as its batch was written, a moment after the server scheduled it: a second
            # of margin, so that moving time ahead to next_eta never promotes it.
            if real is not None and real <= next_eta + 1.0:
                # Next due: a message a start check put back; it keeps real time.
                if real - now > PATIENCE:
                    return
                await asyncio.sleep(min(real - now, max(0.0, deadline - time.monotonic())))
                continue
            if moved_at == self.keeper.events:
                # Moving ahead ran nothing: what came back waits for the server's clock.
                if wait > PATIENCE:
                    return
                await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                continue
            if wait > budget:
                return
            budget -= wait
            moved_at = self.keeper.events
            await broker.promote_due(PROMOTE_BATCH, wait + 0.001)

    async def _start_waiting(self) -> int:
        """Fetch what waits on the queues (every queue's levels in one call, each queue's
        most urgent level first), as many as free slots allow, and start each delivery as
        a fetch loop does; return how many started."""
        await self._refresh_queues()
        slots = self.slots
        n = slots.take(BATCH)
        if not n:
            return 0
        try:
            deliveries = await self.broker.fetch_first(self._physical, n, 0)
            if self._lane is not None and len(deliveries) < n:
                deliveries += await self._lane.fetch_first(self._physical, n - len(deliveries), 0)
        except BaseException:
            slots.release(n)
            raise
        slots.release(n - len(deliveries))
        start = self.runner.admission.start
        for d in deliveries:
            try:
                start(d, slots)
            except Exception:  # as in a fetch loop: never leak the slot
                logger.exception("could not start a message from %s", d.queue)
                slots.release()
        return len(deliveries)

    async def _wait_activity(self, deadline: float) -> None:
        """Wait until a slot comes back or something is published (at most :data:`POLL`
        seconds, and not past ``deadline``)."""
        self.activity.clear()
        if self.runner.idle:
            return
        wait = min(POLL, max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.activity.wait(), wait)

    async def _refresh_queues(self) -> None:
        """Serve every queue the Queue names or has published to (priority levels
        included), preparing the consumer of new ones."""
        queue = self.queue
        known = queue._producer.known_queues
        shape = (len(queue.tasks), len(queue.periodic_tasks), len(known))
        if shape == self._shape:
            return
        names = {queue.name} | {t.queue for t in queue.tasks.values()}
        names |= {p.queue for p in queue.periodic_tasks.values() if p.queue}
        names |= {base_queue(q) for q in known}
        physical = [p for name in sorted(names) for p in levels(name)]
        fresh = [p for p in physical if p not in self._prepared]
        if fresh:
            await self.broker.prepare_consumer(fresh, self.worker.id)
            self._prepared.update(fresh)
        fast = any(t.fast for t in queue.tasks.values())
        self._lane = self.broker.fast_lane if fast else None
        if self._lane is not None:
            unready = [p for p in physical if p not in self._lane_prepared]
            if unready:
                await self._lane.prepare_consumer(unready, self.worker.id)
                self._lane_prepared.update(unready)
        self._physical, self._shape = physical, shape

    async def _sync_revocations(self) -> None:
        """Read the cancel marks (a task cancelled while it waited is skipped)."""
        now = time.time()
        revoked = await self.broker.revoked()
        self.runner.revoked = {i: expiry for i, expiry in revoked.items() if expiry > now}

    async def _finish(self, writer: asyncio.Task[None]) -> None:
        """End a drain: put back what still runs (a timeout), write every completion, then
        the shutdown hooks, the lifespans' ends and the after-hooks still running."""
        runner, queue = self.runner, self.queue
        if not runner.idle:
            left = runner.requeue_unfinished()
            logger.warning("eager mode: %d task(s) still running put back on their queue", left)
            await asyncio.sleep(0)
        self.flusher.close()
        try:
            await asyncio.wait_for(writer, 30.0)
        except TimeoutError:
            logger.error("eager mode: could not write %d completion(s)", self.flusher.backlog)
        await extensions_of(queue).worker_stopped(self.worker)  # and on_shutdown, lifespans
        await queue.signals.drain()

    def close(self) -> None:
        """Stop the runner's thread and process pools (at the end of the activation; safe
        from any thread)."""
        runner = self.runner
        if runner._threads is not None:
            runner._threads.shutdown(wait=False, cancel_futures=True)
        if runner._processes is not None:
            runner._processes.shutdown(kill=False)


__all__ = ["PATIENCE", "InlineWorker", "OutcomeKeeper"]
