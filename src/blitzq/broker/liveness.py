"""The facade's delegation of task liveness: whether a task can still end, and keeping its
record while it runs.

- :meth:`~.state.RecordsState.trace_task` tells a task still to come (a record, on the schedule, a
  message in its queue) from one gone for good, so a result wait can end
  (:class:`~blitzq.ResultExpired`) instead of waiting for a record that cannot arrive.
- :meth:`~.state.RecordsState.keep_running` keeps a run's ``running`` record (``track_state``)
  alive while the run goes on, however short ``result_ttl`` is.
- :meth:`~.state.ControlState.cancel_mark` tells whether a cancel of a task is pending (``inspect``
  reads a running task's record as ``cancelling`` meanwhile).

:class:`LivenessFacade` is the :class:`~blitzq.broker.Broker`'s delegation of these methods
to its state store (the methods belong to the records and control roles of the seam, with
defaults for a backend that cannot tell).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import StateStore


class LivenessFacade:
    """The Broker's delegation of the liveness methods to its state store."""

    state: StateStore

    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """See :meth:`~.state.RecordsState.trace_task`."""
        return await self.state.trace_task(task_id, queue)

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """See :meth:`~.state.RecordsState.keep_running`."""
        return await self.state.keep_running(task_ids, ttl)

    async def cancel_mark(self, task_id: str) -> float | None:
        """See :meth:`~.state.ControlState.cancel_mark`."""
        return await self.state.cancel_mark(task_id)
