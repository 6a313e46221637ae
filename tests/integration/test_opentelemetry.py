"""OpenTelemetry tracing (issue 11, "Tracing"): spans read back from the SDK's in-memory
exporter (in-process worker) and from a file a worker process writes.

A producer span per enqueue, a consumer span per attempt whose parent is the producer's
context, a retry's span linked to the previous attempt's, a workflow step's span linked to the
step before it, the exception of a failed attempt recorded with status ERROR; and across a
worker process, the consumer span in the producer's trace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from blitzq import ConfigurationError, Queue, RetryPolicy
from blitzq.integrations.opentelemetry import BlitzqInstrumentor

from ..polling import wait_until
from .proc_tasks import eventually, make_worker, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider (not the global one) exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """Finished spans called ``name``, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_producer_consumer_retry_and_error(
    make_queue: Callable[..., Queue], traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    queue = make_queue(name="otelq")
    instrumentor = BlitzqInstrumentor()
    instrumentor.instrument(queue=queue, tracer_provider=provider)
    instrumentor.instrument(queue=queue, tracer_provider=provider)  # idempotent
    assert len(queue.middleware) == 1
    attempts: list[int] = []

    @queue.task(name="otel.flaky", retries=1, retry_policy=RetryPolicy(base=0.01, jitter="none"))
    async def flaky(x: int) -> int:
        attempts.append(x)
        inner = trace.get_current_span()  # the consumer span is current in the body
        assert inner.get_span_context().is_valid
        if len(attempts) == 1:
            raise ValueError("first attempt fails")
        return x

    tracer = provider.get_tracer("test")
    async with running(make_worker(queue)):
        with tracer.start_as_current_span("client") as client:
            handle = await flaky.enqueue(7)
        assert await handle.result(timeout=30) == 7
        await eventually(
            lambda: _value(len(by_name(exporter, "otel.flaky process"))), lambda n: n == 2
        )
    await queue.close()

    (publish,) = by_name(exporter, "otelq publish")
    assert publish.kind is SpanKind.PRODUCER
    assert publish.parent is not None
    assert publish.parent.span_id == client.get_span_context().span_id
    attrs = publish.attributes or {}
    assert attrs["messaging.system"] == "blitzq"
    assert attrs["messaging.destination.name"] == "otelq"
    assert attrs["messaging.message.id"] == handle.id
    assert attrs["messaging.operation"] == attrs["messaging.operation.type"] == "send"

    first, second = by_name(exporter, "otel.flaky process")
    for span, attempt in ((first, 1), (second, 2)):
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None
        # Both attempts are children of the producer span, in the client's trace.
        assert span.parent.span_id == publish.context.span_id
        assert span.context.trace_id == client.get_span_context().trace_id
        assert (span.attributes or {})["blitzq.task.attempt"] == attempt
        assert (span.attributes or {})["messaging.operation"] == "process"
        assert (span.attributes or {})["messaging.message.id"] == handle.id
    assert (first.attributes or {})["blitzq.task.outcome"] == "retried"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (first.events[0].attributes or {})["exception.type"] == "ValueError"
    assert (second.attributes or {})["blitzq.task.outcome"] == "succeeded"
    assert second.status.status_code is not StatusCode.ERROR
    # The retry's span links to the previous attempt's.
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert not first.links


async def test_workflow_step_links_to_the_step_before(
    make_queue: Callable[..., Queue], traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    queue = make_queue(name="otelwf")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)

    @queue.task(name="otel.inc")
    async def inc(x: int) -> int:
        return x + 1

    @queue.task(name="otel.double")
    async def double(x: int) -> int:
        return x * 2

    @queue.task(name="otel.parent")
    async def parent() -> str:
        child = await double.enqueue(21)  # from inside a task: a child of this run's span
        return child.id

    async with running(make_worker(queue)):
        flow = await queue.apply(inc.s(1) | double.s())
        assert await flow.get(timeout=30) == 4
        child_id = await (await parent.enqueue()).result(timeout=30)
        await eventually(
            lambda: _value(len(by_name(exporter, "otel.double process"))), lambda n: n == 2
        )
    await queue.close()
    (step1,) = by_name(exporter, "otel.inc process")
    step2, child = sorted(
        by_name(exporter, "otel.double process"),
        key=lambda span: (span.attributes or {})["messaging.message.id"] == child_id,
    )
    (parent_run,) = by_name(exporter, "otel.parent process")
    (child_publish,) = [
        span
        for span in by_name(exporter, "otelwf publish")
        if (span.attributes or {})["messaging.message.id"] == child_id
    ]
    assert child_publish.parent is not None
    assert child_publish.parent.span_id == parent_run.context.span_id
    assert child.parent is not None
    assert child.parent.span_id == child_publish.context.span_id
    assert not child.links  # a fresh enqueue links to nothing
    assert [link.context.span_id for link in step2.links] == [step1.context.span_id]
    assert step2.parent is not None
    assert step2.parent.span_id == step1.context.span_id


async def test_instrument_all_queues_and_uninstrument(
    server_url: str, namespace: str, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    instrumentor = BlitzqInstrumentor()
    with pytest.raises(ConfigurationError):
        instrumentor.instrument(queue="not a queue")  # type: ignore[arg-type]
    instrumentor.instrument(tracer_provider=provider)
    try:
        queue = Queue(redis_url=server_url, namespace=namespace, name="otelall")
        assert instrumentor.is_instrumented
        assert len(queue.middleware) == 1
    finally:
        BlitzqInstrumentor().uninstrument()  # the same instrumentor: a singleton
    assert BlitzqInstrumentor() is instrumentor
    assert not instrumentor.is_instrumented
    assert Queue(redis_url=server_url, namespace=namespace).middleware == ()

    @queue.task(name="otel.noop")
    async def noop() -> None:
        return None

    await noop.enqueue()  # the middleware stays registered but traces nothing
    await queue.close()
    assert exporter.get_finished_spans() == ()


def test_consumer_span_in_a_worker_process_joins_the_producer_trace(
    server_url: str,
    namespace: str,
    tmp_path: Path,
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    spans_file = tmp_path / "spans.jsonl"
    queue = Queue(redis_url=server_url, namespace=namespace, name="otel")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)

    @queue.task(name="otel.add")
    async def add(a: int, b: int) -> int:
        return a + b

    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        BLITZQ_TEST_SPANS=str(spans_file),
        BLITZQ_REDIS_URL=server_url,
        BLITZQ_NAMESPACE=namespace,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "blitzq", "worker", "tests.integration.otel_app:queue"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        handle = add.enqueue_sync(2, 3)
        assert handle.result_sync(timeout=60) == 5

        def consumer_span() -> dict[str, Any] | None:
            if not spans_file.exists():
                return None
            for line in spans_file.read_text().splitlines():
                span = json.loads(line)
                if span["name"] == "otel.add process":
                    return dict(span)
            return None

        consumed = wait_until(consumer_span, 30, "the worker process's consumer span")
    finally:
        worker.terminate()
        _, stderr = worker.communicate(timeout=30)
    queue.close_sync()
    (publish,) = by_name(exporter, "otel publish")
    assert consumed["kind"] == "CONSUMER", stderr
    assert consumed["parent_trace_id"] == publish.context.trace_id
    assert consumed["trace_id"] == publish.context.trace_id
    assert consumed["parent_span_id"] == publish.context.span_id
    assert consumed["attributes"]["messaging.message.id"] == handle.id
    assert consumed["attributes"]["blitzq.task.outcome"] == "succeeded"


async def _value(value: Any) -> Any:
    """``value``, awaitable (for :func:`eventually`)."""
    return value


def test_with_only_the_api_installed_tasks_run_untraced_without_errors(
    server_url: str, namespace: str
) -> None:
    """``opentelemetry.sdk`` unimportable and no provider configured (only the API, as the
    ``otel`` extra installs): an instrumented Queue's enqueues and runs (success, retry,
    failure, an enqueue from a task) go through the API's no-op tracer, results as without
    tracing, no error logged (``tests/integration/otel_api_only.py``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        BLITZQ_REDIS_URL=server_url,
        BLITZQ_NAMESPACE=namespace,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.otel_api_only"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "API-ONLY OK" in done.stdout
    assert "Traceback" not in done.stderr
