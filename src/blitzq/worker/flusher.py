"""Group commit: one coroutine writes completions, many per round-trip under load.

Completions queue up while one batch is in flight and all go in the next; there is no timer, so
at light load a completion costs one round-trip of latency and under heavy load hundreds share
one. A batch that fails (broker down) is kept and retried with backoff, never dropped.
"""

from __future__ import annotations

import asyncio
import logging

from ..broker.base import Broker, Completion
from ..exceptions import BrokerError

logger = logging.getLogger("blitzq.worker")


class Flusher:
    """Collects completions and applies them in batches.

    Args:
        broker: where to apply them.
        max_batch: most completions in one round-trip.
    """

    def __init__(self, broker: Broker, max_batch: int = 2000) -> None:
        self.broker = broker
        self.max_batch = max_batch
        self._pending: list[Completion] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def add(self, completion: Completion) -> None:
        """Queue a completion for the next batch."""
        self._pending.append(completion)
        self._idle.clear()
        self._wake.set()

    @property
    def backlog(self) -> int:
        """Completions not yet written."""
        return len(self._pending)

    async def run(self) -> None:
        """Write batches until :meth:`close` is called and nothing is left."""
        delay = 0.05
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._pending[: self.max_batch]
            try:
                await self.broker.complete(batch)
            except BrokerError as exc:
                if not exc.transient:
                    await self._isolate(batch, exc)
                    del self._pending[: len(batch)]
                    continue
                logger.warning(
                    "completion batch of %d failed, retrying in %.2f s: %s", len(batch), delay, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except Exception as exc:  # a completion that cannot even be sent (a bug)
                logger.exception("completion batch of %d could not be sent", len(batch))
                await self._isolate(batch, BrokerError(f"{type(exc).__name__}: {exc}", False))
                del self._pending[: len(batch)]
                continue
            delay = 0.05
            del self._pending[: len(batch)]

    async def _isolate(self, batch: list[Completion], error: BrokerError) -> None:
        """A batch the server refused (or that could not be sent): apply its completions one
        by one, drop the bad ones.

        A dropped completion's delivery is not acknowledged, so in reliable mode the message
        is delivered again (and dead-lettered after ``max_deliveries``); nothing else waits.
        """
        logger.error("completion batch of %d refused by the broker: %s", len(batch), error)
        for completion in batch:
            try:
                await self.broker.complete([completion])
            except BrokerError as exc:
                if exc.transient:
                    self._pending.append(completion)
                else:
                    logger.error("dropped the completion of task %s: %s", completion.task_id, exc)
            except Exception:
                logger.exception("dropped the completion of task %s", completion.task_id)

    async def flush(self) -> None:
        """Return once everything queued so far is written."""
        while self._pending:
            self._wake.set()
            await self._idle.wait()

    def close(self) -> None:
        """Ask :meth:`run` to return once the backlog is written."""
        self._closing = True
        self._wake.set()
