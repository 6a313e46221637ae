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
    async def register_worker(
        self,
        worker_id: str,
        info: bytes,
        ttl: float,
        counts: tuple[int, int] = (0, 0),
        base: tuple[int, int] = (0, 0),
        visibility_timeout: float | None = None,
        queues: Sequence[str] = (),
    ) -> None:
        """Record a live worker for ``ttl`` seconds (refreshed by its maintenance loop), and
        add to the namespace's counters (:meth:`counters` ``processed`` / ``failed``) what its
        counts grew by since the counts already added for ``worker_id``, atomically with the
        registration. The counters then only grow and count every worker's runs once, so a
        reader's rate is their difference between two reads, whenever it reads.

        Args:
            worker_id: the worker's key (unique per process).
            info: its registration record.
            ttl: seconds until the registration lapses without a renewal.
            counts: ``(succeeded, failed)`` runs of the worker since it started.
            base: the counts of the last registration the worker saw written: taken as
                already added only when the store has none recorded for ``worker_id`` (the
                first registration, ``(0, 0)``, or one after it lapsed). A call with counts
                lower than those recorded (two writes crossing) or sent again adds nothing.
            visibility_timeout: the worker's visibility timeout (seconds), which
                :meth:`worker_timeouts` reports while the registration lives; ``None``
                records none (the worker then counts as having the reader's timeout).
            queues: the queues the worker reads (physical names), added to the known queues
                (:meth:`known_queues`) with every registration, so that a store that lost
                them (a Redis restarted without persistence) knows them again by the
                worker's next heartbeat.
        """

    @abc.abstractmethod
    async def unregister_worker(self, worker_id: str, counts: tuple[int, int] = (0, 0)) -> None:
        """Remove a worker's registration and add what ``counts`` (its ``(succeeded,
        failed)`` runs since it started) has above the counts already added for it to the
        namespace's counters, so its last runs are counted too. A worker with none recorded
        (never registered, unregistered already, or its registration lapsed and was taken
        out by :meth:`lapsed_workers`) adds nothing."""

    @abc.abstractmethod
    async def workers(self) -> dict[str, bytes]:
        """Live workers: id to the info they registered."""

    async def lapsed_workers(self, limit: int = 100) -> dict[str, bytes]:
        """Take up to ``limit`` registrations whose ``ttl`` passed without a renewal or an
        unregistration: each is removed (its recorded counts too) and returned (id to its
        last info) to one caller only. The default takes none (a store whose
        registrations vanish on their own)."""
        return {}

    async def worker_timeouts(self, above: float) -> dict[str, float]:
        """The live workers (registration not lapsed) that registered a visibility timeout
        longer than ``above`` seconds: worker key (its consumer name) to that timeout in
        seconds. A worker's recovery reads it once per round and leaves those workers'
        leases alone until idle that long (docs/guarantees.md, mixed timeouts). The default
        reports none (a store that keeps no timeouts: every holder counts as having the
        recoverer's timeout)."""
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
        (completions dropped by fencing, see :meth:`complete`), ``processed`` / ``failed``
        (every worker's runs that succeeded / failed, as their registrations reported them:
        :meth:`register_worker`); absent counters are 0."""
        return {}

    async def memory_policy(self) -> tuple[str, int] | None:
        """The server's ``(maxmemory-policy, maxmemory in bytes)``, or ``None`` when the
        backend has no such setting or does not tell (see :mod:`blitzq.broker.eviction`)."""
        return None

    async def memory_use(self) -> tuple[int, int] | None:
        """``(bytes counted against maxmemory, maxmemory in bytes)`` (``0``: no limit), or
        ``None`` when the backend has no such setting or does not tell. A server whose use
        reaches its ``maxmemory`` refuses writes under ``noeviction`` (``OOM``)."""
        return None
