"""The browse role of the state seam: what the dashboard lists and charts.

The index of the tasks that ended from each queue (written by the completions,
``Completion.ended``), the schedule and the waiting messages read a page at a time, the
workers' time series of counts and latencies, and the paused periodic entries. A backend
that keeps none of it inherits the defaults (empty answers; the writes refuse).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

__all__ = ["BrowseState"]


class BrowseState(abc.ABC):  # noqa: B024 - every method has a default
    """Listing and charting reads of a state store (module docstring)."""

    async def ended_tasks(
        self, queues: Sequence[str], before: float | None, after: float | None, limit: int
    ) -> list[tuple[float, str, str]]:
        """The newest tasks that ended from ``queues`` (physical names) with an end time
        (Unix seconds) below ``before`` and at or above ``after`` (``None``: unbounded), at
        most ``limit`` of them, newest first: ``(ended_at, queue, "<state>\\n<task>\\n<id>")``.
        """
        return []

    async def add_ended(
        self, queue: str, members: Sequence[str], now: float, cap: int, ttl: int
    ) -> None:
        """Add ``members`` (``"<state>\\n<task>\\n<id>"``, in the order they ended) to the
        index of ended tasks of physical ``queue``, all ended at ``now`` (Unix seconds; the
        Redis store packs them in entries of 1,000), keep its newest ``cap`` at least (the
        Redis store: fewer than ``cap`` plus its oldest entry's) and let it expire ``ttl``
        seconds later (what ``complete.lua`` does for a completion's note)."""
        return

    async def scheduled_tasks(
        self, after: float | None, limit: int
    ) -> list[tuple[float, str, bytes]]:
        """Scheduled tasks due after ``after`` (Unix seconds, exclusive; ``None``: all),
        soonest first, at most ``limit``: ``(due, task_id, "<kind><queue>\\n<message>")``
        (data ``b""`` when gone meanwhile)."""
        return []

    async def waiting_messages(self, queue: str, offset: int, limit: int) -> list[bytes]:
        """Messages of physical ``queue`` in the order they are taken (a stream's include
        those taken and not yet acknowledged), from ``offset``, at most ``limit``."""
        return []

    async def add_sample(
        self, slot: int, counts: Mapping[str, int], gauges: Mapping[str, int], ttl: int
    ) -> None:
        """Add ``counts`` to the time slot ``slot``'s fields and set its ``gauges``; the slot
        expires ``ttl`` seconds later."""
        return

    async def samples(self, slots: Sequence[int]) -> list[dict[str, int]]:
        """The fields of each slot of ``slots``, in order (``{}`` for one without samples)."""
        return [{} for _ in slots]

    async def paused_periodic(self) -> set[str]:
        """Names of the paused periodic entries."""
        return set()

    async def set_periodic_paused(self, name: str, paused: bool) -> bool:
        """Pause (``True``) or resume the periodic entry ``name``; whether that changed it."""
        raise NotImplementedError(f"{type(self).__name__} cannot pause periodic entries")
