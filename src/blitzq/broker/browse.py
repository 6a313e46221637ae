"""The facade's delegation of the browse role: what the dashboard lists and charts
(:class:`~.state.browse.BrowseState`); :class:`BrowseFacade` is the
:class:`~blitzq.broker.Broker`'s delegation of its methods to the state store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import StateStore


class BrowseFacade:
    """The Broker's delegation of :class:`~.state.browse.BrowseState` to its state store."""

    state: StateStore

    async def ended_tasks(
        self, queues: Sequence[str], before: float | None, after: float | None, limit: int
    ) -> list[tuple[float, str, str]]:
        """See :meth:`~.state.browse.BrowseState.ended_tasks`."""
        return await self.state.ended_tasks(queues, before, after, limit)

    async def add_ended(
        self, queue: str, members: Sequence[str], now: float, cap: int, ttl: int
    ) -> None:
        """See :meth:`~.state.browse.BrowseState.add_ended`."""
        await self.state.add_ended(queue, members, now, cap, ttl)

    async def scheduled_tasks(
        self, after: float | None, limit: int
    ) -> list[tuple[float, str, bytes]]:
        """See :meth:`~.state.browse.BrowseState.scheduled_tasks`."""
        return await self.state.scheduled_tasks(after, limit)

    async def waiting_messages(self, queue: str, offset: int, limit: int) -> list[bytes]:
        """See :meth:`~.state.browse.BrowseState.waiting_messages`."""
        return await self.state.waiting_messages(queue, offset, limit)

    async def add_sample(
        self, slot: int, counts: Mapping[str, int], gauges: Mapping[str, int], ttl: int
    ) -> None:
        """See :meth:`~.state.browse.BrowseState.add_sample`."""
        await self.state.add_sample(slot, counts, gauges, ttl)

    async def samples(self, slots: Sequence[int]) -> list[dict[str, int]]:
        """See :meth:`~.state.browse.BrowseState.samples`."""
        return await self.state.samples(slots)

    async def paused_periodic(self) -> set[str]:
        """See :meth:`~.state.browse.BrowseState.paused_periodic`."""
        return await self.state.paused_periodic()

    async def set_periodic_paused(self, name: str, paused: bool) -> bool:
        """See :meth:`~.state.browse.BrowseState.set_periodic_paused`."""
        return await self.state.set_periodic_paused(name, paused)
