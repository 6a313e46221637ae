"""The note of a task's end in its queue's index of ended tasks (the dashboard's task list).

A run that ends for good (not a retry, not a requeue) leaves ``"<state>\\n<task>\\n<task_id>"``
in :class:`EndNotes`, which writes what piled up once a second
(:meth:`~blitzq.broker.state.BrowseState.add_ended`, one write per queue: the Redis store
packs the second's notes of a queue in one member of its index, ``recent.lua`` adds it, cuts
the oldest members past ``recent_index`` notes and sets the expiry, ``result_ttl``), off the
completions' path: a run costs a list append, and the server's work is per write, not per
run. Before the worker's maintenance starts the writes and after it
stopped them (a graceful shutdown's last runs), a note rides in the run's completion
instead (``Completion.ended``), which ``complete.lua`` applies in the batch's own round trip. A note
is lost with its worker if it dies within the second: the index is a view, not a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
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
            starts :meth:`loop` and after it stopped (notes then ride in completions).
    """

    def __init__(self, cap: int, ttl: int) -> None:
        self.cap = cap
        self.ttl = ttl
        self.broker: Broker | None = None
        self._pending: deque[tuple[str, str]] = deque(maxlen=MAX_PENDING)

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
        if self.broker is not None:
            self._pending.append((job.delivery.queue, member))
            return completion
        if completion is None:
            return Completion(job.delivery.queue, None, env.id, ended=(member, self.cap, self.ttl))
        # Set in place, not copied (dataclasses.replace costs ~6 us): the completion is this
        # run's own and nothing has seen it yet (the flusher gets it next).
        object.__setattr__(completion, "ended", (member, self.cap, self.ttl))
        return completion

    async def flush(self, broker: Broker | None = None) -> None:
        """Write the pending notes to ``broker`` (default :attr:`broker`), one write per
        queue, all at the time now (kept in the order they ended in).

        Raises:
            BrokerError: the broker could not be reached (those notes are dropped).
        """
        broker = broker or self.broker
        notes, self._pending = self._pending, deque(maxlen=MAX_PENDING)
        if not notes or broker is None:
            return
        by_queue: dict[str, list[str]] = {}
        for queue, member in notes:
            by_queue.setdefault(queue, []).append(member)
        now = time.time()
        for queue, members in by_queue.items():
            await broker.state.browse.add_ended(queue, members, now, self.cap, self.ttl)

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
