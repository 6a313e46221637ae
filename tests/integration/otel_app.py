"""The app of the cross-process tracing test: a traced Queue whose spans stay in memory.

``python -m blitzq worker tests.integration.otel_app:queue`` with ``BLITZQ_TEST_SPANS`` (a
file path), ``BLITZQ_REDIS_URL`` and ``BLITZQ_NAMESPACE`` set. The worker's spans go to the
SDK's ``InMemorySpanExporter``; when the worker has stopped (``WORKER_STOPPED``: its runs'
after-hooks, which end the consumer spans, have finished), every finished span is written to
the file as one JSON list of :func:`tests.integration.otel_spans.record` records (written to a
temporary file first, then renamed: the file is complete once it exists).
"""

from __future__ import annotations

import json
import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from blitzq import Queue, RetryPolicy, Signal, SignalEvent
from blitzq.integrations.opentelemetry import BlitzqInstrumentor

from .otel_spans import record

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
queue = Queue(name="otel")
BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)
_tries: dict[int, int] = {}


@queue.task(name="otel.add")
async def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@queue.task(name="otel.total")
async def total(values: list[int]) -> int:
    """Return the sum of ``values`` (a chord callback)."""
    return sum(values)


@queue.task(name="otel.flaky", retries=1, retry_policy=RetryPolicy(base=0.01, jitter="none"))
async def flaky(x: int) -> int:
    """Fail the first attempt for ``x``, return ``x`` on the next."""
    _tries[x] = _tries.get(x, 0) + 1
    if _tries[x] == 1:
        raise ValueError("first attempt fails")
    return x


@queue.on(Signal.WORKER_STOPPED)
def dump_spans(event: SignalEvent) -> None:
    """Write the worker's finished spans to ``BLITZQ_TEST_SPANS``."""
    path = os.environ["BLITZQ_TEST_SPANS"]
    with open(f"{path}.tmp", "w", encoding="utf-8") as out:
        json.dump([record(span) for span in exporter.get_finished_spans()], out)
    os.replace(f"{path}.tmp", path)
