"""The note of a task's end in its queue's index of ended tasks (the dashboard's task list).

A final completion carries ``Completion.ended``: ``"<state>\\n<task>\\n<task_id>"`` with the
index's cap and TTL (the Queue's ``recent_index`` and ``result_ttl``), which ``complete.lua``
adds to ``{ns}:recent:<queue>`` in the batch's one round trip. A run that goes on (a retry,
a requeue) notes nothing. A run with nothing to write (a fast-mode success without a record)
has no round trip to ride in: its note waits in :class:`EndNotes`, which writes what
piled up once a second (:meth:`~blitzq.broker.Broker.add_ended`, one transaction per queue),
so such a run costs a list append, not a write of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ..broker import Completion
from ..exceptions import BrokerError

if TYPE_CHECKING:
    from ..broker import Broker
    from .execution import Job

__all__ = ["FLUSH_EVERY", "MAX_PENDING", "EndNotes"]

logger = logging.getLogger("blitzq.worker")

#: Seconds between two writes of the pending notes.
FLUSH_EVERY = 1.0
#: Notes kept waiting at most (the oldest are dropped past it: a broker long down).
MAX_PENDING = 100_000


class EndNotes:
    """The notes of one worker's ended runs (module docstring).

    Args:
        cap: the index's entries kept per queue (the Queue's ``recent_index``).
        ttl: seconds the index lives after its last write (the Queue's ``result_ttl``).

    Attributes:
        broker: where pending notes are written; ``None`` until the worker's maintenance
            starts :meth:`loop` (a run with nothing to write then gets a completion).
    """

    def __init__(self, cap: int, ttl: int) -> None:
        self.cap = cap
        self.ttl = ttl
        self.broker: Broker | None = None
        self._pending: list[tuple[str, str]] = []

    def note(
        self, job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
    ) -> Completion | None:
        """``completion`` with the end of ``job`` noted (module docstring).

        Args:
            job: the run.
            completion: what is written for it (``None``: nothing).
            error: the run's exception, or ``None``.
            cancelled: the completion records a cancellation.
        """
        if completion is not None and (
            completion.reschedule is not None or completion.requeue is not None
        ):
            return completion
        if cancelled:
            state = "cancelled"
        elif completion is not None and completion.dead_letter is not None:
            state = "dead_lettered"
        elif error is not None or job.encode_error is not None:
            state = "failed"
        else:
            state = "succeeded"
        env = job.envelope
        member = f"{state}\n{env.task}\n{env.id}"
        if completion is None:
            if self.broker is not None:
                pending = self._pending
                pending.append((job.delivery.queue, member))
                if len(pending) > MAX_PENDING:
                    del pending[: len(pending) - MAX_PENDING]
                return None
            return Completion(job.delivery.queue, None, env.id, ended=(member, self.cap, self.ttl))
        # Set in place, not copied (dataclasses.replace costs ~6 us): the completion is this
        # run's own and nothing has seen it yet (the flusher gets it next).
        object.__setattr__(completion, "ended", (member, self.cap, self.ttl))
        return completion

    async def flush(self, broker: Broker | None = None) -> None:
        """Write the pending notes, one transaction per queue, scored now (the order they
        ended in, a microsecond apart), to ``broker`` (default :attr:`broker`).

        Raises:
            BrokerError: the broker could not be reached (those notes are dropped).
        """
        broker = broker or self.broker
        notes, self._pending = self._pending, []
        if not notes or broker is None:
            return
        now = time.time()
        by_queue: dict[str, dict[str, float]] = {}
        for i, (queue, member) in enumerate(notes):
            by_queue.setdefault(queue, {})[member] = now + i / 1_000_000
        for queue, members in by_queue.items():
            await broker.add_ended(queue, members, self.cap, self.ttl)

    async def loop(self) -> None:
        """Write the pending notes every :data:`FLUSH_EVERY` seconds until cancelled, and
        once more then (bounded: 2 s); the notes of runs that end later (during a graceful
        shutdown) go with completions of their own, which the flusher writes."""
        try:
            while True:
                await asyncio.sleep(FLUSH_EVERY)
                try:
                    await self.flush()
                except BrokerError as exc:
                    logger.debug("recent: could not write the ended tasks: %s", exc)
        finally:
            broker, self.broker = self.broker, None  # later runs' notes ride in completions
            with contextlib.suppress(BrokerError, TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.flush(broker), 2.0)
