"""The CPU pool: sync task bodies in child processes forked from a pre-warmed forkserver.

A task declared ``executor="cpu"`` (or a sync task left on its default executor under
``blitzq worker --pool cpu``) runs in a child process, so the worker's event loop never
computes. The children are forked by :mod:`multiprocessing`'s *forkserver*, started when the
worker starts with the task modules already imported (:meth:`.cpu_pool.CpuPool.warm`): a
child costs a fork, not an interpreter start and an import of the application, and it
inherits no thread, lock or connection of the worker.

- **Each child leads its own process group** (``setpgid`` as it starts). A hard timeout or a
  cancel SIGKILLs that group only (:meth:`.cpu_pool.CpuPool.kill`): the child and whatever it
  started die, the calls running in the other children go on and finish normally (they are not
  requeued, unlike the ``process`` executor, whose pool is terminated whole). The run's slot
  is freed once the killed child has been reaped.
- **Children are recycled** after ``max_tasks`` calls, or after a call that leaves their
  resident memory (``/proc/<pid>/statm``, Linux) above ``max_memory`` bytes: the child exits
  between two calls and the next call gets a fresh one.
- **A forkserver the OS refuses** (fork fails, the forkserver died and cannot be started
  again) is not worked around in the worker: the pool calls its ``refused`` callback, the
  worker stops gracefully and ``blitzq worker`` exits :data:`EXIT_FORKSERVER` (71,
  ``EX_OSERR``), which the supervisor answers by starting a fresh worker; the call that could
  not start goes back on its queue (:class:`ForkRefused`), its attempt unchanged.
- Children die with the worker, however it ends: each holds the read end of a *lifeline*
  pipe whose write end only the worker holds, and a thread of the child SIGKILLs the child's
  process group (the child and what it started) when the pipe reaches end-of-file. They are
  also daemonic (terminated at the worker's normal exit) and, on Linux, get
  ``PR_SET_PDEATHSIG`` against the forkserver. Being daemonic, a child cannot start
  :mod:`multiprocessing` processes of its own.

POSIX only (:func:`check_supported` raises :class:`~blitzq.exceptions.ConfigurationError`
elsewhere).

This module is the worker's side (which tasks run on the pool, the options, the pool made on
first use); the pool and its children are ``cpu_pool.py``, imported with the first pool, so a
worker without one loads neither it nor :mod:`multiprocessing` (issue 29: memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._checks import byte_size, integer
from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from ..task import Task

#: Exit code of ``blitzq worker`` when its CPU pool's forkserver could not start a child
#: (``EX_OSERR`` of sysexits.h); the supervisor starts a fresh worker.
EXIT_FORKSERVER = 71


class ForkRefused(Exception):
    """The forkserver could not start a child: the call never ran (it goes back on its
    queue) and the worker exits :data:`EXIT_FORKSERVER` to be replaced."""


def check_supported() -> None:
    """Raise unless this platform has a forkserver (POSIX).

    Raises:
        ConfigurationError: no ``forkserver`` start method (Windows).
    """
    import multiprocessing  # here: an idle worker without a CPU pool loads none of it

    if os.name != "posix" or "forkserver" not in multiprocessing.get_all_start_methods():
        raise ConfigurationError(
            "the CPU pool (executor='cpu', --pool cpu) needs a POSIX system (fork and a "
            "forkserver); use executor='process' here"
        )


def check_options(
    pool: str,
    processes: int | None,
    max_tasks: int | None,
    max_memory: int | str | None,
    tasks: Iterable[Task[Any, Any]],
) -> int | None:
    """Check the CPU-pool options of a :class:`~blitzq.Worker` (``pool``, ``cpu_processes``,
    ``cpu_max_tasks``, ``cpu_max_memory``), and that the platform has a forkserver when a
    task or ``pool="cpu"`` needs one.

    Returns:
        ``max_memory`` in bytes (``None``: no limit).

    Raises:
        ConfigurationError: a pool other than ``"thread"`` or ``"cpu"``, a count below 1, a
            size that does not parse (:func:`~blitzq._checks.byte_size`), or no forkserver.
    """
    if pool not in ("thread", "cpu"):
        raise ConfigurationError(f"pool must be 'thread' or 'cpu', got {pool!r}")
    if processes is not None:
        integer("cpu_processes", processes, minimum=1)
    if max_tasks is not None:
        integer("cpu_max_tasks", max_tasks, minimum=1)
    if pool == "cpu" or any(t.executor == "cpu" for t in tasks):
        check_supported()
    return None if max_memory is None else byte_size("cpu_max_memory", max_memory)


class CpuOwner(Protocol):
    """What the CPU pool's side of a worker sees of it (a :class:`~blitzq.Worker`)."""

    @property
    def pool(self) -> str: ...

    @property
    def cpu_processes(self) -> int: ...

    @property
    def cpu_max_tasks(self) -> int | None: ...

    @property
    def cpu_max_memory(self) -> int | None: ...

    def forkserver_refused(self, reason: str) -> None: ...


class Pool(Protocol):
    """What the worker's side uses of its pool (:class:`.cpu_pool.CpuPool`, named here only
    by this protocol: ``cpu_pool.py`` imports this module)."""

    def warm(self) -> None: ...

    def submit(
        self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]: ...

    def kill(self, call: asyncio.Future[Any]) -> bool: ...

    async def close(self) -> None: ...


class CpuExecutor:
    """The CPU pool's side of one worker: which tasks run there, and the pool (made on first
    use, its forkserver started with the worker: :meth:`warm`).

    Args:
        worker: the worker (its CPU-pool settings, and where a refused fork is reported).
        tasks: the Queue's tasks by name.
    """

    def __init__(self, worker: CpuOwner, tasks: Mapping[str, Task[Any, Any]]) -> None:
        self.worker = worker
        self.tasks = tasks
        self._pool: Pool | None = None

    def executor_of(self, task: Task[Any, Any]) -> str:
        """Where ``task`` runs: its executor, except that a sync task left on its default
        (``"thread"``) runs on the CPU pool under ``--pool cpu`` when it can (no ``Depends()``
        parameters, no soft timeout)."""
        executor = task.executor
        if (
            executor == "thread"
            and self.worker.pool == "cpu"
            and not task.executor_given
            and not task.injected
            and not task.controls.soft_timeout
        ):
            return "cpu"
        return executor

    def pool(self) -> Pool:
        """The worker's CPU pool (made on first use)."""
        if self._pool is None:
            from .cpu_pool import CpuPool  # the first pool imports it

            w = self.worker
            self._pool = CpuPool(
                w.cpu_processes,
                max_tasks=w.cpu_max_tasks,
                max_memory=w.cpu_max_memory,
                preload=[t.fn.__module__ for t in self.tasks.values() if self._here(t)],
                refused=w.forkserver_refused,
            )
        return self._pool

    def _here(self, task: Task[Any, Any]) -> bool:
        return self.executor_of(task) == "cpu"

    async def warm(self) -> None:
        """Start the forkserver (task modules imported) if a task runs on the CPU pool; one
        that cannot start stops the worker (:data:`EXIT_FORKSERVER`, through the pool's
        ``refused`` callback)."""
        if any(self._here(t) for t in self.tasks.values()):
            with contextlib.suppress(ForkRefused):
                await asyncio.to_thread(self.pool().warm)

    def kill(self, call: asyncio.Future[Any] | None) -> None:
        """Kill the child running ``call`` (:meth:`.cpu_pool.CpuPool.kill`)."""
        if self._pool is not None and call is not None:
            self._pool.kill(call)

    async def close(self) -> None:
        """Stop the pool's children (:meth:`.cpu_pool.CpuPool.close`), if it was made."""
        if self._pool is not None:
            await self._pool.close()
