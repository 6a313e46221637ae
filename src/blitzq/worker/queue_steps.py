"""The per-queue steps of a maintenance round (lease renewal, recovery), each on its own,
and the recovery step itself (:func:`recover_queue`).

A queue whose step fails for a while (its Redis Cluster slot migrating, its node failing
over) must hold up neither the other queues' lease renewals nor their recoveries, or their
leases lapse meanwhile and their running tasks are taken over and run twice. Each step is
therefore awaited alone (:meth:`QueueSteps.alone`): a transient failure is logged once per
step and queue until it succeeds again, and the next round tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from ..broker import Broker
from ..broker.transport import backstop_note, delivery_backstop
from ..exceptions import BrokerError

if TYPE_CHECKING:
    from ..seams import QueueSettings

__all__ = ["RECOVER_BATCH", "QueueSteps", "recover_queue"]

logger = logging.getLogger("blitzq.worker")

#: Abandoned messages examined per recover call.
RECOVER_BATCH = 200


class _Recovering(Protocol):
    """What :func:`recover_queue` reads of the worker."""

    @property
    def id(self) -> str: ...

    @property
    def queue(self) -> QueueSettings: ...

    @property
    def failure_log_level(self) -> int: ...


class QueueSteps:
    """Awaits a maintenance round's per-queue steps one by one, logging their transient
    failures once per condition."""

    __slots__ = ("_failing",)

    def __init__(self) -> None:
        #: (step, queue) whose last try failed transiently.
        self._failing: set[tuple[str, str]] = set()

    async def alone(self, what: str, queue: str, step: Awaitable[object]) -> None:
        """Await ``step`` (``what`` for physical queue ``queue``: "leases" for their
        renewal, "recovery"). A transient :class:`~blitzq.BrokerError` is logged at WARNING
        the first time (at DEBUG when the lost connection was reported already, and for each
        further failure) and swallowed: the next round tries again; the first success after
        it is logged at INFO.

        Raises:
            BrokerError: a failure that is not transient (the server refused the step).
        """
        key = (what, queue)
        try:
            await step
        except BrokerError as exc:
            if not exc.transient:
                raise
            if key in self._failing:
                logger.debug("maintenance: %s on %s failed again: %s", what, queue, exc)
                return
            self._failing.add(key)
            level = logging.DEBUG if exc.reported else logging.WARNING
            logger.log(
                level, "maintenance: %s on %s failed, retried each round: %s", what, queue, exc
            )
            return
        if key in self._failing:
            self._failing.discard(key)
            logger.info("maintenance: %s on %s works again", what, queue)


async def recover_queue(
    broker: Broker,
    worker: _Recovering,
    q: str,
    vt: float,
    holders: Mapping[str, float],
    judge: Callable[[], bool] = lambda: True,
) -> None:
    """Recover physical queue ``q``'s abandoned deliveries, :data:`RECOVER_BATCH` a call,
    until a call finds fewer: each is published again, or dead-lettered past the backstop of
    ``max_deliveries`` (``transport.delivery_backstop``); both are logged.

    Args:
        broker: the worker's broker.
        worker: the worker (its id, queue settings and failure log level).
        q: physical queue.
        vt: seconds a delivery may go without renewal before it is abandoned.
        holders: live workers' own visibility timeouts by consumer (``Broker.worker_timeouts``).
        judge: asked right before each call (nothing awaited in between); ``False`` stops
            the recovery: this worker was just paused, so the other workers' silence is not
            judged yet (:class:`~blitzq.worker.peers.PeerGrace`).

    Raises:
        BrokerError: the broker could not be reached, or refused the recovery.
    """
    queue = worker.queue
    backstop = delivery_backstop(queue.max_deliveries)
    while judge():
        requeued, dead = await broker.recover(
            q, vt, RECOVER_BATCH, backstop, queue.result_ttl, holders
        )
        if requeued:
            logger.warning("recovered %d abandoned message(s) on %s", requeued, q)
        if dead:  # final failures: at the worker's failure level, as a failed task's
            logger.log(
                worker.failure_log_level,
                "dead-lettered %d abandoned message(s) on %s: delivered %d times (%s)",
                dead,
                q,
                backstop,
                backstop_note(backstop, queue.max_deliveries),
                extra={
                    "queue": q,
                    "worker_id": worker.id,
                    "outcome": "dead_lettered",
                    "reason": "max deliveries exceeded",
                    "count": dead,
                },
            )
        if requeued + dead < RECOVER_BATCH:
            return
