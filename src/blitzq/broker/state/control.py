"""The control role of the state seam: rate limits, unique keys, locks and cancellation.
Used by the extensions that enforce them (rate limits, unique tasks, locks) and by cancel.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..values import UniqueSend

__all__ = ["ControlState"]


class ControlState(abc.ABC):  # noqa: B024 - every method has a default
    """Rate-limit buckets, unique keys, locks, cancel marks and the event channel."""

    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Take one token from each ``(key, rate per second, capacity)`` token bucket.

        Returns:
            ``(reserved, wait)``: with ``reserved`` the tokens are taken (possibly on credit)
            and the caller may start after ``wait`` seconds without asking again; without it
            nothing was taken and the caller should ask again after ``wait`` seconds.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support rate limits")

    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """Claim unique-task keys: for each ``(key, task_id, ttl seconds)``, atomically set
        ``key`` to ``task_id`` for ``ttl`` seconds unless it is already held.

        Returns:
            Per item, ``None`` when this call claimed the key, else the id holding it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support unique tasks")

    async def enqueue_unique(self, items: Sequence[UniqueSend]) -> list[str | None]:
        """Enqueue unique tasks: for each item, in one atomic step, claim ``item.key`` for
        ``item.task_id`` for ``item.ttl`` seconds unless it is already held, and write the
        message when this call claimed it (into its queue, the queue's outbox, or on the
        schedule for a ``delay`` or ``eta``). A claim therefore never stands without its
        message: a call whose reply is lost left both or neither, and a key held by the
        item's own id (a retry of such a call) writes nothing again.

        Returns:
            Per item, ``None`` when the key holds the item's own id (claimed by this call or
            an earlier one with that id, its message written then), else the id of the task
            that holds it (a duplicate: nothing written).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support unique tasks")

    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """Take one of ``limit`` places of lock ``key`` for ``holder`` for ``lease`` seconds.

        Expired leases are dropped first; a holder already present renews its place.

        Returns:
            ``0.0`` when the place is taken, else seconds until the earliest lease expires.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support task locks")

    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """Renew ``(key, holder, lease seconds)`` places still held (a lapsed one is not
        taken back); return how many were renewed."""
        raise NotImplementedError(f"{type(self).__name__} does not support task locks")

    async def cancel(self, task_id: str, record: bytes, ttl: int, announce: bool = True) -> str:
        """Cancel a task and store ``record`` (state cancelled) for ``ttl`` seconds.

        Args:
            announce: ``False``: the task is marked revoked but no worker is told (no
                ``("revoke", task_id)`` event) until :meth:`announce_revoked` names it.

        Returns:
            ``"scheduled"`` (removed from the schedule: it never starts), ``"queued"`` or
            ``"pending"`` (marked revoked: a worker skips it), ``"running"`` (workers are told
            to cancel it), or ``"finished"`` (already in a final state: nothing changed).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    async def announce_revoked(self, task_ids: Sequence[str]) -> None:
        """Tell the workers that ``task_ids``, marked by :meth:`cancel` with ``announce=False``,
        are revoked: one ``("revoke", task_id)`` event each, in order.

        Raises:
            BrokerError: the broker could not be reached.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    async def revoked(self) -> dict[str, float]:
        """Cancelled task ids still marked, with the Unix time their mark expires."""
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    async def cancel_mark(self, task_id: str) -> float | None:
        """When the cancel mark of ``task_id`` expires (Unix seconds), or ``None`` when it
        has none (the default: no cancellation support).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return None

    def events(self) -> AsyncIterator[tuple[str, str]]:
        """Push notifications for workers: ``("revoke", task_id)`` and ``("schedule", eta)``
        (``("unknown", text)`` for anything else published there), and first
        ``("subscribed", "")`` once the subscription is in place: every push published after
        that is seen (the promoter then looks at the schedule once, for what was scheduled
        before).

        The iterator ends (or raises BrokerError) when the connection is lost; callers
        resubscribe and resynchronise.
        """
        raise NotImplementedError(f"{type(self).__name__} has no event channel")
