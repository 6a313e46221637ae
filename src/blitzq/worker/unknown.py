"""Messages naming a task this worker does not know: left for a worker that does.

During a rolling deploy, new producers enqueue a task that the old workers still running
do not have. Such a worker must not dead-letter the message at once: it puts it back on the
schedule (not spending an attempt: the message's ``attempt`` is unchanged) so that the
promoter returns it to its queue, where a worker that knows the task can take it. It does so
for ``unknown_task_grace`` seconds (a :class:`~blitzq.worker.Worker` option, default 300),
measured from the message's ``created_at`` (its first enqueue; a replayed dead letter starts
a fresh grace). Past the grace the message is dead-lettered with reason ``"unknown task"``.

The delay before each return grows with the message's age: half its age, at least
:data:`MIN_DELAY` and at most :data:`MAX_DELAY` seconds, with +-20 % jitter, and never past
the end of the grace (so the last check happens when the grace ends). A fresh message thus
comes back after about 1 s, one that has waited a minute after about 30 s.

**Steering** (reliable mode on Redis): before deferring, the worker looks for a live worker
that knows the task. Workers advertise their task names in their registration
(``{ns}:workers``, read at most once a second, :class:`Knowers`); one that consumes the
message's queue in reliable mode and registers the task gets the delivery handed over
(:meth:`~blitzq.broker.Broker.hand_over`: still leased, moved to that worker's pending list,
the worker woken on the event channel, and it starts the message at once; see
``Maintenance``). So during a rolling deploy an old worker takes such a message at most once
and never bounces it back to the queue for backoff luck to decide who takes it next. With no
knower alive (or on a transport that cannot hand a delivery to one consumer: fast mode,
RabbitMQ) the message is deferred as above.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..broker import Completion, Delivery
from ..exceptions import BlitzQError, BrokerError
from ..routing import base_queue
from ..serialization import Envelope, encode_envelope, loads
from .limiter import Slots

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..broker import Broker
    from ..seams import QueueSettings
    from .admission import Admission

logger = logging.getLogger("blitzq.worker")

#: Shortest and longest wait (seconds) before an unknown task comes back to its queue.
MIN_DELAY = 1.0
MAX_DELAY = 30.0
#: Seconds a worker reuses what it read of the other workers' registrations.
KNOWERS_TTL = 1.0
#: Most handed deliveries a worker takes per queue level in one look.
HANDED_BATCH = 100


class Asking(Protocol):
    """What :class:`Knowers` sees of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def id(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def broker(self) -> Broker: ...


class _Starting(Protocol):
    @property
    def admission(self) -> Admission: ...


class Handed(Asking, Protocol):
    """What :func:`take_handed` sees of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def runner(self) -> _Starting: ...

    @property
    def physical_queues(self) -> list[str]: ...

    @property
    def stopping(self) -> bool: ...


class _HandingWorker(Asking, Protocol):
    @property
    def queue(self) -> QueueSettings: ...

    @property
    def knowers(self) -> Knowers: ...

    @property
    def unknown_task_grace(self) -> float: ...


class HandingRunner(Protocol):
    """What :class:`UnknownTasks` sees of the runner (a :class:`~.runner.Runner`, which
    owns it)."""

    @property
    def worker(self) -> _HandingWorker: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def max_message_size(self) -> int: ...

    def write(self, completion: Completion) -> None: ...


class Knowers:
    """Which live workers know which task, from their registrations (read at most once per
    :data:`KNOWERS_TTL`).

    Args:
        worker: the worker asking (it is never its own answer).
    """

    def __init__(self, worker: Asking) -> None:
        self.worker = worker
        self._rows: list[tuple[str, frozenset[str], frozenset[str]]] = []
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()
        #: Hand-overs in flight (kept referenced until they end).
        self.pending: set[asyncio.Task[None]] = set()
        #: Messages of tasks unknown here that this worker handed to a worker knowing them.
        self.handed_over = 0

    async def find(self, queue: str, task: str) -> list[str]:
        """Ids of the other live reliable-mode workers that consume ``queue`` (a base queue
        name) and register ``task``.

        Raises:
            BrokerError: the registrations could not be read.
        """
        async with self._lock:
            if time.monotonic() - self._read_at >= KNOWERS_TTL:
                registrations = await self.worker.broker.workers()
                rows = (_knower(raw) for raw in registrations.values())
                self._rows = [row for row in rows if row is not None]
                self._read_at = time.monotonic()
        me = self.worker.key
        return [
            wid
            for wid, queues, tasks in self._rows
            if wid != me and queue in queues and task in tasks
        ]


def _knower(raw: bytes) -> tuple[str, frozenset[str], frozenset[str]] | None:
    """``(key, queues, tasks)`` of a reliable-mode worker's registration (its ``key``, the
    consumer a delivery is handed to; ``id`` for a worker that registers none), or ``None``."""
    try:
        info: Any = loads(raw)
    except BlitzQError:
        return None
    if not isinstance(info, dict) or info.get("mode") != "reliable":
        return None
    wid, queues, tasks = info.get("key") or info.get("id"), info.get("queues"), info.get("tasks")
    if not isinstance(wid, str) or not isinstance(queues, list) or not isinstance(tasks, list):
        return None
    return wid, frozenset(map(str, queues)), frozenset(map(str, tasks))


def defer_delay(age: float, grace: float) -> float:
    """Seconds to wait before an unknown task ``age`` seconds old comes back, within
    ``grace`` (both in seconds): see the module docstring (jitter included)."""
    delay = min(MAX_DELAY, max(MIN_DELAY, age / 2)) * random.uniform(0.8, 1.2)
    return max(0.05, min(delay, grace - age))


class UnknownTasks:
    """What one worker's runner does with a delivery naming a task it does not know: hand
    it to a worker that knows it, defer it, or dead-letter it (module docstring).

    Args:
        runner: the worker's runner.
    """

    def __init__(self, runner: HandingRunner) -> None:
        self.runner = runner

    def take(self, d: Delivery, env: Envelope, slots: Slots) -> None:
        """Defer ``env`` (a delivery holding one slot of ``slots``) for a worker that knows
        its task, or dead-letter it once the worker's ``unknown_task_grace`` has passed."""
        runner = self.runner
        grace = runner.worker.unknown_task_grace
        now = time.time()
        age = max(0.0, now - env.created_at)
        error = f"no task named {env.task!r} is registered in this worker"
        if age >= grace:
            if grace > 0:
                error += f" (nor in any worker that took it within {grace:g} s)"
            runner.admission.reject(d, "unknown task", error, slots, env.id, env.task)
            return
        if d.token is not None and runner.worker.broker.supports_recovery:
            knowers = runner.worker.knowers
            steer = asyncio.create_task(self._hand_over(d, env, slots, age, grace))
            knowers.pending.add(steer)
            steer.add_done_callback(knowers.pending.discard)
            return
        self._defer(d, env, slots, age, grace)

    async def _hand_over(
        self, d: Delivery, env: Envelope, slots: Slots, age: float, grace: float
    ) -> None:
        """Hand ``d`` to a live worker that knows its task, or defer it (see the module)."""
        assert d.token is not None
        worker = self.runner.worker
        try:
            knowers = await worker.knowers.find(base_queue(d.queue), env.task)
            if knowers:
                other = random.choice(knowers)
                ttl = 10 * worker.queue.visibility_timeout
                if await worker.broker.transport.hand_over(d.queue, d.token, other, ttl):
                    worker.knowers.handed_over += 1
                    logger.info(
                        "task %s (%s) is unknown here: handed to worker %s, which knows it",
                        env.id,
                        env.task,
                        other,
                    )
                # else: no longer ours (the lease lapsed and another worker recovered it)
                slots.release()
                return
        except NotImplementedError:
            pass
        except BrokerError as exc:
            logger.warning("could not hand task %s (%s) over: %s", env.id, env.task, exc)
        except BaseException:
            slots.release()  # cancelled at shutdown: still leased here, recovered later
            raise
        self._defer(d, env, slots, age, grace)

    def _defer(self, d: Delivery, env: Envelope, slots: Slots, age: float, grace: float) -> None:
        """Put ``d`` back on the schedule for a worker that knows its task (module
        docstring)."""
        runner = self.runner
        now = time.time()
        delay = defer_delay(age, grace)
        logger.warning(
            "task %s (%s) is unknown here: back on the schedule in %.1f s for a worker that "
            "knows it (dead-lettered %.0f s after its enqueue)",
            env.id,
            env.task,
            delay,
            grace,
        )
        again = msgspec.structs.replace(env, enqueued_at=now)
        data = encode_envelope(again, max(runner.max_message_size, len(d.payload) * 2))
        runner.write(Completion(d.queue, d.token, env.id, reschedule=data, delay=delay))
        slots.release()


async def take_handed(worker: Handed, slots: Mapping[str, Slots]) -> int:
    """Start the deliveries other workers handed to ``worker`` (they did not know the task),
    waiting for free slots while more are handed than it has free; stops taking once the
    worker is stopping (what is left stays leased to it and is recovered). Returns how
    many it started.

    ``slots``: the worker's slots of each base queue name.

    Raises:
        BrokerError: the broker could not be reached.
        NotImplementedError: the transport cannot hand deliveries over.
    """
    runner, taken = worker.runner, 0
    start = runner.admission.start
    # A handed entry is still in its stream: only a queue holding a message can have one
    # (one read over all streams, not one script per queue each round).
    for queue in await worker.broker.transport.occupied(worker.physical_queues):
        held = slots[base_queue(queue)]
        while not _stopping(worker):
            n = await held.reserve(HANDED_BATCH)
            if _stopping(worker):
                held.release(n)
                break
            try:
                got = await worker.broker.transport.take_handed(queue, n)
            except BaseException:
                held.release(n)
                raise
            held.release(n - len(got))
            for d in got:
                start(d, held)
            taken += len(got)
            if len(got) < n:
                break
    return taken


def _stopping(worker: Handed) -> bool:
    # A call, not the property: mypy would narrow a property read across awaits.
    return worker.stopping
