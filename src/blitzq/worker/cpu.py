"""The CPU pool: sync task bodies in child processes forked from a pre-warmed forkserver.

A task declared ``executor="cpu"`` (or a sync task left on its default executor under
``blitzq worker --pool cpu``) runs in a child process, so the worker's event loop never
computes. The children are forked by :mod:`multiprocessing`'s *forkserver*, started when the
worker starts with the task modules already imported (:meth:`CpuPool.warm`): a child costs a
fork, not an interpreter start and an import of the application, and it inherits no thread,
lock or connection of the worker.

- **Each child leads its own process group** (``setpgid`` as it starts). A hard timeout or a
  cancel SIGKILLs that group only (:meth:`CpuPool.kill`): the child and whatever it started
  die, the calls running in the other children go on and finish normally (they are not
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._checks import byte_size, integer
from ..exceptions import ConfigurationError, SerializationError, describe_error
from ..parent_death import die_with_parent
from .eager_start import TaskExit
from .executors import _run_by_reference
from .recycling import MB, rss_bytes

if TYPE_CHECKING:
    import multiprocessing.process
    from multiprocessing.connection import Connection

    from ..task import Task

logger = logging.getLogger("blitzq.worker")

#: Exit code of ``blitzq worker`` when its CPU pool's forkserver could not start a child
#: (``EX_OSERR`` of sysexits.h); the supervisor starts a fresh worker.
EXIT_FORKSERVER = 71
#: Seconds a killed or retired child is given to be reaped.
REAP_TIMEOUT = 10.0


class ForkRefused(Exception):
    """The forkserver could not start a child: the call never ran (it goes back on its
    queue) and the worker exits :data:`EXIT_FORKSERVER` to be replaced."""


class ChildDied(Exception):
    """The child process running a call died before answering (killed by a signal, or it
    exited): the call's attempt fails with this error.

    Args:
        message: what happened, with the child's pid and exit code.
    """


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


def _watch_lifeline(lifeline: Connection) -> None:
    """In a pool child: wait for the worker's end of ``lifeline`` to close (the worker is
    gone), then SIGKILL this child's process group."""
    with contextlib.suppress(BaseException):
        while True:
            lifeline.recv()
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _child_main(conn: Connection, lifeline: Connection) -> None:
    """Entry point of a pool child: lead a process group, then answer calls until told to
    stop (``None``) or until the worker's end of the pipe closes; die with the worker
    (``lifeline``)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    die_with_parent(os.getppid())  # the forkserver
    threading.Thread(
        target=_watch_lifeline, args=(lifeline,), name="blitzq-lifeline", daemon=True
    ).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the worker's
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        if call is None:
            return
        module, attribute, args, kwargs = call
        reply: tuple[bool, Any]
        try:
            reply = (True, _run_by_reference(module, attribute, args, kwargs))
        except BaseException as exc:  # whatever task code raises ends as the call's error
            reply = (False, exc)
        del call, args, kwargs
        try:
            conn.send((*reply, rss_bytes()))
        except (EOFError, OSError):
            return
        except BaseException as exc:  # the reply does not pickle
            error_type, message = describe_error(exc)
            conn.send((False, SerializationError(f"{error_type}: {message}"), rss_bytes()))
        del reply


class _Child:
    """One pool child: its process, the worker's end of its pipe, the calls it answered."""

    __slots__ = ("calls", "conn", "killed", "process")

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.calls = 0
        self.killed = False

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self.process.pid or 0


class CpuPool:
    """Child processes forked from a forkserver, each running one call at a time.

    Args:
        size: most children (calls running at once; more wait for a free child).
        max_tasks: calls after which a child is replaced (``None``: never).
        max_memory: bytes of resident memory above which a child is replaced after a call
            (``None``: never; Linux only, elsewhere unknown).
        preload: modules the forkserver imports before forking (the task modules).
        refused: called with the reason when the forkserver cannot start a child.
    """

    def __init__(
        self,
        size: int,
        *,
        max_tasks: int | None = None,
        max_memory: int | None = None,
        preload: Iterable[str] = (),
        refused: Callable[[str], None] | None = None,
    ) -> None:
        check_supported()
        self.size = size
        self.max_tasks = max_tasks
        self.max_memory = max_memory
        self.preload = sorted({m for m in preload if m and m != "__main__"})
        self._refused_callback = refused
        import multiprocessing  # on the first CPU pool only (~1 MB of an idle worker)

        self._ctx = multiprocessing.get_context("forkserver")
        self._capacity = asyncio.Semaphore(size)
        self._idle: list[_Child] = []
        self._running: dict[asyncio.Future[Any], _Child] = {}
        self._reaping: set[asyncio.Future[Any]] = set()
        #: The lifeline's ends: the children hold the read end, only this process the write
        #: end, so the children see end-of-file when the worker is gone.
        self._lifeline: tuple[Connection, Connection] | None = None
        #: Children started, and replaced past ``max_tasks`` or ``max_memory``.
        self.started = 0
        self.recycled = 0
        #: Why the forkserver refused (``None``: it never did).
        self.refused: str | None = None

    # ------------------------------------------------------------------ start
    def warm(self) -> None:
        """Start the forkserver with :attr:`preload` imported (blocks: call it in a thread).

        Raises:
            ForkRefused: the forkserver could not be started.
        """
        self._ctx.set_forkserver_preload(["blitzq.worker.cpu", *self.preload])
        from multiprocessing import forkserver

        try:
            forkserver.ensure_running()
        except (OSError, EOFError, ValueError) as exc:
            raise self._refuse(f"the forkserver could not start: {exc!r}") from exc

    def _refuse(self, reason: str) -> ForkRefused:
        if self.refused is None:
            self.refused = reason
            if self._refused_callback is not None:
                self._refused_callback(reason)
        return ForkRefused(reason)

    async def _start(self) -> _Child:
        if self.refused is not None:
            raise ForkRefused(self.refused)
        if self._lifeline is None:
            self._lifeline = self._ctx.Pipe(duplex=False)
        ours, theirs = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_child_main, args=(theirs, self._lifeline[0]), name="blitzq-cpu", daemon=True
        )
        try:
            await asyncio.to_thread(process.start)
        except (OSError, EOFError, ValueError) as exc:
            ours.close()
            raise self._refuse(f"the forkserver could not start a child: {exc!r}") from exc
        finally:
            theirs.close()
        self.started += 1
        return _Child(process, ours)

    async def _child(self) -> _Child:
        """An idle child (one that died while idle is dropped), else a new one. A call
        cancelled while its child starts leaves that child idle for the next call."""
        while self._idle:
            child = self._idle.pop()
            if child.process.exitcode is None:
                return child
            self._background_reap(child)
        starting = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._adopt)
            raise

    def _adopt(self, starting: asyncio.Future[_Child]) -> None:
        if not starting.cancelled() and starting.exception() is None:
            self._idle.append(starting.result())

    # ------------------------------------------------------------------ calls
    def submit(
        self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a child; ``fn`` must be importable by its
        ``__module__`` and ``__qualname__``.

        Returns:
            The call's future: its result, the task's exception, :class:`ChildDied` when the
            child died (or was killed: :meth:`kill`), :class:`ForkRefused` when no child could
            be started. It ends only once a dead child has been reaped.
        """
        call = (fn.__module__, fn.__qualname__, args, kwargs)
        return asyncio.get_running_loop().create_task(self._call(call))

    async def _call(self, call: tuple[str, str, list[Any], dict[str, Any]]) -> Any:
        me = asyncio.current_task()
        assert me is not None
        answer: tuple[bool, Any, int | None] | None = (False, None, None)
        async with self._capacity:
            child = await self._child()
            self._running[me] = child
            try:
                answer = await self._exchange(child, call)
                if answer is None:  # the child died before answering
                    raise self._died(child)
            except BaseException:
                # Cancelled (the worker requeued the call at shutdown) or the child died:
                # the child is not reused, and the call ends once it is reaped.
                self._kill(child)
                await asyncio.shield(self._reap(child))
                if answer is None:
                    raise self._died(child) from None
                raise
            finally:
                self._running.pop(me, None)
            ok, value, rss = answer
            self._after_call(child, rss)
        if ok:
            return value
        if isinstance(value, (SystemExit, KeyboardInterrupt)):
            raise TaskExit(value)
        raise value

    @staticmethod
    def _died(child: _Child) -> ChildDied:
        code = child.process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return ChildDied(f"the CPU pool child {child.pid} running the task ended ({how})")

    async def _exchange(
        self, child: _Child, call: tuple[Any, ...]
    ) -> tuple[bool, Any, int | None] | None:
        """Send ``call`` to ``child`` and wait (on the event loop, no thread) for its answer:
        ``(ok, value, rss)``, or ``None`` when the child died first."""
        loop = asyncio.get_running_loop()
        conn = child.conn
        answer: asyncio.Future[tuple[bool, Any, int | None] | None] = loop.create_future()
        fd = conn.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            if answer.done():
                return
            try:
                answer.set_result(conn.recv())
            except (EOFError, OSError):
                answer.set_result(None)
            except BaseException as exc:  # the answer did not unpickle
                error_type, message = describe_error(exc)
                answer.set_exception(SerializationError(f"{error_type}: {message}"))

        try:
            conn.send(call)
        except OSError:  # the child died while idle
            return None
        loop.add_reader(fd, readable)
        try:
            return await answer
        finally:
            loop.remove_reader(fd)

    def _after_call(self, child: _Child, rss: int | None) -> None:
        """Give ``child`` back, or retire it past ``max_tasks`` or ``max_memory``."""
        child.calls += 1
        why = None
        if self.max_tasks is not None and child.calls >= self.max_tasks:
            why = f"answered {child.calls} call(s), cpu-max-tasks is {self.max_tasks}"
        elif self.max_memory is not None and rss is not None and rss > self.max_memory:
            why = f"holds {rss / MB:.0f} MiB, above cpu-max-memory {self.max_memory / MB:.0f} MiB"
        if why is None:
            self._idle.append(child)
            return
        self.recycled += 1
        logger.info("CPU pool child %d recycled: %s", child.pid, why)
        with contextlib.suppress(OSError):
            child.conn.send(None)
        self._background_reap(child)

    # ------------------------------------------------------------------- kill
    def kill(self, call: asyncio.Future[Any]) -> bool:
        """SIGKILL the process group of the child running ``call`` (a hard timeout, a
        cancel); the other children are untouched. ``call`` then fails with
        :class:`ChildDied` once the child is reaped. A call still waiting for a child is
        cancelled: it never runs. Returns whether a child was running it."""
        child = self._running.get(call)
        if child is None:
            call.cancel()
            return False
        self._kill(child)
        return True

    @staticmethod
    def _kill(child: _Child) -> None:
        if child.killed or child.process.exitcode is not None:
            return
        child.killed = True
        pid = child.pid
        # The group first (the child and what it started); a child that has not made its
        # group yet is killed by pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    async def _reap(self, child: _Child) -> None:
        with contextlib.suppress(OSError):
            child.conn.close()
        await asyncio.to_thread(child.process.join, REAP_TIMEOUT)

    def _background_reap(self, child: _Child) -> None:
        reaping = asyncio.ensure_future(self._reap(child))
        self._reaping.add(reaping)
        reaping.add_done_callback(self._reaping.discard)

    @property
    def pids(self) -> list[int]:
        """Pids of the children alive in the pool (idle or running a call)."""
        return [c.pid for c in [*self._idle, *self._running.values()] if c.pid]

    async def close(self) -> None:
        """Stop every child: idle ones are told to exit, running ones are killed (their calls
        were requeued by the shutdown); wait until they are reaped."""
        idle, self._idle = self._idle, []
        for child in idle:
            with contextlib.suppress(OSError):
                child.conn.send(None)
            self._background_reap(child)
        for call, child in list(self._running.items()):
            self._kill(child)
            call.cancel()
        if self._reaping:
            await asyncio.wait(list(self._reaping), timeout=REAP_TIMEOUT)
        if self._running:
            await asyncio.wait(list(self._running), timeout=REAP_TIMEOUT)
        lifeline, self._lifeline = self._lifeline, None
        for end in lifeline or ():
            end.close()


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
        self._pool: CpuPool | None = None

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

    def pool(self) -> CpuPool:
        """The worker's CPU pool (made on first use)."""
        if self._pool is None:
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
        """Kill the child running ``call`` (:meth:`CpuPool.kill`)."""
        if self._pool is not None and call is not None:
            self._pool.kill(call)

    async def close(self) -> None:
        """Stop the pool's children (:meth:`CpuPool.close`), if it was made."""
        if self._pool is not None:
            await self._pool.close()
