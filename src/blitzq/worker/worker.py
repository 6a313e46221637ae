"""The worker: lifecycle (start, run, signals, registration record; the graceful shutdown
is :mod:`.shutdown`).

A running worker owns the :class:`~blitzq.worker.fetch.Fetcher` (one fetch loop per subscribed
queue, slots reserved before each fetch), the :class:`~blitzq.worker.runner.Runner` that runs
what was fetched, the :class:`~blitzq.worker.flusher.Flusher` that writes completions, and the
background loops of :mod:`~blitzq.worker.maintenance` (promote scheduled messages, follow
cancellations, register the worker, renew leases, recover abandoned messages).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence

from .._checks import flag, integer, log_level, seconds, text
from ..broker import Broker
from ..broker.eviction import check_eviction
from ..dependencies import Resources
from ..exceptions import ConfigurationError
from ..extensions.registry import extensions_of
from ..extensions.signals import Signal
from ..logcontext import reset_worker_id, set_worker_id
from ..queue import Queue
from ..routing import check_queue_name, levels
from ..serialization import dumps
from . import heap
from .bad_keys import prepare_levels
from .burst import BURST_HORIZON, drain, settled
from .cpu import EXIT_FORKSERVER
from .cpu import check_options as check_cpu_options
from .deferral import OutageBackoff
from .endpoints import Ops
from .fetch import Fetcher
from .flusher import Flusher
from .heartbeat import progress_mark
from .identity import default_worker_id, new_instance, process_slot
from .limiter import Limiter, Slots
from .maintenance import Maintenance, running_tasks
from .ports import check_ops_options
from .recycling import MB, Recycler
from .runner import Runner
from .series import Series, start_feeds
from .shutdown import emit, shut_down
from .unknown import Knowers

logger = logging.getLogger("blitzq.worker")

#: Exit code of ``blitzq worker`` after a worker stopped to be restarted (abandoned threads
#: holding its slots, or too many of them; recycling): ``EX_TEMPFAIL`` of sysexits.h. The
#: supervisor (``--workers N``) restarts it; give a process manager a restart policy that
#: covers it (systemd ``Restart=on-failure``).
EXIT_RESTART = 75

#: Fewest connections (URL ``max_connections``) a worker's broker pool must allow: the events
#: listener holds one for good and a worker with two never fetched (measured); a pool under
#: ``len(queues) + 6`` works but is tight (a start-up warning).
MIN_POOL_CONNECTIONS = 3

#: Longest ``block_timeout`` in seconds: a stopping worker waits up to that long for a
#: blocked fetch to return.
MAX_BLOCK_TIMEOUT = 60.0


class Worker:
    """Runs the tasks of a :class:`~blitzq.Queue`.

    Args:
        queue: the Queue whose tasks (and broker settings) this worker uses.
        queues: queue names to consume (default: the Queue's ``name`` and every queue a
            registered task names); each includes its ``:high`` and ``:low`` levels.
        concurrency: tasks running at once in this process, across all queues.
        queue_concurrency: optional per-queue bound, ``{"emails": 5}`` (all levels together).
        batch_size: most messages taken in one fetch.
        block_timeout: seconds one fetch blocks on an empty queue.
        shutdown_timeout: seconds a graceful stop waits for running tasks before requeueing
            them.
        thread_pool_size: threads for sync tasks (default: ``concurrency``); one more is
            added for each thread abandoned at a hard timeout while it still runs.
        max_abandoned_threads: sync-task threads abandoned at their hard timeout and still
            running that the worker tolerates; one more and it stops gracefully, asking to be
            restarted (:attr:`restart_requested`; ``blitzq worker`` exits with
            :data:`EXIT_RESTART`). Default 10; 0 restarts at the first. An abandoned thread
            keeps its slot until it returns, so the worker also restarts as soon as they
            hold all ``concurrency`` slots, or all of a queue's ``queue_concurrency``.
        process_pool_size: processes for ``executor="process"`` tasks (default: CPU count).
        handle_signals: stop gracefully on SIGTERM / SIGINT (the CLI turns this on).
        name: worker id shown in records and stats (default ``host:pid-slot`` in a slot of the
            supervisor, stable across its restarts, else ``host:pid:random``; the process
            instance is :attr:`instance`, the unique registry key :attr:`key`).
        strict_memory_policy: refuse to start (ConfigurationError) when the server's
            ``maxmemory-policy`` can evict blitzq's keys; by default a WARNING is logged
            (see :mod:`blitzq.broker.eviction`).
        max_tasks_per_child: after this many tasks (succeeded plus failed attempts) the
            worker stops gracefully asking to be restarted, and a process-pool child is
            replaced after this many calls (``None``: never; see :mod:`.recycling`).
        max_memory_per_child: resident memory in megabytes (MiB) past which the worker stops
            gracefully asking to be restarted, and past which, after a call, the process
            pool is replaced (``None``: never; Linux only).
        burst: drain the queues and stop once they are empty and nothing runs (see
            :mod:`blitzq.worker.burst`; ``blitzq worker --burst``).
        burst_idle_timeout: with ``burst``, seconds the queues must stay drained before the
            worker stops (work arriving meanwhile is run and restarts the count); 0 stops at
            the first moment they are drained (``--burst-idle-timeout``).
        unknown_task_grace: seconds, from a message's first enqueue, during which a task
            this worker does not know is put back on the schedule for a worker that knows it
            (a rolling deploy); after that it is dead-lettered with reason
            ``"unknown task"``. 0 dead-letters at once (see :mod:`blitzq.worker.unknown`).
        metrics_port, health_port, ops_host: serve Prometheus ``/metrics`` and ``/health``,
            ``/ready`` on these TCP ports of ``ops_host`` (0: any free port; see
            :class:`~blitzq.worker.endpoints.Ops`, :attr:`ops` and docs/operations.md).
        freeze_gc: move the objects alive when the worker starts fetching out of the
            garbage collector's passes until it stops (:func:`gc.freeze`, see
            :mod:`blitzq.worker.heap`); ``False`` leaves the collector alone.
        failure_log_level, retry_log_level: levels (names or numbers) of the records of a
            task that failed for good and of a retried attempt (:mod:`.ending`).
        lifecycle_log_level: level of the ``received``/``started``/``succeeded`` records on
            the ``blitzq.task`` logger (:mod:`.lifecycle`; DEBUG: off under an INFO set-up).
        defer_base_delay, defer_max_delay: seconds a task whose start check (rate limit,
            lock, ...) could not reach the broker goes back on the schedule for: the base,
            doubling with each deferral of the message in a row, +-20 % jitter, up to the
            maximum (default 1 s and 60 s); no attempt is spent (see
            :mod:`blitzq.worker.deferral`).
        start_check_timeout: seconds one start check may take before it counts as an
            outage (default 10).
        pool: ``"thread"`` (default) or ``"cpu"``: where sync tasks left on their default
            executor run; ``"cpu"`` moves those it can (no ``Depends()`` parameter, no soft
            timeout) to the CPU pool (:mod:`blitzq.worker.cpu`; POSIX only).
        cpu_processes: children of the CPU pool (default: CPU count).
        cpu_max_tasks: calls after which a CPU-pool child is replaced (``None``: never).
        cpu_max_memory: resident memory past which a CPU-pool child is replaced after a
            call: bytes, or a size with a unit (``"512MiB"``, ``"1G"``); ``None``: never
            (Linux only).

    Every numeric option must be a real number (``int`` for counts; never ``bool``), finite
    and in range (``block_timeout`` at most 60 s, ``shutdown_timeout`` at most ten years), so
    a stop stays bounded; see docs/configuration.md.

    Raises:
        ConfigurationError: an invalid bound (a bool, NaN, infinite or out-of-range number,
            or a value of the wrong type), an unknown log level, an empty queue list or a
            queue name :func:`~blitzq.routing.check_queue_name` refuses (a priority level
            such as ``"default:high"``: a worker of ``"default"`` serves every level).
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
        max_abandoned_threads: int = 10,
        strict_memory_policy: bool = False,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        burst: bool = False,
        unknown_task_grace: float = 300.0,
        metrics_port: int | None = None,
        health_port: int | None = None,
        ops_host: str = "0.0.0.0",
        freeze_gc: bool = True,
        failure_log_level: int | str = "error",
        retry_log_level: int | str = "warning",
        lifecycle_log_level: int | str = "debug",
        burst_idle_timeout: float = 0.0,
        defer_base_delay: float = 1.0,
        defer_max_delay: float = 60.0,
        start_check_timeout: float = 10.0,
        pool: str = "thread",
        cpu_processes: int | None = None,
        cpu_max_tasks: int | None = None,
        cpu_max_memory: int | str | None = None,
    ) -> None:
        # Numbers are real numbers (never bool, NaN or infinite) in range: a NaN shutdown
        # timeout would make a stop unbounded (or instant), a NaN bound never trips.
        integer("concurrency", concurrency, minimum=1)
        integer("batch_size", batch_size, minimum=1)
        block_timeout = seconds("block_timeout", block_timeout, maximum=MAX_BLOCK_TIMEOUT)
        shutdown_timeout = seconds("shutdown_timeout", shutdown_timeout, strict=False)
        integer("max_abandoned_threads", max_abandoned_threads, minimum=0)
        if thread_pool_size is not None:
            integer("thread_pool_size", thread_pool_size, minimum=1)
        if process_pool_size is not None:
            integer("process_pool_size", process_pool_size, minimum=1)
        memory = check_cpu_options(
            pool, cpu_processes, cpu_max_tasks, cpu_max_memory, queue.tasks.values()
        )
        #: Where sync tasks on their default executor run: ``"thread"`` or ``"cpu"``.
        self.pool = pool
        self.cpu_processes = cpu_processes or os.cpu_count() or 2
        self.cpu_max_tasks = cpu_max_tasks
        #: Bytes (``None``: no limit).
        self.cpu_max_memory = memory
        #: Exit code ``blitzq worker`` ends with when :attr:`restart_requested`.
        self.exit_code = EXIT_RESTART
        if max_tasks_per_child is not None:
            integer("max_tasks_per_child", max_tasks_per_child, minimum=1)
        if max_memory_per_child is not None:
            integer("max_memory_per_child", max_memory_per_child, minimum=1)
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory_per_child = max_memory_per_child
        for q, n in (queue_concurrency or {}).items():
            integer(f"queue_concurrency[{q!r}]", n, minimum=1)
        flag("handle_signals", handle_signals)
        flag("strict_memory_policy", strict_memory_policy)
        flag("burst", burst)
        flag("freeze_gc", freeze_gc)
        self.freeze_gc, self._froze = freeze_gc, False
        self.failure_log_level = log_level("failure_log_level", failure_log_level)
        self.retry_log_level = log_level("retry_log_level", retry_log_level)
        self.lifecycle_log_level = log_level("lifecycle_log_level", lifecycle_log_level)
        unknown_task_grace = seconds("unknown_task_grace", unknown_task_grace, strict=False)
        self.burst_idle_timeout = seconds("burst_idle_timeout", burst_idle_timeout, strict=False)
        self.idle_since: float | None = None  # loop.time() the queues became drained (burst)
        self.outage_backoff = OutageBackoff.checked(
            defer_base_delay, defer_max_delay, start_check_timeout
        )
        text("name", name)
        check_ops_options(metrics_port, health_port, ops_host)
        if isinstance(queues, str):
            raise ConfigurationError(f"queues must be a list of queue names, got {queues!r}")
        if queue.connection_injected:
            given = " and ".join(queue.injected_connections)
            raise ConfigurationError(
                "a worker needs connections of its own (blocking reads, consumers, a result "
                f"listener, leases, reconnects), and this Queue works over an application's "
                f"connection ({given}): give the worker's Queue redis_url= / amqp_url= (the "
                "CLI's --redis-url / --amqp-url do)"
            )
        self.queue = queue
        if queues is None:
            names = {queue.name} | {t.queue for t in queue.tasks.values()}
            names |= {p.queue for p in queue.periodic_tasks.values() if p.queue}
            queues = sorted(names)
        self.queues = list(dict.fromkeys(check_queue_name("queue", q) for q in queues))
        if not self.queues:
            raise ConfigurationError("a worker needs at least one queue")
        #: Queues paused by ``blitzq queue pause`` (the fetch loops take nothing from them);
        #: kept by the maintenance loops from the broker's paused set and event channel.
        self.paused: set[str] = set()
        self.levels = {q: levels(q) for q in self.queues}
        self.physical_queues = [p for q in self.queues for p in self.levels[q]]
        self.concurrency = concurrency
        self.queue_concurrency = dict(queue_concurrency or {})
        self.batch_size = batch_size
        self.block_timeout = block_timeout
        self.shutdown_timeout = shutdown_timeout
        self.thread_pool_size = thread_pool_size or concurrency
        self.process_pool_size = process_pool_size or os.cpu_count() or 2
        self.handle_signals = handle_signals
        self.max_abandoned_threads = max_abandoned_threads
        #: Why the worker asked to be restarted (``None``: it did not).
        self.restart_reason: str | None = None
        #: Messages a blocking fetch returned that found no free slot and went back at once.
        self.handed_back = 0
        #: Which live workers know which task, and how many messages were handed to them.
        self.knowers = Knowers(self)
        self.strict_memory_policy = strict_memory_policy
        self.burst = burst
        self.unknown_task_grace = float(unknown_task_grace)
        self.metrics_port = metrics_port
        self.health_port = health_port
        self.ops_host = ops_host
        #: This process's instance of the worker, ``pid:random``: new at every (re)start.
        self.instance = new_instance()
        #: The supervisor's slot this process runs in (``None``: not supervised).
        self.slot = process_slot()
        #: The id shown in records, logs, metrics, signals and the registry: ``host:pid-slot``
        #: under a supervisor (stable across restarts of the slot), else ``host:pid:random``.
        self.id = name or default_worker_id(self.instance)
        #: Unique per live process: the registry key and the stream consumer name (during a
        #: reload the old and new worker of one slot share :attr:`id`, never this).
        self.key = f"{self.id}:{self.instance}" if self.slot is not None else self.id
        self._stop_event: asyncio.Event | None = None
        self._stopping = False
        self._runner: Runner | None = None
        self.series: Series | None = None  # the dashboard's time series (made at start)
        self._started = time.time()
        #: What the Queue's lifespans yielded, for ``Depends()`` parameters.
        self.resources = Resources()
        #: The metrics and health endpoints (addresses once running).
        self.ops = Ops(self)

    # --------------------------------------------------------------- control
    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stopping

    @property
    def processed(self) -> int:
        """Tasks that succeeded in this worker (a run whose completion the broker refused as
        stale -- its lease lapsed and another delivery ran it -- is not counted)."""
        return self._runner.ending.processed if self._runner else 0

    @property
    def failed(self) -> int:
        """Attempts that failed (or messages dead-lettered) in this worker (not those whose
        completion was refused as stale)."""
        return self._runner.ending.failed if self._runner else 0

    @property
    def stale_completions(self) -> int:
        """Completions of this worker the broker dropped as stale: the delivery's lease was
        lost (the process paused or cut off past its visibility timeout) and another worker
        recovered the message, so nothing was written (fencing; see docs/guarantees.md)."""
        flusher: Flusher | None = getattr(self, "_flusher", None)  # made by run()
        return flusher.stale if flusher is not None else 0

    @property
    def runner(self) -> Runner:
        """The runner of the running worker.

        Raises:
            RuntimeError: the worker is not running.
        """
        if self._runner is None:
            raise RuntimeError("the worker is not running")
        return self._runner

    @property
    def abandoned_threads(self) -> int:
        """Runs abandoned at their hard timeout that are still running: sync-task threads,
        and async tasks still running ``CANCEL_GRACE`` after their cancellation."""
        return len(self._runner.timeouts.abandoned) if self._runner else 0

    @property
    def abandoned_threads_total(self) -> int:
        """Runs abandoned at their hard timeout since the worker started (see
        :attr:`abandoned_threads`)."""
        return self._runner.timeouts.abandoned_total if self._runner else 0

    @property
    def restart_requested(self) -> bool:
        """Whether the worker stopped (or is stopping) to be restarted."""
        return self.restart_reason is not None

    def request_restart(
        self, reason: str, level: int = logging.ERROR, code: int = EXIT_RESTART
    ) -> None:
        """Stop gracefully and ask to be restarted (``blitzq worker`` exits with ``code``,
        :data:`EXIT_RESTART` by default: :attr:`exit_code`); ``reason`` is logged at
        ``level``."""
        if self.restart_reason is None:
            self.restart_reason = reason
            self.exit_code = code
            logger.log(level, "worker %s restarts: %s", self.id, reason)
        self.stop()

    def forkserver_refused(self, reason: str) -> None:
        """The CPU pool's forkserver could not start a child: stop gracefully, and ``blitzq
        worker`` exits :data:`~.cpu.EXIT_FORKSERVER` so the supervisor starts a fresh one."""
        self.request_restart(f"CPU pool: {reason}", code=EXIT_FORKSERVER)

    def stop(self) -> None:
        """Ask the worker to stop gracefully; safe from signal handlers and other coroutines."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    async def run(self) -> None:
        """Run until :meth:`stop` (or a signal, or cancellation), then shut down gracefully.

        Raises:
            ConfigurationError: the broker's pool (URL ``max_connections``) is below
                :data:`MIN_POOL_CONNECTIONS`, with which the worker could never fetch (a pool
                under ``len(queues) + 6`` only logs a warning).
            BrokerError: the broker could not be reached at start.
        """
        loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        if self.handle_signals:  # before anything slow, so an early SIGTERM is graceful too
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        token = set_worker_id(self.id)  # log records of its tasks carry it (logcontext)
        try:
            await self._run()
        finally:
            reset_worker_id(token)
            if self._froze:
                self._froze = False
                heap.thaw()
            if self.handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _run(self) -> None:
        self.broker: Broker = self.queue.broker
        broker = self.broker
        await check_eviction(broker, strict=self.strict_memory_policy)
        # Tasks declared mode="fast" travel the broker's fast lane: fetch from it too.
        lane = broker.fast_lane if any(t.fast for t in self.queue.tasks.values()) else None
        loops = len(self.queues) * (2 if lane is not None else 1)
        size = broker.transport.pool_size
        if size is not None and size < MIN_POOL_CONNECTIONS:
            # The events listener holds one connection for good and the fetch loops, flusher
            # and maintenance need the others: below this nothing is ever fetched.
            raise ConfigurationError(
                f"the broker's pool allows {size} connection(s); a worker needs at least "
                f"{MIN_POOL_CONNECTIONS} (at least {loops + 6} recommended for its "
                f"{loops} fetch loop(s)): raise max_connections in the URL"
            )
        if size is not None and size < loops + 6:
            logger.warning(
                "the broker's pool allows %d connections for %d fetch loops and the worker's "
                "own; raise max_connections in the URL",
                size,
                loops,
            )
        await prepare_levels(broker, self.physical_queues, self.key)  # a WRONGTYPE level: later
        if lane is not None:
            await prepare_levels(lane, self.physical_queues, self.key)
        await emit(self, Signal.WORKER_STARTING)
        # on_startup hooks, lifespans (closed by _shutdown), then middleware's on_worker_start
        await extensions_of(self.queue).worker_started(self)
        self._global = Limiter(self.concurrency)
        self._slots = {
            q: Slots(
                self._global,
                Limiter(self.queue_concurrency[q]) if q in self.queue_concurrency else None,
            )
            for q in self.queues
        }
        self._flusher = Flusher(broker)
        self._runner = Runner(self, broker, self._flusher)
        # A supervised worker tells its supervisor once a run of its was committed, or a
        # suspect starts alone (its crash is the task's, counted against its own budget).
        mark = progress_mark()
        self._runner.ending.first_run = mark
        self._runner.admission.solo.on_alone = mark
        self._fetcher = Fetcher(self, broker, self._runner, self._slots, lane)
        await self._runner.cpu.warm()  # the forkserver imports the task modules once
        self._runner.observer = self.ops.metrics  # None without metrics: nothing installed
        if self.ops.metrics is not None:
            self._flusher.on_written = self.ops.metrics.written
        served = await self.ops.start(self._fetcher)
        self._maintenance = Maintenance(self, broker, self._slots)
        flusher_task = asyncio.create_task(self._flusher.run(), name="blitzq-flusher")
        self.series, feeds = start_feeds(self, self.runner)  # the dashboard's list and charts
        background = await self._maintenance.start() + served + feeds
        if self.max_memory_per_child:
            recycler = Recycler(self, self.max_memory_per_child * MB)
            background.append(asyncio.create_task(recycler.run(), name="blitzq-recycler"))
        if self.freeze_gc:
            heap.freeze()
            self._froze = True
        self._fetcher.start()
        if self.burst:  # stops the worker once its queues are drained
            burst = drain(self, self._fetcher, self._flusher)
            background.append(asyncio.create_task(burst, name="blitzq-burst"))
        logger.info(
            "worker %s started: instance=%s queues=%s concurrency=%d mode=%s",
            self.id,
            self.instance,
            ",".join(self.queues),
            self.concurrency,
            self.queue.mode,
        )
        await emit(self, Signal.WORKER_STARTED)
        assert self._stop_event is not None
        parts = (self._fetcher, self._global, self._flusher, flusher_task, self._maintenance)
        try:
            await self._stop_event.wait()
        except asyncio.CancelledError:
            self._stopping = True
            await shut_down(self, *parts, background)
            raise
        await shut_down(self, *parts, background)
        if self.ops.error is not None:  # a port still in use after the wait (Ops)
            raise self.ops.error

    async def settled(self, horizon: float = BURST_HORIZON) -> bool:
        """Whether the running worker has nothing left to do: none of its queues holds a
        waiting or unacknowledged message, it runs and starts nothing, every completion is
        written, no fetch holds a message, and nothing on the schedule is due within
        ``horizon`` seconds (due ones are promoted on the way); the check of burst mode,
        and of :func:`blitzq.testing.drain`.

        Raises:
            BrokerError: the broker could not be reached.
            RuntimeError: the worker is not running.
        """
        if self._runner is None:
            raise RuntimeError("the worker is not running")
        return await settled(self, self._fetcher, self._flusher, horizon)

    def running_tokens(self, queue: str) -> list[bytes]:
        """Delivery tokens from physical ``queue`` whose leases this worker keeps: running
        jobs (and deliveries before their start), and ended ones whose completions are not
        written yet (``Flusher.tokens``: a completion waiting for a migrating slot, say, must
        not let its lease lapse, or another worker would run the task again)."""
        if self._runner is None:
            return []
        return self._runner.running_tokens(queue) + self._runner.flusher.tokens(queue)

    def info(self) -> bytes:
        """This worker's registration record; ``in_flight`` (RabbitMQ only): what its
        transport's fetches took and did not ack, and what it prefetched, per queue
        (``Transport.holding``), which ``queue stats`` adds up."""
        runner = self._runner
        held = self.broker.holding()
        return dumps(
            {
                **({"in_flight": held} if held is not None else {}),
                "id": self.id,
                "key": self.key,
                "instance": self.instance,
                "slot": self.slot,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": self.queues,
                "tasks": sorted(self.queue.tasks),
                "handed_over": self.knowers.handed_over,
                "concurrency": self.concurrency,
                "running": len(runner.jobs) if runner else 0,
                "running_tasks": running_tasks(runner.jobs) if runner else [],
                "paused": sorted(self.paused.intersection(self.queues)),
                "processed": self.processed,
                "failed": self.failed,
                "abandoned_threads": self.abandoned_threads,
                "started_at": self._started,
                "mode": self.queue.mode,
                "heartbeat_at": time.time(),
            }
        )
