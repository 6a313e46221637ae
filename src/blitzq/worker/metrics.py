"""Prometheus metrics of one worker (``Worker(metrics_port=...)``, ``blitzq worker
--metrics-port``); needs the ``metrics`` extra (``prometheus-client``).

Per-run metrics are fed by the runner through :class:`RunMetrics`, the worker's run
observer: :meth:`RunMetrics.started` when a run starts (queue latency),
:meth:`RunMetrics.committed` when its completion is handed to the writer, with the kind of the
run's :class:`~blitzq.extensions.middleware.Outcome` (the value the after-hooks get;
:func:`blitzq.worker.outcomes.outcome_kind`), and :meth:`RunMetrics.ended` for a delivery that
ends before it runs (``expired`` by its ``max_age`` start check, ``rejected``: malformed, too
large or of an unknown task). A worker without metrics has no observer: the runner checks one
attribute for ``None`` per run. The figures are plain counts and per-bucket lists, made into
Prometheus metric families only when Prometheus scrapes; runs in progress are counted from
the runner's running jobs then.

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
import math
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError

try:
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "metrics need prometheus-client: pip install 'blitzq[metrics]'"
    ) from exc

if TYPE_CHECKING:
    from ..extensions.middleware import OutcomeKind
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


#: Index of a histogram's sum in its list (after one count per bucket and +Inf).
_SUM = len(BUCKETS) + 1


class _RunCollector(Collector):
    """Hands the plain counts :class:`RunMetrics` keeps per run to prometheus-client when it
    scrapes (in its server's thread), with this worker's own counters (plain ints of the
    running worker).

    The event loop is the one writer; a scrape copies each dict and list first (one C call
    each, under the GIL), so it reads values from a few microseconds apart at worst.
    """

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        m, worker = self.metrics, self.metrics.worker
        tasks = CounterMetricFamily(
            "blitzq_tasks",
            "Task attempts by final outcome (each attempt counted once).",
            labels=("queue", "task", "outcome"),
        )
        for labels, count in list(m.counts.items()):
            tasks.add_metric(labels, count)
        yield tasks
        yield _histogram(
            "blitzq_task_duration_seconds",
            "Seconds from the start of a run to its completion.",
            ("queue", "task"),
            m.durations,
        )
        yield _histogram(
            "blitzq_task_queue_latency_seconds",
            "Seconds from the (latest) enqueue of a message to the start of its run.",
            ("queue",),
            {(queue,): h for queue, h in list(m.latencies.items())},
        )
        running = GaugeMetricFamily(
            "blitzq_tasks_in_progress", "Runs started and not ended.", labels=("queue",)
        )
        for queue, count in m.in_progress().items():
            running.add_metric((queue,), count)
        yield running
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


def _histogram(
    name: str, doc: str, labels: tuple[str, ...], data: dict[Any, list[float]]
) -> HistogramMetricFamily:
    """A histogram family from per-label lists of bucket counts (the last is +Inf) and sum."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, values in list(data.items()):
        values = list(values)
        cumulative, buckets = 0.0, []
        for bound, count in zip((*BUCKETS, math.inf), values, strict=False):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        family.add_metric(key, buckets, values[_SUM])
    return family


class RunMetrics:
    """The metrics of one worker, and the run observer the runner calls.

    The per-run figures are plain dicts of ints and lists (one ``bisect`` per histogram
    sample), turned into Prometheus metrics only when Prometheus scrapes: a run costs about a
    microsecond, where prometheus-client's own locked metric objects cost several.

    Args:
        worker: the worker measured (its queues, namespace, broker and counters are read).

    Attributes:
        registry: the ``prometheus_client.CollectorRegistry`` holding every metric.
        counts: attempts by ``(queue, task, outcome)``.
        durations: run durations by ``(queue, task)``: counts per bucket, then the sum.
        latencies: queue latencies by queue, as ``durations``.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.namespace = worker.queue.namespace
        registry = self.registry = CollectorRegistry()
        self.counts: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, str], list[float]] = {}
        self.latencies: dict[str, list[float]] = {}
        self._labels: dict[str, str] = {}  # task name -> its label value (capped)
        registry.register(_RunCollector(self))
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

    # ------------------------------------------------------------- per run
    def _task(self, name: str) -> str:
        label = self._labels.get(name)
        if label is None:
            if len(self._labels) >= MAX_TASK_NAMES or not name:
                return OTHER_TASK
            label = self._labels[name] = name
        return label

    def in_progress(self) -> dict[str, int]:
        """Runs of this worker started and not ended, by queue (read at scrape time from
        the runner's running jobs, so a run pays nothing for it)."""
        running: dict[str, int] = dict.fromkeys(self.latencies, 0)
        try:
            jobs = list(self.worker.runner.jobs)  # one C call: no concurrent change seen
        except RuntimeError:  # the worker is not running
            jobs = []
        for job in jobs:
            queue = job.delivery.queue
            running[queue] = running.get(queue, 0) + 1
        return running

    def started(self, job: Job) -> None:
        """A run of ``job`` started (``job.started_at`` set): its queue latency."""
        enqueued = job.envelope.enqueued_at
        if enqueued:
            latency = job.started_at - enqueued
            h = self.latencies.get(job.delivery.queue)
            if h is None:
                h = self.latencies[job.delivery.queue] = [0] * (_SUM + 1)
            h[bisect_left(BUCKETS, latency)] += 1
            h[_SUM] += latency if latency > 0.0 else 0.0

    def committed(self, job: Job, kind: OutcomeKind | None) -> None:
        """``job``'s completion was handed to the writer; ``kind`` is its outcome's kind
        (:func:`~blitzq.worker.outcomes.outcome_kind`; ``None``: a reschedule that did not
        start the task)."""
        queue = job.delivery.queue
        task = self._task(job.envelope.task)
        if job.started_at:
            duration = time.time() - job.started_at
            key = (queue, task)
            h = self.durations.get(key)
            if h is None:
                h = self.durations[key] = [0] * (_SUM + 1)
            h[bisect_left(BUCKETS, duration)] += 1
            h[_SUM] += duration if duration > 0.0 else 0.0
        if kind is not None and kind != "requeued":
            counts, counted = self.counts, (queue, task, kind)
            counts[counted] = counts.get(counted, 0) + 1

    def ended(self, queue: str, task: str, outcome: str) -> None:
        """A delivery from physical ``queue`` ended before it ran: ``"expired"`` or
        ``"rejected"`` (``task`` may be ``""`` for a message that could not be read)."""
        key = (queue, self._task(task), outcome)
        self.counts[key] = self.counts.get(key, 0) + 1

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
