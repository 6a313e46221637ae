"""A worker's graceful shutdown, step by step (:func:`shut_down`).

Once :meth:`Worker.stop <blitzq.worker.worker.Worker.stop>` is called (a signal, ``blitzq
worker shutdown``, burst mode's end, a restart request) the worker stops in this order: stop
fetching, let runs finish (up to ``shutdown_timeout``), requeue the rest, stop the background
loops, write every completion, unregister, then the middleware's ``on_worker_stop``, the
shutdown hooks, the lifespans (:mod:`blitzq.dependencies`) and the signals. Each wait is
bounded, so a server that stopped answering does not hold the exit for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

from ..extensions.registry import extensions_of
from ..extensions.signals import Signal, SignalEvent

if TYPE_CHECKING:
    from ..dependencies import Resources
    from ..queue import Queue
    from .endpoints import Ops
    from .fetch import Fetcher
    from .flusher import Flusher
    from .limiter import Limiter
    from .maintenance import Maintenance
    from .runner import Runner
    from .series import Series
    from .unknown import Knowers

__all__ = ["FETCH_GRACE", "Stopping", "emit", "shut_down"]

logger = logging.getLogger("blitzq.worker")

#: Seconds beyond ``block_timeout`` a stopping worker lets a fetch command in flight finish
#: before it cancels it (a server that stopped answering); also the most it waits to
#: unregister and to write progress updates in flight.
FETCH_GRACE = 2.0


class Stopping(Protocol):
    """What the shutdown sees of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def id(self) -> str: ...

    @property
    def queue(self) -> Queue: ...

    @property
    def queues(self) -> list[str]: ...

    @property
    def resources(self) -> Resources: ...

    @property
    def runner(self) -> Runner: ...

    @property
    def knowers(self) -> Knowers: ...

    @property
    def series(self) -> Series | None: ...

    @property
    def ops(self) -> Ops: ...

    @property
    def shutdown_timeout(self) -> float: ...

    @property
    def block_timeout(self) -> float: ...

    @property
    def processed(self) -> int: ...

    @property
    def failed(self) -> int: ...


async def emit(worker: Stopping, signal: Signal) -> None:
    """Send the worker signal ``signal`` (``WORKER_STARTING``, ``WORKER_STOPPED``, …) to its
    handlers, if any, with the worker's id and queues; waits for them."""
    signals = worker.queue.signals
    if signals.has(signal):
        await signals.emit(
            signal, SignalEvent(signal, worker=worker.id, extra={"queues": list(worker.queues)})
        )


async def shut_down(
    worker: Stopping,
    fetcher: Fetcher,
    limiter: Limiter,
    flusher: Flusher,
    flusher_task: asyncio.Task[None],
    maintenance: Maintenance,
    background: list[asyncio.Task[None]],
) -> None:
    """Stop ``worker`` gracefully, in the order of the module docstring.

    Args:
        worker: the running worker (its runner, settings, hooks and endpoints).
        fetcher: its fetch loops.
        limiter: its global concurrency limiter (drained when no run holds a slot).
        flusher: its completion writer, and ``flusher_task`` the task running it.
        maintenance: its maintenance loops (which unregister it).
        background: the maintenance and other loops, cancelled once the runs are over.
    """
    runner = worker.runner
    loop = asyncio.get_running_loop()
    deadline = loop.time() + worker.shutdown_timeout
    logger.info("worker %s stopping: %d task(s) running", worker.id, len(runner.jobs))
    signals = worker.queue.signals
    if signals.has(Signal.WORKER_STOPPING):  # in the background: a handler never holds the stop
        event = SignalEvent(
            Signal.WORKER_STOPPING,
            worker=worker.id,
            extra={"queues": list(worker.queues), "running": len(runner.jobs)},
        )
        signals.emit_soon(Signal.WORKER_STOPPING, event)
    # 1. Stop fetching. A loop inside a fetch command finishes it (its messages are
    #    handed back); any other loop holds no message and is cancelled. A fetch gets
    #    block_timeout + FETCH_GRACE at least; a server that stopped answering does not
    #    hold the exit past that.
    await fetcher.stop(max(worker.shutdown_timeout, worker.block_timeout + FETCH_GRACE))
    # 2. Let running tasks finish, up to shutdown_timeout after the stop; not the threads
    #    abandoned at their hard timeout (already committed, they may never return).
    drained = limiter.drained(lambda: len(runner.timeouts.abandoned))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drained, timeout=max(0.0, deadline - loop.time()))
    # 3. Requeue what is still running or waiting to start.
    leftover = runner.requeue_unfinished()
    if leftover:
        logger.warning("requeued %d task(s) still running at shutdown", leftover)
    await asyncio.sleep(0)
    # redis-py can swallow a cancellation that lands while it opens a connection (the
    # command then returns normally), so cancel again until every loop has ended.
    remaining = set(background) | worker.knowers.pending  # hand-overs still in flight
    while remaining:
        for t in remaining:
            t.cancel()
        _, remaining = await asyncio.wait(remaining, timeout=0.5)
    for t in background:
        if not t.cancelled() and t.exception() is not None:
            logger.error("background loop %s failed", t.get_name(), exc_info=t.exception())
    await runner.close(killed=bool(leftover))
    # 4. Write every completion (bounded: unwritten acks are redelivered, never lost).
    flusher.close()
    try:
        await asyncio.wait_for(flusher_task, timeout=max(5.0, worker.shutdown_timeout))
    except TimeoutError:
        logger.error("could not write %d completion(s) at shutdown", flusher.backlog)
    # Its last counts go with the unregistration and the series' last slot (what the
    # dashboard shows of a recycled child's last seconds); neither holds the exit.
    await maintenance.unregister(FETCH_GRACE)
    if worker.series is not None:
        await worker.series.close(FETCH_GRACE)
    # middleware's on_worker_stop, then on_shutdown hooks and the lifespans' close
    await extensions_of(worker.queue).worker_stopped(worker)
    await worker.queue.signals.drain()  # after-hooks and signal handlers still running
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner.progress.close(), FETCH_GRACE)
    await worker.ops.stop()
    await emit(worker, Signal.WORKER_STOPPED)
    stale = flusher.stale
    logger.info(
        "worker %s stopped: %d succeeded, %d failed%s",
        worker.id,
        worker.processed,
        worker.failed,
        f", {stale} stale completion(s) dropped (their leases lapsed)" if stale else "",
    )
