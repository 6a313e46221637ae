"""Where task code runs: coroutines on the loop, threads, or a process pool.

Sync tasks run on a :class:`ThreadPool` of daemon threads that grows by one thread for each
call abandoned at its hard timeout (see :mod:`~blitzq.worker.timeouts`; the call keeps its
slot until it returns), so hung calls never take the threads the other slots need, and never
keep the process from exiting.

Async tasks start *eagerly* (:mod:`.eager`): the coroutine's first step runs inline in the
worker, and only a coroutine that actually suspends gets an ``asyncio.Task``.

Isolation: every run gets a :class:`contextvars.Context` of its own (the runner passes a copy
of the worker's base context), so a context variable a task sets is never seen by the next
one; a pool process runs each call in a fresh copy of its own base context. Whatever task
code raises ends as that run's exception: ``SystemExit`` and ``KeyboardInterrupt``, which
asyncio would re-raise out of the event loop (ending the worker), travel wrapped in
:class:`~.eager.TaskExit`; an exception a pool process cannot send back (it does not pickle, or not
back) arrives as a :class:`RemoteError` describing it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import importlib
import os
import pickle
import queue
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import SerializationError, describe_error

if TYPE_CHECKING:
    import multiprocessing.process
from .execution import format_traceback
from .recycling import MB, pool_over_memory

#: Types of return values sent back from a pool process without checking they unpickle.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, list, dict, tuple})


class RemoteError(Exception):
    """Stands for an exception a pool process raised but could not send back as it is
    (it cannot be pickled, or not unpickled).

    The record shows the original's type name and message.

    Args:
        error_type: qualified type name of the original exception.
        message: its message.
        traceback: its formatted traceback in the pool process.
    """

    def __init__(self, error_type: str, message: str, traceback: str = "") -> None:
        super().__init__(error_type, message, traceback)
        self.error_type = error_type
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` itself when it survives the trip back from a pool process, else a
    :class:`RemoteError` describing it (only ever called on a failure)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except BaseException:  # any failure to cross: describe it instead
        pass
    else:
        return exc
    error_type, message = describe_error(exc)
    return RemoteError(error_type, message, format_traceback(exc))


def _run_by_reference(module: str, attribute: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Entry point inside a pool process: import the task object and call its function."""
    if module == "__main__" and "__mp_main__" in sys.modules:
        module = "__mp_main__"
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    fn = getattr(target, "fn", target)
    try:
        # A fresh copy of this process's base context per call: nothing one call sets in a
        # context variable is seen by the next call this process runs.
        result = contextvars.copy_context().run(fn, *args, **kwargs)
    except BaseException as exc:
        sendable = _sendable(exc)
        if sendable is exc:
            raise
        raise sendable from None
    if type(result) not in _PLAIN:
        # A value that pickles but does not unpickle would break the whole pool in the
        # worker (every call in it fails): check the trip here, where it costs one call.
        try:
            pickle.loads(pickle.dumps(result))
        except BaseException as exc:
            error_type, message = describe_error(exc)
            raise SerializationError(
                f"the return value ({type(result).__qualname__}) cannot be sent back from "
                f"the pool process: {error_type}: {message}"
            ) from None
    return result


_WorkItem = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class ThreadPool(concurrent.futures.Executor):
    """Daemon threads running sync task calls: ``size`` of them, plus one per abandoned call.

    Like :class:`concurrent.futures.ThreadPoolExecutor` (threads start on demand and an idle
    one is reused first), with two differences a worker needs. Its threads are daemons, so a
    call that never returns does not hold up the process's exit. And :meth:`abandon` raises
    the thread limit by one while an abandoned call still occupies its thread, so the runs
    of the other slots always find a thread (also with ``size`` below the worker's
    concurrency); :meth:`returned` lowers it again, and a thread over the limit exits once
    it finishes its call. The pool bounds threads, not running calls: the worker's slots do.

    Args:
        size: threads when nothing is abandoned (>= 1).
        name_prefix: thread names are ``<prefix>-<n>``.
    """

    def __init__(self, size: int, name_prefix: str = "blitzq-task") -> None:
        self.size = size
        self.name_prefix = name_prefix
        self.extra = 0
        self._work: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._started = 0
        self._shutdown = False

    @property
    def threads(self) -> int:
        """Threads alive in the pool."""
        return len(self._threads)

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a pool thread.

        Raises:
            RuntimeError: the pool was shut down.
        """
        call = functools.partial(fn, **kwargs) if kwargs else fn
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a thread pool that was shut down")
            self._work.put((future, call, args))
            if not self._idle.acquire(timeout=0):
                self._grow()
        return future

    def abandon(self) -> None:
        """One call will keep its thread past its run: allow one more thread meanwhile, and
        start it now if calls are waiting for a thread."""
        with self._lock:
            self.extra += 1
            if not self._work.empty():
                self._grow()

    def returned(self) -> None:
        """An abandoned call returned: give back the thread allowed for it."""
        with self._lock:
            self.extra = max(0, self.extra - 1)

    def _grow(self) -> None:  # with the lock held
        if len(self._threads) >= self.size + self.extra:
            return
        self._started += 1
        thread = threading.Thread(
            target=self._run, name=f"{self.name_prefix}-{self._started}", daemon=True
        )
        self._threads.add(thread)
        thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._work.get()
            if item is None:
                break
            future, call, args = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    result = call(*args)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                    result = None
            del future, call, args  # drop references before waiting for the next call
            if self._shutdown or len(self._threads) > self.size + self.extra:
                with self._lock:  # decided again under the lock: one thread leaves per excess
                    if self._shutdown or len(self._threads) > self.size + self.extra:
                        self._threads.discard(me)
                        return
            self._idle.release()
        with self._lock:
            self._threads.discard(me)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; ``cancel_futures`` cancels those not started; ``wait`` joins
        the threads (never done for an abandoned call's thread by the worker)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


class ProcessPool:
    """A lazily started process pool (spawned processes, so no forked locks or threads).

    Args:
        size: number of processes.
        max_tasks_per_child: calls after which a process is replaced (``None``: never).
        max_memory_per_child: megabytes (MiB) of resident memory of a process past which,
            after a call, the pool is replaced (running calls finish in the old one, which
            :meth:`shutdown` with ``kill`` still reaches).
    """

    def __init__(
        self,
        size: int,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
    ) -> None:
        self.size = size
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory = max_memory_per_child * MB if max_memory_per_child else None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        #: Pools replaced past the memory limit, with their processes (a pool shut down
        #: forgets them, while calls may still run there: a hard timeout must reach them).
        self._retired: list[_Retired] = []

    def submit(
        self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a pool process; the function must be importable.

        A pool found broken (a process died, or a result could not be read back) is replaced
        by a new one, so one bad run never stops every later process task.
        """
        pool = self._pool
        if pool is not None and getattr(pool, "_broken", False):
            self.shutdown(kill=True)
        if self._pool is None:
            import multiprocessing  # here: a worker without process tasks never loads it

            from .processes import die_with_parent

            # Pool processes die with this worker, even when it is SIGKILLed (Linux).
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
                max_tasks_per_child=self.max_tasks_per_child,
            )
        pool = self._pool
        future = asyncio.wrap_future(
            pool.submit(_run_by_reference, fn.__module__, fn.__qualname__, args, kwargs)
        )
        if self.max_memory is not None:
            future.add_done_callback(lambda _: self._check_memory(pool))
        return future

    def _check_memory(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Replace ``pool`` (still the current one) when a process is past the memory limit."""
        assert self.max_memory is not None
        over = pool_over_memory(getattr(pool, "_processes", None) or {}, self.max_memory)
        if not over or pool is not self._pool:
            return
        self._pool = None
        live = [(p, procs) for p, procs in self._retired if any(x.is_alive() for x in procs)]
        self._retired = [*live, (pool, _processes_of(pool))]
        pool.shutdown(wait=False)

    def shutdown(self, kill: bool = False) -> list[multiprocessing.process.BaseProcess]:
        """Stop the pool; ``kill=True`` terminates running processes at once, those of
        pools retired past the memory limit included.

        Returns:
            The processes killed (empty without ``kill``): a SIGKILLed process may still be
            exiting when its pool reports it gone, so whoever must know it is gone joins them.
        """
        pools = list(self._retired)
        if self._pool is not None:
            pools.append((self._pool, _processes_of(self._pool)))
        self._pool, self._retired = None, []
        killed: list[multiprocessing.process.BaseProcess] = []
        for pool, processes in pools:
            if kill:
                for process in processes:
                    process.kill()
                killed += processes
            pool.shutdown(wait=not kill, cancel_futures=True)
        return killed


#: A retired process pool and the processes it had when it was shut down.
_Retired = tuple[
    "concurrent.futures.ProcessPoolExecutor", "list[multiprocessing.process.BaseProcess]"
]


def _processes_of(
    pool: concurrent.futures.ProcessPoolExecutor,
) -> list[multiprocessing.process.BaseProcess]:
    """The processes of ``pool`` (none once it is shut down: it forgets them then)."""
    return list((getattr(pool, "_processes", None) or {}).values())
