"""Prometheus metrics of one worker (``Worker(metrics_port=...)``, ``blitzq worker
--metrics-port``); needs the ``metrics`` extra (``prometheus-client``).

Per-run metrics are counted by :class:`RunMetrics`, the worker's run observer, through the
methods of its base :class:`~blitzq.worker.tally.RunTally` (:mod:`blitzq.worker.tally`: the
runner calls it when a run starts, when its completion is committed, and for a delivery that
ends before it runs, each time doing only plain-Python arithmetic on preallocated counters).
A worker without metrics has no observer: the runner checks one attribute for ``None`` at a
run's start and at its commit. The counts are made into Prometheus metric families only when
Prometheus scrapes; runs in progress are counted from the runner's running jobs then.

Broker-wide values (queue depths, the age of each queue's oldest waiting message, dead
letters, registered workers, the namespace's stale completions and runs) are sampled once
before the endpoint is served (:meth:`RunMetrics.first_sample`, so the first scrape never
shows empty gauges), then every :data:`SAMPLE_INTERVAL` seconds by
:meth:`RunMetrics.sample_loop` in the worker's event loop, never per task; this worker's own
counters (stale completions, abandoned threads) are read when Prometheus scrapes.

Every metric lives in a registry of its own per worker (not prometheus-client's global one),
so two workers in one process do not clash. Label values are bounded: queues are the
worker's own, outcomes a fixed set, task names capped at :data:`MAX_TASK_NAMES` distinct
values (the rest are reported as ``_other``); never a task id.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import ConfigurationError
from ..logcontext import dropped_records

try:
    from prometheus_client import CollectorRegistry, Gauge, ProcessCollector
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "metrics need prometheus-client: pip install prometheus-client (or install blitzq "
        "from its checkout with the extra: pip install -e '.[metrics]')"
    ) from exc

from .ports import PortInUse
from .tally import BUCKETS, MAX_TASK_NAMES, OUTCOMES, RunTally

if TYPE_CHECKING:
    from collections.abc import Collection

    from ..broker import Broker
    from ..seams import QueueSettings
    from .execution import Job

logger = logging.getLogger("blitzq.worker")


class _Running(Protocol):
    @property
    def jobs(self) -> Collection[Job]: ...


class Measured(Protocol):
    """What the metrics see of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def id(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def queue(self) -> QueueSettings: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def physical_queues(self) -> list[str]: ...

    @property
    def runner(self) -> _Running: ...

    @property
    def stale_completions(self) -> int: ...

    @property
    def abandoned_threads(self) -> int: ...

    @property
    def abandoned_threads_total(self) -> int: ...


#: Seconds between two samples of the broker-wide gauges.
SAMPLE_INTERVAL = 5.0
#: Seconds the sample taken before the endpoint is served may take (then it is served anyway).
FIRST_SAMPLE_TIMEOUT = 5.0
#: The ``queue`` label of the schedule, which is one set for the whole namespace.
ALL_QUEUES = "*"


class _RunCollector(Collector):
    """Hands the plain counts :class:`RunMetrics` keeps per run to prometheus-client when it
    scrapes (in its server's thread), with this worker's own counters (plain ints of the
    running worker).

    The event loop is the one writer; a scrape reads a copy
    (:meth:`~blitzq.worker.tally.RunTally.snapshot`).
    """

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        m, worker = self.metrics, self.metrics.worker
        counts, durations, latencies = m.snapshot()
        tasks = CounterMetricFamily(
            "blitzq_tasks",
            "Task attempts by final outcome (each attempt counted once).",
            labels=("queue", "task", "outcome"),
        )
        for labels, count in counts.items():
            tasks.add_metric(labels, count)
        yield tasks
        yield _histogram(
            "blitzq_task_duration_seconds",
            "Seconds from the start of a run to its completion.",
            ("queue", "task"),
            durations,
        )
        yield _histogram(
            "blitzq_task_queue_latency_seconds",
            "Seconds from the (latest) enqueue of a message to the start of its run.",
            ("queue",),
            {(queue,): h for queue, h in latencies.items()},
        )
        running = GaugeMetricFamily(
            "blitzq_tasks_in_progress", "Runs started and not ended.", labels=("queue",)
        )
        for queue, count in m.in_progress().items():
            running.add_metric((queue,), count)
        yield running
        failures = CounterMetricFamily(
            "blitzq_task_failures",
            "Attempts that raised and failed, were retried or dead-lettered, by exception type.",
            labels=("queue", "task", "exception"),
        )
        for labels, count in list(m.exception_counts.items()):
            failures.add_metric(labels, count)
        yield failures
        if m.namespace_stale is not None:
            stale = CounterMetricFamily(
                "blitzq_namespace_stale_completions",
                "Completions refused as stale by fencing in the namespace, all workers (sampled).",
                labels=("namespace",),
            )
            stale.add_metric((m.namespace,), m.namespace_stale)
            yield stale
        if m.namespace_runs is not None:
            runs = CounterMetricFamily(
                "blitzq_namespace_runs",
                "Runs of every worker of the namespace that succeeded or failed, as their "
                "registrations reported them (sampled; recycled processes included).",
                labels=("namespace", "outcome"),
            )
            for outcome, total in zip(("succeeded", "failed"), m.namespace_runs, strict=True):
                runs.add_metric((m.namespace, outcome), total)
            yield runs
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
        yield CounterMetricFamily(
            "blitzq_log_records_dropped",
            "Log records this process's non-blocking log queue dropped (full, or not written "
            "within the drain timeout at exit).",
            value=dropped_records(),
        )
        yield GaugeMetricFamily(
            "blitzq_abandoned_threads_running",
            "Sync-task threads abandoned at their hard timeout and still running.",
            value=worker.abandoned_threads,
        )


def _histogram(
    name: str, doc: str, labels: tuple[str, ...], data: dict[Any, tuple[list[int], float]]
) -> HistogramMetricFamily:
    """A histogram family from per-label bucket counts (not cumulative; the last is +Inf)
    and sums."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, (counts, total) in data.items():
        cumulative, buckets = 0.0, []
        for bound, count in zip((*BUCKETS, math.inf), counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        family.add_metric(key, buckets, total)
    return family


class RunMetrics(RunTally):
    """The metrics of one worker, and the run observer the runner calls.

    The per-run figures are the plain counts of its base :class:`~blitzq.worker.tally.RunTally`
    (its ``started``, ``committed`` and ``ended`` are what the runner calls), turned into
    Prometheus metrics only when Prometheus scrapes (bench/README.md, "Metrics cost").

    Args:
        worker: the worker measured (its queues, namespace, broker and counters are read).

    Attributes:
        registry: the ``prometheus_client.CollectorRegistry`` holding every metric.
    """

    def __init__(self, worker: Measured) -> None:
        super().__init__()
        self.worker = worker
        self.namespace = worker.queue.namespace
        registry = self.registry = CollectorRegistry()
        registry.register(_RunCollector(self))
        self.depth = Gauge(
            "blitzq_queue_depth",
            "Tasks per queue and state (sampled from the broker's queue stats; on RabbitMQ "
            "waiting counts a ready message of a bulk enqueue, a pack of up to 32 tasks, once).",
            ("queue", "state"),
            registry=registry,
        )
        self.dead_letters = Gauge(
            "blitzq_dead_letters", "Dead letters stored.", ("namespace",), registry=registry
        )
        self.workers = Gauge(
            "blitzq_workers", "Registered live workers.", ("namespace",), registry=registry
        )
        self.oldest_age = Gauge(
            "blitzq_queue_oldest_age_seconds",
            "Seconds the oldest waiting message of each queue has waited (0: none waiting; "
            "sampled, on the broker's clock).",
            ("queue",),
            registry=registry,
        )
        #: The namespace's stale completions as last sampled (``None`` before the first
        #: sample): the counter ``blitzq_namespace_stale_completions_total``.
        self.namespace_stale: float | None = None
        #: The namespace's (succeeded, failed) runs as last sampled (``None`` before the
        #: first sample): the counter ``blitzq_namespace_runs_total``.
        self.namespace_runs: tuple[float, float] | None = None
        # process_* (CPU, memory, open files, start time) of this process; on platforms
        # without /proc it reports nothing.
        ProcessCollector(registry=registry)

    # ------------------------------------------------------------- scrape
    def in_progress(self) -> dict[str, int]:
        """Runs of this worker started and not ended, by queue, every physical queue it
        consumes included from the start (read at scrape time from the runner's running
        jobs, so a run pays nothing for it)."""
        running: dict[str, int] = dict.fromkeys(self.worker.physical_queues, 0)
        try:
            jobs = list(self.worker.runner.jobs)  # one C call: no concurrent change seen
        except RuntimeError:  # the worker is not running
            jobs = []
        for job in jobs:
            queue = job.delivery.queue
            running[queue] = running.get(queue, 0) + 1
        return running

    # ------------------------------------------------------------- sampled
    async def sample(self) -> None:
        """Read queue depths, the oldest waiting message's age per queue, dead letters,
        workers and the namespace's counters once.

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
        # This worker is live even before its first registration is written (at start).
        registered = await broker.workers()
        self.workers.labels(ns).set(len(registered) + (self.worker.key not in registered))
        counters = await broker.counters()
        self.namespace_stale = float(counters.get("stale_completions", 0))
        self.namespace_runs = float(counters.get("processed", 0)), float(counters.get("failed", 0))
        # The oldest message's age only where something waits (one more read per queue).
        waiting = [q for q, counts in stats.items() if counts.get("waiting", 0)]
        oldest = await broker.oldest_waiting(waiting) if waiting else {}
        now = await broker.server_time() if oldest else 0.0
        for queue in stats:
            enqueued = oldest.get(queue)
            if enqueued is not None:
                self.oldest_age.labels(queue).set(max(0.0, now - enqueued))
            elif queue not in waiting:
                self.oldest_age.labels(queue).set(0.0)
            else:  # the transport cannot tell (fast mode, RabbitMQ): no sample
                with contextlib.suppress(KeyError):
                    self.oldest_age.remove(queue)

    async def first_sample(self, timeout: float = FIRST_SAMPLE_TIMEOUT) -> None:
        """:meth:`sample` once, bounded by ``timeout`` seconds, before the endpoint is
        served: the first scrape then shows the queues' depths, not empty gauges. A failure
        is logged at DEBUG and leaves the gauges to :meth:`sample_loop`."""
        try:
            await asyncio.wait_for(self.sample(), timeout)
        except Exception as exc:  # the loop samples again
            logger.debug("first metrics sample failed: %s", exc)

    async def sample_loop(self, interval: float = SAMPLE_INTERVAL) -> None:
        """:meth:`sample` every ``interval`` seconds, the first one ``interval`` seconds
        after :meth:`first_sample`, until cancelled; errors are logged at DEBUG (the health
        endpoint reports an unreachable broker)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sample()
            except Exception as exc:  # the next sample tries again
                logger.debug("metrics sample failed: %s", exc)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, Any]:
    """Serve ``/metrics`` of ``registry`` on ``host:port`` from prometheus-client's HTTP
    server (a daemon thread); return ``(server, thread)``.

    Raises:
        ConfigurationError: the address cannot be bound (no permission; a
            :class:`~blitzq.worker.ports.PortInUse` when another socket holds it).
    """
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, host, registry)
    except OSError as exc:
        kind = PortInUse if exc.errno == errno.EADDRINUSE else ConfigurationError
        raise kind(f"cannot serve metrics on {host}:{port}: {exc}") from None


def stop_metrics(server: Any, thread: Any) -> None:
    """Stop a server made by :func:`serve_metrics` and wait for its thread (bounded)."""
    with contextlib.suppress(Exception):
        server.shutdown()
        server.server_close()
    thread.join(5.0)


__all__ = ["MAX_TASK_NAMES", "OUTCOMES", "SAMPLE_INTERVAL", "RunMetrics", "serve_metrics"]
