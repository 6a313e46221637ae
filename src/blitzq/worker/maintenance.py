"""Background loops of a worker: promoter, event listener, registration, leases, recovery.

- The promoter moves due scheduled messages (delays, retries, rate-limited tasks) to their
  queues. Due times are decided on the broker's clock (Redis ``TIME`` inside the scripts),
  never this worker's: the promoter sleeps the broker-relative remaining seconds until the
  earliest due time, and is woken early when any process schedules an earlier one (a push
  on the namespace's event channel, naming a due time on the broker's clock), so it never
  polls blindly; a 1 s ceiling covers a lost push.
- The event listener follows cancellations as they are published and cancels running tasks
  at once; a full resynchronisation every few seconds covers a lost push.
- Maintenance registers the worker and, in reliable mode, renews the leases of running tasks
  every ``visibility_timeout / 3`` and recovers messages abandoned by dead workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ..broker.base import Broker
from ..exceptions import BrokerError

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

#: Longest the promoter sleeps without a push (seconds).
PROMOTER_CEILING = 1.0
#: Messages moved per promote call.
PROMOTE_BATCH = 1000
#: Abandoned messages examined per recover call.
RECOVER_BATCH = 200
#: Seconds between full re-reads of the cancelled task ids.
REVOCATION_SYNC = 5.0


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
        self._wake = asyncio.Event()
        self._next_wake = 0.0

    async def start(self) -> list[asyncio.Task[None]]:
        """Load the cancelled ids, then start the loops; the worker cancels them at shutdown."""
        try:
            await self._sync_revocations()
        except BrokerError as exc:
            logger.warning("could not read cancelled tasks: %s", exc)
        return [
            asyncio.create_task(self._promote_loop(), name="blitzq-promoter"),
            asyncio.create_task(self._event_loop(), name="blitzq-events"),
            asyncio.create_task(self._maintain_loop(), name="blitzq-maintenance"),
        ]

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
                logger.warning("promoter: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if moved >= PROMOTE_BATCH:
                continue
            # ``now`` and ``next_eta`` are both the broker's clock: only their difference
            # (the remaining seconds) is used here, so this worker's clock plays no part.
            wait = PROMOTER_CEILING
            if next_eta is not None:
                wait = min(wait, max(0.0, next_eta - now))
            self._next_wake = now + wait
            if wait <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _event_loop(self) -> None:
        runner = self.worker.runner
        ttl = self.worker.queue.result_ttl
        while True:
            try:
                async for kind, value in self.broker.events():
                    if kind == "revoke":
                        runner.revoked[value] = time.time() + ttl
                        if runner.cancel(value):
                            logger.info("cancelled running task %s", value)
                    elif kind == "schedule":
                        self.schedule_changed(float(value))
            except BrokerError as exc:
                logger.debug("event listener: %s", exc)
            except NotImplementedError:
                return
            await asyncio.sleep(0.5)

    async def _sync_revocations(self) -> None:
        runner = self.worker.runner
        try:
            revoked = await self.broker.revoked()
        except NotImplementedError:
            return
        now = time.time()
        runner.revoked = {task_id: expiry for task_id, expiry in revoked.items() if expiry > now}

    async def _maintain_loop(self) -> None:
        worker, broker = self.worker, self.broker
        queue = worker.queue
        vt = queue.visibility_timeout
        rounds = 0
        prune_every = max(1, int(60 / self.interval))
        next_sync = time.monotonic() + REVOCATION_SYNC
        while True:
            try:  # alone: a refused registration (server out of memory) must not stop renewals
                await broker.register_worker(worker.id, worker.info(), ttl=3 * self.interval + 5)
            except BrokerError as exc:
                logger.warning("maintenance: could not register the worker: %s", exc)
            try:
                if broker.supports_recovery:
                    for q in worker.physical_queues:
                        tokens = worker.running_tokens(q)
                        if tokens:
                            await broker.heartbeat(q, tokens)
                        await self._recover(q, vt)
                        if rounds % prune_every == 0:
                            await self._prune(q, vt)
                if time.monotonic() >= next_sync:
                    next_sync = time.monotonic() + REVOCATION_SYNC
                    await self._sync_revocations()
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
