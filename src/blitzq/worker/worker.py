"""The worker: fetch loops, execution, group commit, background loops and shutdown.

One fetch loop per subscribed queue reserves slots from the queue's and the global limiter
*before* it fetches, takes up to that many messages without blocking, and blocks for a single
message (at most ``block_timeout`` seconds) only when the queue is empty. Excess work stays in
Redis. Completions go to the :class:`~blitzq.worker.flusher.Flusher`. Background loops promote
due scheduled messages, register the worker, renew leases and recover abandoned messages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..broker.base import Broker, Delivery
from ..exceptions import BrokerError, ConfigurationError, SerializationError
from ..queue import Queue
from ..serialization import decode_envelope, dumps
from .execution import Job, Outcomes
from .executors import ProcessPool, start_eagerly
from .flusher import Flusher
from .limiter import Limiter, Slots
from .maintenance import Maintenance

logger = logging.getLogger("blitzq.worker")


class Worker:
    """Runs the tasks of a :class:`~blitzq.Queue`.

    Args:
        queue: the Queue whose tasks (and broker settings) this worker uses.
        queues: queue names to consume (default: the Queue's ``name`` and every queue a
            registered task names).
        concurrency: tasks running at once in this process, across all queues.
        queue_concurrency: optional per-queue bound, ``{"emails": 5}``.
        batch_size: most messages taken in one fetch.
        block_timeout: seconds one fetch blocks on an empty queue.
        shutdown_timeout: seconds a graceful stop waits for running tasks before requeueing
            them.
        thread_pool_size: threads for sync tasks (default: ``concurrency``).
        process_pool_size: processes for ``executor="process"`` tasks (default: CPU count).
        handle_signals: stop gracefully on SIGTERM / SIGINT (the CLI turns this on).
        name: worker id shown in records and stats (default ``host:pid:random``).

    Raises:
        ConfigurationError: an invalid bound or an empty queue list.
    """

    def __init__(
        self,
        queue: Queue,
        queues: Sequence[str] | None = None,
        concurrency: int = 100,
        queue_concurrency: Mapping[str, int] | None = None,
        batch_size: int = 500,
        block_timeout: float = 1.0,
        shutdown_timeout: float = 30.0,
        thread_pool_size: int | None = None,
        process_pool_size: int | None = None,
        handle_signals: bool = False,
        name: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1")
        if batch_size < 1:
            raise ConfigurationError("batch_size must be >= 1")
        if block_timeout <= 0 or shutdown_timeout < 0:
            raise ConfigurationError("block_timeout must be > 0 and shutdown_timeout >= 0")
        self.queue = queue
        if queues is None:
            names = {queue.name} | {t.queue for t in queue.tasks.values()}
            queues = sorted(names)
        self.queues = list(dict.fromkeys(queues))
        if not self.queues:
            raise ConfigurationError("a worker needs at least one queue")
        self.concurrency = concurrency
        self.queue_concurrency = dict(queue_concurrency or {})
        for q, n in self.queue_concurrency.items():
            if n < 1:
                raise ConfigurationError(f"queue_concurrency[{q!r}] must be >= 1")
        self.batch_size = batch_size
        self.block_timeout = block_timeout
        self.shutdown_timeout = shutdown_timeout
        self.thread_pool_size = thread_pool_size or concurrency
        self.process_pool_size = process_pool_size or os.cpu_count() or 2
        self.handle_signals = handle_signals
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.processed = 0
        self.failed = 0
        self._stop_event: asyncio.Event | None = None
        self._stopping = False
        self._jobs: set[Job] = set()
        self._fetching: dict[str, bool] = {}
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._processes: ProcessPool | None = None
        self._started = time.time()

    # --------------------------------------------------------------- control
    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stopping

    def _stop_requested(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Ask the worker to stop gracefully; safe from signal handlers and other coroutines."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    async def run(self) -> None:
        """Run until :meth:`stop` (or a signal, or cancellation), then shut down gracefully.

        Raises:
            BrokerError: the broker could not be reached at start.
        """
        loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        if self.handle_signals:  # before anything slow, so an early SIGTERM is graceful too
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        try:
            await self._run()
        finally:
            if self.handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _run(self) -> None:
        self.broker: Broker = self.queue.broker
        broker = self.broker
        await broker.prepare_consumer(self.queues, self.id)
        for hook in self.queue.on_startup:
            await hook()
        self._global = Limiter(self.concurrency)
        self._slots = {
            q: Slots(
                self._global,
                Limiter(self.queue_concurrency[q]) if q in self.queue_concurrency else None,
            )
            for q in self.queues
        }
        self._flusher = Flusher(broker)
        self._outcomes = Outcomes(
            self.id, self.queue.store_results, self.queue.result_ttl, self.queue.max_message_size
        )
        self._maintenance = Maintenance(self, broker)
        flusher_task = asyncio.create_task(self._flusher.run(), name="blitzq-flusher")
        fetchers = {
            q: asyncio.create_task(self._fetch_loop(q), name=f"blitzq-fetch-{q}")
            for q in self.queues
        }
        background = self._maintenance.start()
        logger.info(
            "worker %s started: queues=%s concurrency=%d mode=%s",
            self.id,
            ",".join(self.queues),
            self.concurrency,
            self.queue.mode,
        )
        assert self._stop_event is not None
        try:
            await self._stop_event.wait()
        except asyncio.CancelledError:
            self._stopping = True
            await self._shutdown(fetchers, background, flusher_task)
            raise
        await self._shutdown(fetchers, background, flusher_task)

    # ------------------------------------------------------------- fetching
    async def _fetch_loop(self, queue: str) -> None:
        slots = self._slots[queue]
        batch = self.batch_size
        backoff = 0.1
        while not self._stop_requested():
            n = await slots.reserve(batch)
            if self._stop_requested():
                slots.release(n)
                return
            # While this flag is set the loop may hold messages, so shutdown waits for it
            # instead of cancelling it.
            self._fetching[queue] = True
            try:
                deliveries = await self._fetch(queue, slots, n)
            except BrokerError as exc:
                logger.warning("fetch from %s failed, retrying in %.1f s: %s", queue, backoff, exc)
                self._fetching[queue] = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                self._fetching[queue] = False
            backoff = 0.1
            if self._stop_requested():
                # Fetched after the stop: put back untouched, never dropped.
                for d in deliveries:
                    self._requeue_unstarted(d)
                slots.release(len(deliveries))
                return
            for d in deliveries:
                try:
                    self._start(d, slots)
                except Exception:  # a bug here must not stop the queue; the lease recovers it
                    logger.exception("could not start a message from %s", queue)
                    slots.release()

    async def _fetch(self, queue: str, slots: Slots, n: int) -> list[Delivery]:
        """Fetch with ``n`` reserved slots; on return, exactly one slot is held per delivery.

        Takes what is waiting without blocking. On an empty queue it blocks for a single
        message holding only the queue's own slot, so an idle queue never keeps global
        capacity from busy ones, and takes a global slot back once a message arrives.
        """
        broker = self.broker
        try:
            deliveries = await broker.fetch(queue, n, 0)
        except BrokerError:
            slots.release(n)
            raise
        if deliveries or self._stop_requested():
            slots.release(n - len(deliveries))
            return deliveries
        slots.release(n - 1)
        slots.global_limiter.release(1)
        try:
            deliveries = await broker.fetch(queue, 1, self.block_timeout)
        except BrokerError:
            slots.release_queue(1)
            raise
        if not deliveries:
            slots.release_queue(1)
            return deliveries
        await slots.global_limiter.wait_free()
        slots.global_limiter.take(1)
        return deliveries

    def _requeue_unstarted(self, d: Delivery) -> None:
        from ..broker.base import Completion

        try:
            task_id = decode_envelope(d.payload).id
        except SerializationError:
            task_id = (d.token or b"").decode() or "unknown"
        self._flusher.add(Completion(d.queue, d.token, task_id, requeue=d.payload))

    # ------------------------------------------------------------- execution
    def _start(self, d: Delivery, slots: Slots) -> None:
        """Begin one delivery; the slot it holds is released when it is really done."""
        if len(d.payload) > self.queue.max_message_size:
            self._reject(d, "message too large", f"{len(d.payload)} bytes", slots)
            return
        try:
            env = decode_envelope(d.payload)
        except SerializationError as exc:
            self._reject(d, "malformed message", str(exc), slots)
            return
        task = self.queue.tasks.get(env.task)
        if task is None:
            self._reject(
                d,
                "unknown task",
                f"no task named {env.task!r} is registered in this worker",
                slots,
                env.id,
                env.task,
            )
            return
        job = Job(d, env, task)
        job.started_at = time.time()
        timeout = env.timeout or task.timeout
        executor = task.executor
        if executor == "async":
            try:
                coro = task.fn(*env.args, **env.kwargs)
            except BaseException as exc:
                self._finish(job, None, exc)
                slots.release()
                return
            result, error, started = start_eagerly(coro)  # type: ignore[arg-type]
            if started is None:
                self._finish(job, result, error)
                slots.release()
                return
            handle: asyncio.Future[Any] = started
        else:
            call = functools.partial(task.fn, *env.args, **env.kwargs)
            loop = asyncio.get_running_loop()
            if executor == "thread":
                if self._threads is None:
                    self._threads = concurrent.futures.ThreadPoolExecutor(
                        self.thread_pool_size, thread_name_prefix="blitzq-task"
                    )
                ctx = contextvars.copy_context()
                handle = loop.run_in_executor(self._threads, ctx.run, call)
            else:
                if self._processes is None:
                    self._processes = ProcessPool(self.process_pool_size)
                handle = self._processes.submit(task.fn, env.args, env.kwargs)
        job.handle = handle
        self._jobs.add(job)
        if timeout:
            job.timer = asyncio.get_running_loop().call_later(timeout, self._on_timeout, job)
        handle.add_done_callback(functools.partial(self._on_done, job, slots))

    def _finish(self, job: Job, result: Any, error: BaseException | None) -> None:
        if error is None:
            completion = self._outcomes.success(job, result)
            self.processed += 1
        else:
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                logger.error("task %s raised %r; treated as a failure", job.envelope.id, error)
            completion = self._outcomes.failure(job, error)
            self.failed += 1
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "task %s %s attempt %d failed: %r",
                    job.envelope.task,
                    job.envelope.id,
                    job.attempt,
                    error,
                )
        if completion is not None:
            self._flusher.add(completion)

    def _on_timeout(self, job: Job) -> None:
        if job.finished:
            return
        job.timed_out = True
        timeout = job.envelope.timeout or job.task.timeout or 0.0
        if job.task.executor == "async":
            job.handle.cancel()
            return
        # A thread or process cannot be interrupted: record the timeout now, keep the slot
        # until the call really returns so the concurrency bound holds.
        job.finished = True
        self.failed += 1
        self._flusher.add(self._outcomes.timeout(job, timeout))

    def _on_done(self, job: Job, slots: Slots, handle: asyncio.Future[Any]) -> None:
        self._jobs.discard(job)
        if job.timer is not None:
            job.timer.cancel()
        slots.release()
        if job.finished:
            return
        job.finished = True
        if job.timed_out:
            timeout = job.envelope.timeout or job.task.timeout or 0.0
            self.failed += 1
            self._flusher.add(self._outcomes.timeout(job, timeout))
        elif handle.cancelled():
            # Not cancelled by the worker (that marks the job finished first): the task
            # cancelled itself, which counts as a failure rather than a silent requeue loop.
            self._finish(job, None, asyncio.CancelledError("the task was cancelled"))
        else:
            error = handle.exception()
            self._finish(job, None if error else handle.result(), error)

    def _reject(
        self,
        d: Delivery,
        reason: str,
        error: str,
        slots: Slots,
        task_id: str | None = None,
        task: str = "",
    ) -> None:
        logger.warning("dead-lettering message from %s: %s (%s)", d.queue, reason, error)
        self._flusher.add(self._outcomes.rejected(d, reason, error, task_id, task))
        self.failed += 1
        slots.release()

    def running_tokens(self, queue: str) -> list[bytes]:
        """Delivery tokens of the jobs of ``queue`` still running (for lease renewal)."""
        return [
            j.delivery.token
            for j in self._jobs
            if j.delivery.queue == queue and j.delivery.token is not None
        ]

    def info(self) -> bytes:
        """This worker's registration record."""
        return dumps(
            {
                "id": self.id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": self.queues,
                "concurrency": self.concurrency,
                "running": len(self._jobs),
                "processed": self.processed,
                "failed": self.failed,
                "started_at": self._started,
                "mode": self.queue.mode,
            }
        )

    # -------------------------------------------------------------- shutdown
    async def _shutdown(
        self,
        fetchers: dict[str, asyncio.Task[None]],
        background: list[asyncio.Task[None]],
        flusher_task: asyncio.Task[None],
    ) -> None:
        logger.info("worker %s stopping: %d task(s) running", self.id, len(self._jobs))
        # 1. Stop fetching. A loop inside a fetch finishes that command (its messages are
        #    requeued); a loop waiting for a free slot holds no message and is cancelled.
        for q, t in fetchers.items():
            if not self._fetching.get(q):
                t.cancel()
        for t in fetchers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        # 2. Let running tasks finish, up to shutdown_timeout.
        if self._jobs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._global.drained(), timeout=self.shutdown_timeout)
        # 3. Requeue what is still running.
        leftover = [j for j in self._jobs if not j.finished]
        for job in leftover:
            job.finished = True
            self._flusher.add(Outcomes.requeue(job))
            if job.handle is not None:
                job.handle.cancel()
        if leftover:
            logger.warning("requeued %d task(s) still running at shutdown", len(leftover))
        await asyncio.sleep(0)
        # redis-py can swallow a cancellation that lands while it opens a connection (the
        # command then returns normally), so cancel again until every loop has ended.
        remaining = set(background)
        while remaining:
            for t in remaining:
                t.cancel()
            _, remaining = await asyncio.wait(remaining, timeout=0.5)
        for t in background:
            if not t.cancelled() and t.exception() is not None:
                logger.error("background loop %s failed", t.get_name(), exc_info=t.exception())
        # 4. Write every completion (bounded: unwritten acks are redelivered, never lost).
        self._flusher.close()
        try:
            await asyncio.wait_for(flusher_task, timeout=max(5.0, self.shutdown_timeout))
        except TimeoutError:
            logger.error("could not write %d completion(s) at shutdown", self._flusher.backlog)
        with contextlib.suppress(BrokerError):
            await self.broker.unregister_worker(self.id)
        for hook in self.queue.on_shutdown:
            try:
                await hook()
            except Exception:
                logger.exception("shutdown hook failed")
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(kill=bool(leftover))
        logger.info(
            "worker %s stopped: %d succeeded, %d failed", self.id, self.processed, self.failed
        )
