"""The registry role of the state seam: known queues, live workers, counters, memory policy.
Used by workers (registration), producers (queue names) and inspection (CLI, dashboard).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

__all__ = ["RegistryState"]


class RegistryState(abc.ABC):
    """Known queues, live workers, paused queues and shutdown requests, counters, the memory
    policy."""

    @abc.abstractmethod
    async def known_queues(self) -> list[str]:
        """Queues that producers or workers have used in this namespace."""

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the registry of known queues (:meth:`known_queues`).

        The registry only serves inspection: a store may log rather than raise when it
        cannot write it. The default does nothing (a store whose transport lists its queues).
        """
        return

    @abc.abstractmethod
    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """Record a live worker for ``ttl`` seconds (refreshed by its maintenance loop)."""

    @abc.abstractmethod
    async def unregister_worker(self, worker_id: str, retired: tuple[int, int] = (0, 0)) -> None:
        """Remove a worker's registration and add ``retired`` (tasks processed, failed since
        its last registration) to the namespace's retired counts (:meth:`counters`
        ``retired_processed`` / ``retired_failed``), so its last counts are not lost."""

    @abc.abstractmethod
    async def workers(self) -> dict[str, bytes]:
        """Live workers: id to the info they registered."""

    async def lapsed_workers(self, limit: int = 100) -> dict[str, bytes]:
        """Take up to ``limit`` registrations whose ``ttl`` passed without a renewal or an
        unregistration: each is removed and returned (id to its last info) to one caller
        only. The default takes none (a store whose registrations vanish on their own)."""
        return {}

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause or resume ``queue`` for every worker; whether the state changed.

        Raises:
            NotImplementedError: a store without queue control.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot pause queues")

    async def paused_queues(self) -> set[str]:
        """The paused queue names (none where pausing is not supported)."""
        return set()

    async def request_shutdown(self, worker_id: str) -> None:
        """Ask a worker to shut down gracefully.

        Raises:
            NotImplementedError: a store without a control channel.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot reach workers")

    async def request_resize(self, worker_id: str, concurrency: int) -> None:
        """Ask a worker to run at most ``concurrency`` tasks at once from now on (the caller
        checks the number): pushed at once, and kept until the worker takes it
        (:meth:`take_resize`) should it miss the push.

        Raises:
            NotImplementedError: a store without a control channel.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot reach workers")

    async def take_resize(self, worker_id: str) -> int | None:
        """The concurrency asked of ``worker_id`` and not taken yet (removed as it is read),
        or ``None``."""
        return None

    async def counters(self) -> dict[str, int]:
        """Namespace-wide event counters kept by the broker, e.g. ``{"stale_completions": 2}``
        (completions dropped by fencing, see :meth:`complete`); absent counters are 0."""
        return {}

    async def memory_policy(self) -> tuple[str, int] | None:
        """The server's ``(maxmemory-policy, maxmemory in bytes)``, or ``None`` when the
        backend has no such setting or does not tell (see :mod:`blitzq.broker.eviction`)."""
        return None
