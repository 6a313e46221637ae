"""The CPU pool's processes: :class:`CpuPool`, its forkserver and its children (see
``cpu.py`` for what the pool does and guarantees, and the worker's side of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..exceptions import SerializationError, describe_error
from ..parent_death import die_with_parent
from .cpu import ForkRefused, check_supported
from .eager_start import TaskExit
from .executors import _run_by_reference
from .recycling import MB, rss_bytes

if TYPE_CHECKING:
    import multiprocessing.process
    from multiprocessing.connection import Connection

logger = logging.getLogger("blitzq.worker")

#: Seconds a killed or retired child is given to be reaped.
REAP_TIMEOUT = 10.0


class ChildDied(Exception):
    """The child process running a call died before answering (killed by a signal, or it
    exited): the call's attempt fails with this error.

    Args:
        message: what happened, with the child's pid and exit code.
    """


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
