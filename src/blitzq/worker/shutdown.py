"""A worker's graceful shutdown, in order: stop fetching, let runs finish (up to
``shutdown_timeout``), requeue the rest, stop the background loops, write every completion,
unregister, then the shutdown hooks, the lifespans (:mod:`blitzq.dependencies`) and signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..exceptions import BrokerError
from ..extensions.registry import extensions_of
from ..extensions.signals import Signal, SignalEvent

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

#: Seconds beyond ``block_timeout`` a stopping worker lets a fetch command in flight finish
#: before it cancels it (a server that stopped answering); also the most it waits to
#: unregister and to write progress updates in flight.
FETCH_GRACE = 2.0


async def shut_down(
    worker: Worker, background: list[asyncio.Task[None]], flusher_task: asyncio.Task[None]
) -> None:
    """Stop ``worker`` gracefully (module docstring); ``background``: its maintenance and
    other loops, ``flusher_task``: its completion writer's task."""
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
    await worker._fetcher.stop(max(worker.shutdown_timeout, worker.block_timeout + FETCH_GRACE))
    # 2. Let running tasks finish, up to shutdown_timeout after the stop; not the threads
    #    abandoned at their hard timeout (already committed, they may never return).
    assert worker._global is not None  # made at start
    drained = worker._global.drained(lambda: len(runner.timeouts.abandoned))
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
    worker._flusher.close()
    try:
        await asyncio.wait_for(flusher_task, timeout=max(5.0, worker.shutdown_timeout))
    except TimeoutError:
        logger.error("could not write %d completion(s) at shutdown", worker._flusher.backlog)
    # A server that stopped answering must not hold the exit (the record expires).
    with contextlib.suppress(BrokerError, TimeoutError):
        await asyncio.wait_for(worker.broker.unregister_worker(worker.id), FETCH_GRACE)
    # middleware's on_worker_stop, then on_shutdown hooks and the lifespans' close
    await extensions_of(worker.queue).worker_stopped(worker)
    await worker.queue.signals.drain()  # after-hooks and signal handlers still running
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner.progress.close(), FETCH_GRACE)
    await worker.ops.stop()
    await worker._emit(Signal.WORKER_STOPPED)
    logger.info(
        "worker %s stopped: %d succeeded, %d failed", worker.id, worker.processed, worker.failed
    )
