"""Producer-side Prometheus metrics: what a process enqueued (needs ``prometheus-client``,
the ``metrics`` extra).

::

    from prometheus_client import CollectorRegistry, REGISTRY

    from blitzq.metrics import producer_collector

    REGISTRY.register(producer_collector(queue))   # or your application's own registry

:func:`producer_collector` adds a :class:`ProducerMetrics` middleware to the Queue (its
after-enqueue and after-apply hooks count, so nothing in the publish path knows about
metrics) and returns the collector to register on the registry the application already
serves (a web app's ``/metrics``, ``prometheus_client.start_http_server``...). It yields one
counter, ``blitzq_enqueued_total{queue, task}``: messages this process published, by physical
queue and task name, counted after the broker took them: each message of ``enqueue``,
``enqueue_many`` and ``send`` and each first step of a workflow start (``apply``). A refused
enqueue, a publish that raised and a ``unique`` duplicate (not published) are not counted;
neither are the messages workers publish (retries, a chain's next steps), which are not
enqueues of this process. Task names are capped at :data:`MAX_TASK_NAMES` distinct values,
later ones counted as ``_other``. The worker's own endpoint (``--metrics-port``) does not
include it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .exceptions import ConfigurationError
from .extensions.middleware import Middleware, Outgoing, OutgoingWorkflow
from .queue import Queue

try:
    from prometheus_client.core import CounterMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "metrics need prometheus-client: pip install prometheus-client (or install blitzq "
        "from its checkout with the extra: pip install -e '.[metrics]')"
    ) from exc

#: Most distinct task names used as label values; later names count as ``_other``.
MAX_TASK_NAMES = 100
#: The label value of task names past :data:`MAX_TASK_NAMES`.
OTHER_TASK = "_other"


class ProducerMetrics(Middleware, Collector):
    """Counts the messages a Queue published, and is the Prometheus collector of the count.

    A middleware (after-enqueue and after-apply hooks: a dict update per message) and a
    ``prometheus_client`` collector (``collect`` copies the counts when Prometheus scrapes).
    Made and added by :func:`producer_collector`; one per Queue.

    Attributes:
        counts: messages published by ``(physical queue, task label)``.
    """

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._names: set[str] = set()

    def _count(self, queue: str, task: str) -> None:
        if task not in self._names:
            if task and len(self._names) < MAX_TASK_NAMES:
                self._names.add(task)
            else:
                task = OTHER_TASK
        key = (queue, task)
        self.counts[key] = self.counts.get(key, 0) + 1

    async def after_enqueue(self, message: Outgoing) -> None:
        """Count ``message`` (published)."""
        env = message.envelope
        self._count(env.queue, env.task)

    async def after_apply(self, workflow: OutgoingWorkflow) -> None:
        """Count each first step of ``workflow`` (published)."""
        for env in workflow.steps:
            self._count(env.queue, env.task)

    def collect(self) -> Iterator[Any]:
        """The ``blitzq_enqueued_total`` family of one scrape."""
        family = CounterMetricFamily(
            "blitzq_enqueued",
            "Messages this process published, by physical queue and task.",
            labels=("queue", "task"),
        )
        for labels, count in list(self.counts.items()):
            family.add_metric(labels, count)
        yield family


def producer_collector(queue: Queue) -> ProducerMetrics:
    """Count what ``queue`` publishes from now on; return the collector to register.

    Calling it again for the same Queue returns the collector it added the first time (one
    count per Queue). Register the result once per registry
    (``registry.register(producer_collector(queue))``); two Queues' collectors cannot share
    a registry (same metric name): use one Queue per producer process, or one registry each.

    Args:
        queue: the :class:`~blitzq.Queue` the application enqueues with.

    Raises:
        ConfigurationError: ``queue`` is not a :class:`~blitzq.Queue`.
    """
    if not isinstance(queue, Queue):
        raise ConfigurationError(f"producer_collector takes a blitzq.Queue, not {queue!r}")
    for middleware in queue.middleware:
        if isinstance(middleware, ProducerMetrics):
            return middleware
    collector = ProducerMetrics()
    queue.add_middleware(collector)
    return collector


__all__ = ["MAX_TASK_NAMES", "OTHER_TASK", "ProducerMetrics", "producer_collector"]
