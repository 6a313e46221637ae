"""The liveness plane of the seams: whether a task can still end, and keeping its record
while it runs.

- :meth:`LivenessState.trace_task` tells a task still to come (a record, on the schedule, a
  message in its queue) from one gone for good, so a result wait can end
  (:class:`~blitzq.ResultExpired`) instead of waiting for a record that cannot arrive.
- :meth:`LivenessState.keep_running` keeps a run's ``running`` record (``track_state``)
  alive while the run goes on, however short ``result_ttl`` is.
- :meth:`LivenessState.cancel_mark` tells whether a cancel of a task is pending (``inspect``
  reads a running task's record as ``cancelling`` meanwhile).

:class:`LivenessState` is part of every :class:`~blitzq.broker.state.StateStore` (with
defaults for a backend that cannot tell); :class:`LivenessFacade` is the
:class:`~blitzq.broker.Broker`'s delegation of the same methods to its state store.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import StateStore


class LivenessState(abc.ABC):  # noqa: B024 - every method has a default
    """Task liveness of a state store (module docstring)."""

    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """Whether ``task_id`` is known anywhere, in one atomic look: ``True`` when it has a
        record, waits on the schedule or has a message (waiting or in flight) in its
        physical ``queue``; ``False`` when it is known nowhere (its result cannot arrive);
        ``None`` when the store cannot tell (the default).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return None

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """Give the ``running`` records of ``task_ids`` (runs this worker holds) at least
        ``ttl`` seconds to live; a record in another state is left alone. Returns how many
        were extended (the default: none, records expire as written).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return 0

    async def cancel_mark(self, task_id: str) -> float | None:
        """When the cancel mark of ``task_id`` expires (Unix seconds), or ``None`` when it
        has none (the default: no cancellation support).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return None


class LivenessFacade:
    """The Broker's delegation of :class:`LivenessState` to its state store."""

    state: StateStore

    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """See :meth:`LivenessState.trace_task`."""
        return await self.state.trace_task(task_id, queue)

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """See :meth:`LivenessState.keep_running`."""
        return await self.state.keep_running(task_ids, ttl)

    async def cancel_mark(self, task_id: str) -> float | None:
        """See :meth:`LivenessState.cancel_mark`."""
        return await self.state.cancel_mark(task_id)
