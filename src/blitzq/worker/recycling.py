"""Recycling worker processes past a task count or a memory size (``--max-tasks-per-child``,
``--max-memory-per-child``; Celery's names): the guard against leaks in task code.

- **The worker process.** The runner counts the runs it starts
  (:meth:`~blitzq.worker.runner.Runner.count_start`): as the ``max_tasks_per_child``-th
  starts, :func:`recycle_after` stops the worker, and no run starts after it: a delivery
  already fetched (the rest of a fetch batch, one awaiting its start checks) is handed back
  untouched (:meth:`~blitzq.worker.runner.Runner.give_back`), for the next process; and
  :class:`Recycler` runs beside the maintenance loops, comparing the process's resident
  memory with ``max_memory_per_child`` every :data:`CHECK_INTERVAL` seconds. Either way the
  worker stops gracefully (it stops fetching at once, finishes its running tasks, puts back
  what it fetched and did not start) and
  ``blitzq worker`` exits with :data:`~blitzq.worker.worker.EXIT_RESTART` (75), which the
  supervisor takes as a planned restart, not a crash.
- **Process-pool children** (``executor="process"``). ``max_tasks_per_child`` is the pool's
  own (:class:`concurrent.futures.ProcessPoolExecutor` replaces a child after that many
  calls); past ``max_memory_per_child`` after a call, :func:`pool_over_memory` names the
  child and the worker replaces the whole pool: calls running in the old one finish there,
  new calls go to fresh processes.

Memory is the resident set size read from ``/proc/<pid>/statm`` (Linux); elsewhere it is
unknown and never trips.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Protocol

logger = logging.getLogger("blitzq.worker")


class Restartable(Protocol):
    """What recycling sees of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def stopping(self) -> bool: ...

    def request_restart(self, reason: str, level: int = logging.ERROR) -> None: ...


#: Seconds between two checks of the worker's task count and memory.
CHECK_INTERVAL = 0.2
#: Bytes in one megabyte of ``--max-memory-per-child`` (MiB).
MB = 1024 * 1024

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | None = None) -> int | None:
    """Resident memory of process ``pid`` (default: this one) in bytes, from
    ``/proc/<pid>/statm``; ``None`` when it cannot be read (not Linux, process gone)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def pool_over_memory(pids: Iterable[int], limit: int) -> bool:
    """Whether one of the process-pool children ``pids`` holds more than ``limit`` resident
    bytes (the first one found is logged at WARNING: the pool is about to be replaced)."""
    for pid in pids:
        rss = rss_bytes(pid)
        if rss is not None and rss > limit:
            logger.warning(
                "process-pool child %d holds %.0f MB, above max-memory-per-child %.0f MB: "
                "replacing the pool",
                pid,
                rss / MB,
                limit / MB,
            )
            return True
    return False


def recycle_after(worker: Restartable, started: int) -> None:
    """Ask ``worker`` for a planned restart as its ``started``-th run starts (the last one
    ``max_tasks_per_child`` allows): it stops fetching at once and finishes that run."""
    worker.request_restart(
        f"started {started} task(s), max-tasks-per-child is {started} (recycling)",
        level=logging.WARNING,
    )


class Recycler:
    """Stop ``worker`` to be restarted past its memory limit; see the module docstring.

    Args:
        worker: the running worker.
        max_memory: resident bytes above which it recycles.
    """

    def __init__(self, worker: Restartable, max_memory: int) -> None:
        self.worker = worker
        self.max_memory = max_memory

    async def run(self) -> None:
        """Check every :data:`CHECK_INTERVAL` seconds until the limit is passed (then ask the
        worker for a planned restart) or until cancelled."""
        worker = self.worker
        while not worker.stopping:
            reason = self.reason()
            if reason is not None:
                worker.request_restart(reason, level=logging.WARNING)
                return
            await asyncio.sleep(CHECK_INTERVAL)

    def reason(self) -> str | None:
        """Why the worker must be recycled now, or ``None``."""
        rss = rss_bytes()
        if rss is not None and rss > self.max_memory:
            return (
                f"resident memory {rss / MB:.0f} MB is above max-memory-per-child "
                f"{self.max_memory / MB:.0f} MB (recycling)"
            )
        return None
