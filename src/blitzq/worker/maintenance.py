"""Background loops of a worker: promoter, registration, lease renewal and recovery."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..broker.base import Broker
from ..exceptions import BrokerError

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

#: Longest the promoter sleeps when nothing is scheduled (seconds).
PROMOTER_IDLE = 0.25
#: Messages moved per promote call.
PROMOTE_BATCH = 1000
#: Abandoned messages examined per recover call.
RECOVER_BATCH = 200


class Maintenance:
    """Runs the worker's background loops.

    Args:
        worker: the owning worker.
        broker: its broker.
    """

    def __init__(self, worker: Worker, broker: Broker) -> None:
        self.worker = worker
        self.broker = broker
        vt = worker.queue.visibility_timeout
        #: seconds between lease renewals / recovery checks: a third of the visibility
        #: timeout, so two renewals can fail before a lease lapses.
        self.interval = max(0.05, min(vt / 3, 10.0))

    def start(self) -> list[asyncio.Task[None]]:
        """Start the loops; the worker cancels them at shutdown."""
        tasks = [
            asyncio.create_task(self._promote_loop(), name="blitzq-promoter"),
            asyncio.create_task(self._maintain_loop(), name="blitzq-maintenance"),
        ]
        return tasks

    async def _promote_loop(self) -> None:
        broker = self.broker
        while True:
            try:
                moved, next_eta = await broker.promote_due(time.time(), PROMOTE_BATCH)
            except BrokerError as exc:
                logger.warning("promoter: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if moved >= PROMOTE_BATCH:
                continue
            wait = PROMOTER_IDLE
            if next_eta is not None:
                wait = min(wait, max(0.0, next_eta - time.time()))
            await asyncio.sleep(wait)

    async def _maintain_loop(self) -> None:
        worker, broker = self.worker, self.broker
        queue = worker.queue
        vt = queue.visibility_timeout
        rounds = 0
        prune_every = max(1, int(60 / self.interval))
        while True:
            try:
                await broker.register_worker(worker.id, worker.info(), ttl=3 * self.interval + 5)
                if broker.supports_recovery:
                    for q in worker.queues:
                        tokens = worker.running_tokens(q)
                        if tokens:
                            await broker.heartbeat(q, tokens)
                        await self._recover(q, vt)
                        if rounds % prune_every == 0:
                            await self._prune(q, vt)
                rounds += 1
            except BrokerError as exc:
                logger.warning("maintenance: %s", exc)
            await asyncio.sleep(self.interval)

    async def _prune(self, q: str, vt: float) -> None:
        prune = getattr(self.broker, "prune_consumers", None)
        if prune is not None:
            await prune(q, max(600.0, 10 * vt))

    async def _recover(self, q: str, vt: float) -> None:
        queue = self.worker.queue
        while True:
            requeued, dead = await self.broker.recover(
                q, vt, RECOVER_BATCH, queue.max_deliveries, queue.result_ttl
            )
            if requeued or dead:
                logger.warning(
                    "recovered %d abandoned message(s) on %s, dead-lettered %d", requeued, q, dead
                )
            if requeued + dead < RECOVER_BATCH:
                return
