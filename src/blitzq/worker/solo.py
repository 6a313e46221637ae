"""Suspects run alone, so a crash counts against the task that could have caused it.

A worker process that dies (a segfault, an out-of-memory kill, ``os._exit`` in a task) takes
every delivery it held with it: the tasks running beside the culprit and those it had fetched
or prefetched and not started. Their transport counts a delivery for each alike (a RabbitMQ
quorum queue counts every return, the streams recovery every claim), so dead-lettering by that
count after ``max_deliveries`` dead-letters innocent bystanders of a poison task too.

So the transport's count only decides *how* a redelivered task runs, and a count kept in the
state store of the runs that only the task itself could have crashed decides when it is
dead-lettered (:func:`solo_plan`):

- the first deliveries (below :attr:`Solo.solo_from`: 3, or 2 when ``max_deliveries`` is 2)
  run as any task does, beside others: nothing is counted, no round trip is added;
- from delivery ``solo_from`` on a task is a *suspect* and runs **alone** in its worker
  process. :meth:`Solo.take` closes the gate (other deliveries admitted meanwhile wait, leased
  and handed back at shutdown like a start in progress), waits until every run and start in
  progress has ended, counts the solo start in the state store
  (:meth:`~blitzq.broker.Broker.count_solo_start`, one round trip: ``{ns}:solo:<task_id>``),
  runs it, and opens the gate again once its run ended and its completion was written;
- a suspect whose count passes its budget (``max_deliveries - solo_from + 1`` solo runs) is
  dead-lettered (``max deliveries exceeded``) instead of running: a task that crashes every
  run ran ``max_deliveries`` times, the last ones alone, when it is dead-lettered. An innocent
  task redelivered with a poison one runs alone once and completes.

The transport's count stays a backstop (:func:`~blitzq.broker.transport.delivery_backstop`):
a delivery counted past it is dead-lettered on receipt, and the transports' own recoveries
dead-letter there (a message that kills its worker before it ever starts, say). A store that
cannot count (or cannot be reached) leaves the suspect to run alone uncounted: the backstop
bounds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..broker import Broker, Delivery
from ..broker.transport import solo_plan
from ..exceptions import BrokerError

if TYPE_CHECKING:
    from ..serialization import Envelope
    from ..task import Task
    from .execution import Job
    from .flusher import Flusher
    from .limiter import Slots

logger = logging.getLogger("blitzq.worker")


class SoloRunner(Protocol):
    """What the gate sees of the runner: its broker, runs and starts in progress, flusher."""

    @property
    def broker(self) -> Broker: ...

    @property
    def jobs(self) -> set[Job]: ...

    @property
    def flusher(self) -> Flusher: ...

    @property
    def result_ttl(self) -> int: ...

    @property
    def visibility_timeout(self) -> float: ...

    @property
    def starting(self) -> Mapping[asyncio.Task[None], Delivery]: ...

    def hold_start(self, pending: asyncio.Task[None], d: Delivery) -> None: ...


class SoloAdmission(Protocol):
    """What the gate sees of admission: starting a delivery (its start checks, then its run)
    and dead-lettering one past its budget."""

    def admit(self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots) -> None: ...

    def reject(
        self,
        d: Delivery,
        reason: str,
        error: str,
        slots: Slots,
        task_id: str | None = None,
        task: str = "",
    ) -> None: ...


class Solo:
    """The gate of one worker's suspects (module docstring).

    Args:
        runner: the worker's runner.
        admission: the runner's admission (it starts the suspect's run).
        max_deliveries: the Queue's ``max_deliveries``.

    Attributes:
        solo_from: the delivery count from which a task runs alone.
        budget: solo runs a task may start (:func:`solo_plan`).
        closed: a suspect waits for its turn or runs: no other run starts (read by admission
            on every delivery).
        current: the suspect whose turn it is, if any.
        solo_runs: solo runs started (for tests and the logs).
    """

    def __init__(self, runner: SoloRunner, admission: SoloAdmission, max_deliveries: int) -> None:
        self.runner = runner
        self.admission = admission
        self.max_deliveries = max_deliveries
        self.solo_from, self.budget = solo_plan(max_deliveries)
        self.closed = False
        self.current: Delivery | None = None
        self.solo_runs = 0
        self._suspects = 0  # waiting for their turn or running
        self._turn = asyncio.Lock()
        self._opened = asyncio.Event()
        self._own: set[asyncio.Task[None]] = set()  # turns and parked starts: never drained
        self._watch: asyncio.Task[None] | None = None
        #: Called as a suspect starts its run alone: a supervised worker's progress mark
        #: (:func:`.heartbeat.progress_mark`), since a crash from here on is the suspect's,
        #: counted in Redis against its own budget, not a crash loop of the worker.
        self.on_alone: Callable[[], None] | None = None

    # ------------------------------------------------------------ the others
    def park(self, start: Callable[[], None], d: Delivery, slots: Slots) -> None:
        """Hold delivery ``d`` (admitted, holding one slot of ``slots``) until the gate
        opens, then call ``start`` (which runs it, or parks it again)."""
        self._hold(self._parked(start, slots), d)

    async def _parked(self, start: Callable[[], None], slots: Slots) -> None:
        while self.closed:
            await self._opened.wait()
        try:
            start()
        except Exception:  # as in the fetch loop: the lease recovers the message
            logger.exception("could not start a task held while a suspect ran alone")
            slots.release()

    # ------------------------------------------------------------ the suspect
    def take(self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots) -> None:
        """Run suspect ``d`` (holding one slot of ``slots``) alone, or dead-letter it past
        its budget (module docstring)."""
        self._suspects += 1
        self.closed = True
        self._opened.clear()
        self._hold(self._take_turn(d, env, task, slots), d)

    async def _take_turn(
        self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots
    ) -> None:
        try:
            await self._turn.acquire()
        except BaseException:  # cancelled at shutdown: the runner hands ``d`` back
            self._left()
            raise
        started = False
        try:
            await self._drain()
            count = await self._count(env.id)
            if count is not None and count > self.budget:
                self.admission.reject(  # attempts: the deliveries before this one
                    d._replace(deliveries=d.deliveries - 1),
                    "max deliveries exceeded",
                    self._exceeded(d, count - 1),
                    slots,
                    env.id,
                    env.task,
                )
                return
            self.current = d
            self.solo_runs += 1
            if self.on_alone is not None:
                self.on_alone()
            logger.info(
                "running task %s (%s) alone: delivered %d times without completing",
                env.id,
                env.task,
                d.deliveries,
            )
            started = True
            self._watch = asyncio.ensure_future(self._watch_run())
            try:
                self.admission.admit(d, env, task, slots)
            except Exception:  # a bug must not leak the slot; the lease recovers the message
                logger.exception("could not start task %s", env.id)
                slots.release()
        finally:
            if not started:
                self._turn.release()
                self._left()

    def _exceeded(self, d: Delivery, crashed: int) -> str:
        return (
            f"delivered {d.deliveries} times without completing, of which {crashed} run(s) "
            f"alone in its worker process (max_deliveries={self.max_deliveries}: "
            f"{self.solo_from - 1} run(s) beside other tasks, then {self.budget} alone); "
            "the worker running it probably crashed"
        )

    async def _count(self, task_id: str) -> int | None:
        """This solo start's number (1 for the first), or ``None`` when it cannot be
        counted (the transport's backstop then bounds the task)."""
        try:
            return await self.runner.broker.count_solo_start(task_id, self.runner.result_ttl)
        except NotImplementedError:
            return None
        except BrokerError as exc:
            logger.warning("could not count the solo run of task %s: %s", task_id, exc)
            return None

    async def _watch_run(self) -> None:
        """Open the gate once the suspect's run (and its start checks) ended and its
        completion was written (a crash after that is not its doing)."""
        try:
            await self._drain()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.runner.visibility_timeout):
                    await self.runner.flusher.flush()
        finally:
            self.current = None
            self._turn.release()
            self._left()

    # ---------------------------------------------------------------- common
    def _hold(self, coro: Any, d: Delivery) -> None:
        held: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._own.add(held)
        held.add_done_callback(self._own.discard)
        self.runner.hold_start(held, d)

    def _left(self) -> None:
        self._suspects -= 1
        if self._suspects == 0:
            self.closed = False
            self._opened.set()

    async def _drain(self) -> None:
        """Return once no run and no start (other than the gate's own) is in progress."""
        runner = self.runner
        while True:
            waits: list[asyncio.Future[Any]] = [j.handle for j in runner.jobs if j.handle]
            waits += [t for t in runner.starting if t not in self._own and not t.done()]
            if not waits:
                return
            await asyncio.wait(waits)


__all__ = ["Solo", "SoloAdmission", "SoloRunner", "solo_plan"]
