"""A worker's paused queues (``blitzq queue pause``): followed, and applied to its transport.

The worker's :attr:`~blitzq.Worker.paused` is the namespace's set of paused base queues,
read at start and every maintenance round (:meth:`Pausing.sync`: a push may be lost) and
changed by each ``pause`` / ``resume`` push on the event channel (:meth:`Pausing.pushed`).
A fetch loop takes nothing from a paused queue (``fetch.py``); that alone is not enough where
the transport receives messages ahead of the fetches: RabbitMQ pushes each consumer up to its
prefetch, which would stay held by the paused worker, counted nowhere as waiting and out of
every other worker's reach. So each change, and each round, is applied to the transport
(:meth:`Pausing.apply`): the physical queues (every priority level) of the paused queues are
:meth:`~blitzq.broker.transport.Transport.pause`-d -- on RabbitMQ their consumers are
cancelled and what they received is handed back to the queue (``broker/amqp/pausing.py``) --
and those of a resumed queue :meth:`~blitzq.broker.transport.Transport.resume`-d. A newly
paused queue also ends the idle loops' shared blocking read
(:meth:`~blitzq.broker.transport.Transport.unblock`), so a loop blocked on the queue when the
pause came leaves the read at once instead of taking a message that arrives before its end.
The Redis transports receive nothing ahead: there only that wake-up acts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..broker import Broker
from ..exceptions import BrokerError
from ..log_episodes import Episode

logger = logging.getLogger("blitzq.worker")

__all__ = ["Pausable", "Pausing"]


class Pausable(Protocol):
    """What :class:`Pausing` sees of the worker (a :class:`~blitzq.Worker`)."""

    paused: set[str]

    @property
    def queues(self) -> list[str]: ...

    @property
    def levels(self) -> Mapping[str, Sequence[str]]: ...


class Pausing:
    """Keeps ``worker.paused`` and applies it to ``broker``'s transport (see the module
    docstring).

    Args:
        worker: the worker (its ``paused`` set is kept here; its ``queues`` and ``levels``
            name the physical queues of each base queue).
        broker: its broker (the paused set, and the transport paused and resumed).
    """

    def __init__(self, worker: Pausable, broker: Broker) -> None:
        self.worker = worker
        self.broker = broker
        #: The physical queues the transport was last told to pause.
        self.applied: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Failed reads and applications, each logged once while it lasts.
        self.read_failures = Episode(logger, "could not read the paused queues")
        self.apply_failures = Episode(
            logger, "could not apply the paused queues (tried again next round)"
        )

    async def sync(self) -> None:
        """Re-read the paused queues and apply them (at start and every round); never
        raises (the next round tries again)."""
        try:
            self.worker.paused = await self.broker.paused_queues()
        except Exception as exc:
            self.read_failures.failed(exc)
            return
        self.read_failures.cleared()
        await self._apply_logged()

    def pushed(self, kind: str, queue: str) -> None:
        """A ``pause`` or ``resume`` (``kind``) of base queue ``queue`` was pushed: change
        ``worker.paused`` at once, and apply it to the transport soon (a task)."""
        worker = self.worker
        (worker.paused.add if kind == "pause" else worker.paused.discard)(queue)
        if queue not in worker.queues:
            return
        logger.info("queue %s %s", queue, "paused" if kind == "pause" else "resumed")
        task = asyncio.get_running_loop().create_task(self._apply_logged(), name="blitzq-pause")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply_logged(self) -> None:
        try:
            await self.apply()
        except BrokerError as exc:
            self.apply_failures.failed(exc)
            return
        self.apply_failures.cleared()

    async def apply(self) -> int:
        """Tell the transport which physical queues are paused now: resume those no longer
        paused, end a blocking read when some are newly paused, and pause every paused one
        (idempotent: what a failed call left held is handed back by the next). One change
        at a time, each from the state of that moment. Returns the messages handed back.

        Raises:
            BrokerError: the transport could not pause or resume them.
        """
        async with self._lock:
            worker = self.worker
            target = frozenset(
                name for q in worker.queues if q in worker.paused for name in worker.levels[q]
            )
            applied, self.applied = self.applied, target
            transport = self.broker.transport
            if applied - target:
                await transport.resume(sorted(applied - target))
            if target - applied:
                await transport.unblock()
            if not target:
                return 0
            returned = await transport.pause(sorted(target))
            if returned:
                logger.info(
                    "handed back %d message(s) received ahead for paused queue(s) %s",
                    returned,
                    ", ".join(sorted(q for q in worker.queues if q in worker.paused)),
                )
            return returned
