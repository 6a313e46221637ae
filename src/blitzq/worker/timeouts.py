"""Soft and hard timeouts of task runs.

- ``hard_timeout`` (alias ``timeout``): an async task is cancelled; a process task's pool is
  terminated (other process tasks running in it are requeued, attempt unchanged), and the
  slots of its runs are freed once the killed processes are reaped; a thread task's failure
  is recorded (and its message acknowledged) at once and its thread is *abandoned*: Python
  cannot kill a thread, so it runs on until its call returns, and it **keeps its slot** until
  then, so the worker's concurrency bound counts it (DESIGN invariant 5). A call the pool had
  not started yet is cancelled instead, and never runs. The thread pool grows by one thread
  per abandoned call, so a ``thread_pool_size`` below the concurrency never leaves a slot
  without a thread. Its lock place stays held until the call returns. Abandoned threads still
  running are counted (``Worker.abandoned_threads``, a WARNING each). When they hold every
  slot of the worker (or every slot of a queue with a ``queue_concurrency`` bound), or are
  more than ``Worker.max_abandoned_threads``, the worker stops gracefully (not waiting for
  them) and asks to be restarted (exit code :data:`~blitzq.worker.worker.EXIT_RESTART` of
  ``blitzq worker``, which the supervisor restarts at once): the process exit kills them.
  An async task that ignores its cancellation (catches ``CancelledError`` and goes on) is
  recorded as TaskTimeout all the same, whatever it then returns or raises; one still
  running :data:`CANCEL_GRACE` seconds after its cancellation is *abandoned* as a thread run
  is (its failure committed then, its slot kept until it returns, counted and restarted for
  alike).
- ``soft_timeout``: :class:`~blitzq.SoftTimeoutError` is raised inside a thread task, through
  ``PyThreadState_SetAsyncExc``, which takes effect at the next Python bytecode: a thread
  blocked in C code (a long ``time.sleep``, a socket read) sees it only when that call
  returns. An async task is cancelled (the coroutine sees ``CancelledError``) and the attempt
  is recorded as SoftTimeoutError. Either way the retry policy applies; a task that catches
  the error and returns normally succeeds. Process tasks take no soft timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import SoftTimeoutError, TaskTimeout
from ..routing import base_queue
from .execution import Job
from .limiter import Slots

if TYPE_CHECKING:
    from collections.abc import MutableSet

    from ..task import Task
    from .ending import Ending
    from .executors import ThreadPool

logger = logging.getLogger("blitzq.worker")

#: Seconds an async task may run on after its hard timeout cancelled it (time for its
#: ``finally`` blocks to await their clean-up) before it is abandoned: its failure is
#: committed and it keeps its slot until its coroutine returns (module docstring).
CANCEL_GRACE = 5.0


class _RestartingWorker(Protocol):
    @property
    def max_abandoned_threads(self) -> int: ...

    def request_restart(self, reason: str, level: int = logging.ERROR) -> None: ...


class TimedRunner(Protocol):
    """What the timers see of the runner (a :class:`~.runner.Runner`, which owns them): its
    runs, their ending, the pools a timed-out run is taken out of, and the worker asked to
    restart when abandoned threads hold its slots."""

    @property
    def worker(self) -> _RestartingWorker: ...

    @property
    def jobs(self) -> MutableSet[Job]: ...

    @property
    def ending(self) -> Ending: ...

    @property
    def thread_pool(self) -> ThreadPool | None: ...

    def kill_process_run(self, job: Job) -> None: ...

    def executor_of(self, task: Task[Any, Any]) -> str: ...

    def kill_run(self, job: Job) -> None: ...


class _Timers:
    """The soft and hard timer handles of one run, cancelled together."""

    __slots__ = ("handles",)

    def __init__(self, handles: list[asyncio.TimerHandle]) -> None:
        self.handles = handles

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    def when(self) -> float:
        """When the first of them is due (the loop's time)."""
        return min(handle.when() for handle in self.handles)


class _ThreadRun:
    """Which thread runs a thread task, so a soft timeout can be raised in it."""

    __slots__ = ("done", "ident", "injected", "lock", "pending")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ident: int | None = None
        self.done = False
        self.injected = False
        self.pending = False


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> int:
    import ctypes  # here: a worker that never interrupts a thread loads no ctypes (~0.4 MB)

    return int(
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(exc) if exc is not None else None
        )
    )


class Timeouts:
    """The soft and hard timeouts of one worker's runs, and the thread runs abandoned at
    their hard timeout (module docstring).

    Args:
        runner: the worker's runner (its runs, pools, ending and worker).

    Attributes:
        abandoned: thread runs past their hard timeout whose thread has not returned, with
            the slots each keeps until it does.
        abandoned_total: thread runs abandoned since the worker started.
    """

    def __init__(self, runner: TimedRunner) -> None:
        self.runner = runner
        self.abandoned: dict[Job, Slots] = {}
        self.abandoned_total = 0
        #: Thread runs with a soft timeout: which thread runs each.
        self._threads: dict[Job, _ThreadRun] = {}
        #: Async runs cancelled by their soft timeout (recorded as SoftTimeoutError).
        self._soft: set[Job] = set()

    def interruptible(self, job: Job, call: Callable[[], Any]) -> functools.partial[Any]:
        """Wrap a thread task's call so a soft timeout can raise inside its thread."""
        run = self._threads[job] = _ThreadRun()

        def wrapped() -> Any:
            with run.lock:
                if run.pending:
                    run.done = True
                    raise SoftTimeoutError()
                run.ident = threading.get_ident()
            try:
                return call()
            finally:
                with run.lock:
                    run.done = True
                    if run.injected:  # not raised yet: do not let it escape into the pool
                        _set_async_exc(threading.get_ident(), None)

        return functools.partial(wrapped)

    def arm(self, job: Job, slots: Slots) -> None:
        """Arm the hard and soft timers of a run that just started (sets ``job.timer``).

        ``slots``: the slots the run holds (a thread run abandoned at its hard timeout keeps
        them until its call returns).
        """
        loop = asyncio.get_running_loop()
        handles = []
        hard = job.envelope.timeout or job.task.timeout
        if hard:
            handles.append(loop.call_later(hard, self.expired, job, False, slots))
        soft = job.task.controls.soft_timeout
        if soft and (not hard or soft < hard):
            handles.append(loop.call_later(soft, self.expired, job, True))
        if handles:
            job.timer = handles[0] if len(handles) == 1 else _Timers(handles)

    def overran(self, job: Job) -> None:
        """An async run that ended without being timed out: when it ran past its hard
        timeout (the timer was due, the loop never got to it), its coroutine blocked the
        event loop without yielding, so it could not be cancelled; its outcome stands, and a
        WARNING says what happened and what to do instead."""
        hard = job.envelope.timeout or job.task.timeout
        if not hard or job.timed_out or not job.started_at:
            return
        took = time.time() - job.started_at
        if took > hard:
            logger.warning(
                "task %s %s ran %.1f s, past its hard timeout of %g s, without yielding to the "
                "event loop (a blocking call in an async task), so it could not be cancelled: "
                "its outcome stands; run blocking code in a thread task (a plain def) or await "
                "asyncio.to_thread(...)",
                job.envelope.task,
                job.envelope.id,
                took,
                hard,
            )

    def expired(self, job: Job, soft: bool = False, slots: Slots | None = None) -> None:
        """The run passed its hard timeout (or its soft one, ``soft=True``).

        Hard: cancel an async task; for a thread task record the failure now; its thread
        is *abandoned* and keeps its slot until the call returns (:meth:`abandon`), or its
        call is cancelled if the pool had not started it; terminate a process task (its slot
        is freed once the process is reaped); kill a CPU-pool task's child alone (its slot
        is freed once the child is reaped). Soft: :meth:`soft`. ``slots``: those the run
        holds.
        """
        if job.finished:
            return
        if soft:
            self.soft(job)
            return
        job.timed_out = True
        if job.task.executor == "async":
            job.handle.cancel()
            if slots is not None:
                loop = asyncio.get_running_loop()
                loop.call_later(CANCEL_GRACE, self._cancel_ignored, job, slots)
            return
        job.finished = True
        runner = self.runner
        runner.ending.timed_out(job)
        if runner.executor_of(job.task) in ("process", "cpu"):
            runner.kill_run(job)
        elif job.pool_call is not None and job.pool_call.cancel():
            pass  # never started, so it never runs: its slot is freed by run_ended
        elif slots is not None:
            self.abandon(job, slots)

    def _cancel_ignored(self, job: Job, slots: Slots) -> None:
        """:data:`CANCEL_GRACE` after a hard timeout cancelled an async run: a run still going
        ignored its cancellation; commit its failure now and abandon it (:meth:`abandon`)."""
        if job.finished or job.handle is None or job.handle.done():
            return
        job.finished = True
        self.runner.ending.timed_out(job)
        job.handle.cancel()  # once more: a coroutine that swallowed one may let the next go
        self.abandon(job, slots)

    def soft_expired(self, job: Job) -> bool:
        """Whether the timeout ``job`` passed is its soft one (an async run cancelled by its
        soft timeout, not yet recorded)."""
        return job in self._soft

    def soft(self, job: Job) -> None:
        """The run passed its soft timeout: raise in its thread, or cancel the coroutine."""
        if job.task.executor == "async":
            self._soft.add(job)
            job.timed_out = True
            job.handle.cancel()
            return
        run = self._threads.get(job)
        if run is None:
            return
        with run.lock:
            if run.done or run.injected:
                return
            if run.ident is None:
                run.pending = True
                return
            run.injected = _set_async_exc(run.ident, SoftTimeoutError) == 1

    def error(self, job: Job) -> TaskTimeout:
        """The error a timed-out run is recorded with (soft or hard)."""
        if job in self._soft:
            self._soft.discard(job)
            return SoftTimeoutError(f"task {job.envelope.task} ran longer than its soft_timeout")
        seconds = job.envelope.timeout or job.task.timeout or 0.0
        return TaskTimeout(f"task {job.envelope.task} ran longer than {seconds} s")

    def forget(self, job: Job) -> None:
        """Drop what was kept about a run that ended (only a run with timers has any)."""
        self._threads.pop(job, None)
        self._soft.discard(job)

    def abandon(self, job: Job, slots: Slots) -> None:
        """A thread run passed its hard timeout, or an async run ignored the cancellation of
        its own (its failure is committed): abandon it; it keeps its slot of ``slots`` until
        its call or coroutine returns (:meth:`returned`).

        The job leaves the runner's jobs for :attr:`abandoned`, the thread pool may start
        one more thread for as long as a thread run runs, and the worker asks to be restarted
        when the abandoned runs hold all its slots or a queue's (:meth:`restart_reason`).
        """
        runner = self.runner
        runner.jobs.discard(job)
        if job.timer is not None:
            job.timer.cancel()
        self.abandoned[job] = slots
        self.abandoned_total += 1
        threaded = job.task.executor != "async"
        if threaded and runner.thread_pool is not None:
            runner.thread_pool.abandon()
        slots.global_limiter.wake()  # a stopping worker does not wait for this run
        logger.warning(
            "task %s %s passed its hard timeout and %s: it keeps its slot until it returns, "
            "%d abandoned run(s) now (%d slot(s) of %d)",
            job.envelope.task,
            job.envelope.id,
            "its thread is still running"
            if threaded
            else f"ignored its cancellation (still running {CANCEL_GRACE:g} s after it; an "
            "async task must let CancelledError propagate)",
            len(self.abandoned),
            slots.global_limiter.in_use,
            slots.global_limiter.capacity,
        )
        reason = self.restart_reason(job, slots)
        if reason is not None:
            runner.worker.request_restart(reason)

    def restart_reason(self, job: Job, slots: Slots) -> str | None:
        """Why the worker must be replaced now that ``job`` was abandoned, or ``None``.

        Abandoned threads keep their slots: once they hold every slot of the worker, or
        every slot of ``job``'s queue (``queue_concurrency``), nothing of it can run until
        they return, which may be never; more than ``max_abandoned_threads`` of them is a
        restart too.

        Args:
            job: the run just abandoned (:attr:`abandoned` already holds it).
            slots: the slots it holds.
        """
        count = len(self.abandoned)
        worker = self.runner.worker
        if count > worker.max_abandoned_threads:
            return (
                f"{count} abandoned threads (max_abandoned_threads {worker.max_abandoned_threads})"
            )
        everyone = slots.global_limiter.capacity
        if count >= everyone:
            return f"all {everyone} slots held by runs abandoned at their hard timeout"
        limiter = slots.queue_limiter
        if limiter is not None:
            held = sum(1 for s in self.abandoned.values() if s.queue_limiter is limiter)
            if held >= limiter.capacity:
                return (
                    f"all {limiter.capacity} slots of queue {base_queue(job.delivery.queue)!r} "
                    "held by runs abandoned at their hard timeout"
                )
        return None

    def returned(self, job: Job) -> None:
        """The call of an abandoned thread run finally returned: stop counting it (the
        caller frees its slot)."""
        self.abandoned.pop(job, None)
        threads = self.runner.thread_pool
        threaded = job.task.executor != "async"
        if threaded and threads is not None:
            threads.returned()
        logger.info(
            "abandoned %s of task %s %s returned after %.1f s: its slot is free",
            "thread" if threaded else "coroutine",
            job.envelope.task,
            job.envelope.id,
            time.time() - job.started_at,
        )


__all__ = ["Timeouts"]
