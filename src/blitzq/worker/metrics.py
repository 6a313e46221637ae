"""Prometheus metrics of one worker (``Worker(metrics_port=...)``, ``blitzq worker
--metrics-port``); needs the ``metrics`` extra (``prometheus-client``).

Per-run metrics are fed by the runner through :class:`RunMetrics`, the worker's run
observer: :meth:`RunMetrics.started` when a run starts, :meth:`RunMetrics.committed` with the
run's typed :class:`~blitzq.extensions.middleware.Outcome` when its completion is handed to
the writer (the same value the after-hooks get, from :func:`blitzq.worker.outcomes.outcome_of`),
and :meth:`RunMetrics.ended` for a delivery that ends before it runs (``expired`` by its
``max_age`` start check, ``rejected``: malformed, too large or of an unknown task). A worker
without metrics has no observer: the runner checks one attribute for ``None`` per run.

Broker-wide values (queue depths, dead letters, registered workers, the namespace's stale
completions) are sampled every :data:`SAMPLE_INTERVAL` seconds by :meth:`RunMetrics.sample_loop`
in the worker's event loop, never per task; this worker's own counters (stale completions,
abandoned threads) are read when Prometheus scrapes.

Every metric lives in a registry of its own per worker (not prometheus-client's global one),
so two workers in one process do not clash. Label values are bounded: queues are the
worker's own, outcomes a fixed set, task names capped at :data:`MAX_TASK_NAMES` distinct
values (the rest are reported as ``_other``); never a task id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "metrics need prometheus-client: pip install 'blitzq[metrics]'"
    ) from exc

if TYPE_CHECKING:
    from ..extensions.middleware import Outcome
    from .execution import Job
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

#: Seconds between two samples of the broker-wide gauges.
SAMPLE_INTERVAL = 5.0
#: Most distinct task names used as label values; later names count as ``_other``.
MAX_TASK_NAMES = 100
#: The label value of task names past :data:`MAX_TASK_NAMES` (and of unreadable messages).
OTHER_TASK = "_other"
#: The ``queue`` label of the schedule, which is one set for the whole namespace.
ALL_QUEUES = "*"

#: Outcomes counted in ``blitzq_tasks_total`` (a run put back at shutdown is not counted).
OUTCOMES = ("succeeded", "failed", "retried", "dead_lettered", "cancelled", "expired", "rejected")

#: Histogram buckets of task durations and queue latency, seconds.
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class _WorkerCounters(Collector):
    """This worker's own counters, read at scrape time (plain ints of the running worker)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Any]:
        worker = self.worker
        yield CounterMetricFamily(
            "blitzq_stale_completions",
            "Completions of this worker the broker refused as stale (lease lost; fencing).",
            value=worker.stale_completions,
        )
        yield CounterMetricFamily(
            "blitzq_abandoned_threads",
            "Sync-task threads abandoned at their hard timeout since the worker started.",
            value=worker.abandoned_threads_total,
        )
        yield GaugeMetricFamily(
            "blitzq_abandoned_threads_running",
            "Sync-task threads abandoned at their hard timeout and still running.",
            value=worker.abandoned_threads,
        )


class RunMetrics:
    """The metrics of one worker, and the run observer the runner calls.

    Args:
        worker: the worker measured (its queues, namespace, broker and counters are read).

    Attributes:
        registry: the ``prometheus_client.CollectorRegistry`` holding every metric.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.namespace = worker.queue.namespace
        registry = self.registry = CollectorRegistry()
        self.tasks_total = Counter(
            "blitzq_tasks",
            "Task attempts by final outcome (each attempt counted once).",
            ("queue", "task", "outcome"),
            registry=registry,
        )
        self.duration = Histogram(
            "blitzq_task_duration_seconds",
            "Seconds from the start of a run to its completion.",
            ("queue", "task"),
            registry=registry,
            buckets=BUCKETS,
        )
        self.latency = Histogram(
            "blitzq_task_queue_latency_seconds",
            "Seconds from the (latest) enqueue of a message to the start of its run.",
            ("queue",),
            registry=registry,
            buckets=BUCKETS,
        )
        self.in_progress = Gauge(
            "blitzq_tasks_in_progress", "Runs started and not ended.", ("queue",), registry=registry
        )
        self.depth = Gauge(
            "blitzq_queue_depth",
            "Messages per queue and state (sampled from the broker's queue stats).",
            ("queue", "state"),
            registry=registry,
        )
        self.dead_letters = Gauge(
            "blitzq_dead_letters", "Dead letters stored.", ("namespace",), registry=registry
        )
        self.workers = Gauge(
            "blitzq_workers", "Registered live workers.", ("namespace",), registry=registry
        )
        self.namespace_stale = Gauge(
            "blitzq_namespace_stale_completions",
            "Completions refused as stale by fencing in the namespace, all workers.",
            ("namespace",),
            registry=registry,
        )
        registry.register(_WorkerCounters(worker))
        self._names: set[str] = set()
        # Children by label values: labels() takes a lock and builds a tuple each call.
        self._counts: dict[tuple[str, str, str], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}
        self._latencies: dict[str, Any] = {}
        self._running: dict[str, Any] = {}

    # ------------------------------------------------------------- per run
    def _task(self, name: str) -> str:
        if name in self._names:
            return name
        if len(self._names) >= MAX_TASK_NAMES or not name:
            return OTHER_TASK
        self._names.add(name)
        return name

    def _count(self, queue: str, task: str, outcome: str) -> None:
        key = (queue, task, outcome)
        child = self._counts.get(key)
        if child is None:
            child = self._counts[key] = self.tasks_total.labels(queue, self._task(task), outcome)
        child.inc()

    def started(self, job: Job) -> None:
        """A run of ``job`` started (``job.started_at`` set): in progress, queue latency."""
        queue = job.delivery.queue
        running = self._running.get(queue)
        if running is None:
            running = self._running[queue] = self.in_progress.labels(queue)
            self._latencies[queue] = self.latency.labels(queue)
        running.inc()
        enqueued = job.envelope.enqueued_at
        if enqueued:
            self._latencies[queue].observe(max(0.0, job.started_at - enqueued))

    def committed(self, job: Job, outcome: Outcome | None) -> None:
        """``job``'s completion was handed to the writer with ``outcome`` (``None``: a
        reschedule that did not start the task)."""
        queue, task = job.delivery.queue, job.envelope.task
        if job.started_at:
            self._running[queue].dec()
            key = (queue, task)
            child = self._durations.get(key)
            if child is None:
                child = self._durations[key] = self.duration.labels(queue, self._task(task))
            child.observe(max(0.0, time.time() - job.started_at))
        if outcome is not None and outcome.kind != "requeued":
            self._count(queue, task, outcome.kind)

    def ended(self, queue: str, task: str, outcome: str) -> None:
        """A delivery from physical ``queue`` ended before it ran: ``"expired"`` or
        ``"rejected"`` (``task`` may be ``""`` for a message that could not be read)."""
        self._count(queue, task, outcome)

    # ------------------------------------------------------------- sampled
    async def sample(self) -> None:
        """Read queue depths, dead letters, workers and the namespace's counters once.

        Raises:
            BrokerError: the broker did not answer (the previous values stay).
        """
        broker, ns = self.worker.broker, self.namespace
        stats = await broker.queue_stats(self.worker.physical_queues)
        for queue, counts in stats.items():
            self.depth.labels(queue, "waiting").set(counts.get("waiting", 0))
            self.depth.labels(queue, "in_flight").set(counts.get("in_flight", 0))
        self.depth.labels(ALL_QUEUES, "scheduled").set(await broker.scheduled_count())
        self.dead_letters.labels(ns).set(await broker.dead_letter_count())
        self.workers.labels(ns).set(len(await broker.workers()))
        counters = await broker.counters()
        self.namespace_stale.labels(ns).set(counters.get("stale_completions", 0))

    async def sample_loop(self, interval: float = SAMPLE_INTERVAL) -> None:
        """:meth:`sample` every ``interval`` seconds until cancelled; errors are logged at
        DEBUG (the health endpoint reports an unreachable broker)."""
        while True:
            try:
                await self.sample()
            except Exception as exc:  # the next sample tries again
                logger.debug("metrics sample failed: %s", exc)
            await asyncio.sleep(interval)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, Any]:
    """Serve ``/metrics`` of ``registry`` on ``host:port`` from prometheus-client's HTTP
    server (a daemon thread); return ``(server, thread)``.

    Raises:
        ConfigurationError: the address cannot be bound (in use, no permission).
    """
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, host, registry)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from None


def stop_metrics(server: Any, thread: Any) -> None:
    """Stop a server made by :func:`serve_metrics` and wait for its thread (bounded)."""
    with contextlib.suppress(Exception):
        server.shutdown()
        server.server_close()
    thread.join(5.0)


__all__ = ["MAX_TASK_NAMES", "OUTCOMES", "SAMPLE_INTERVAL", "RunMetrics", "serve_metrics"]
