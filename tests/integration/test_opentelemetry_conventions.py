"""OpenTelemetry by the semantic conventions (issue 27, point 4), spans read from the SDK's
in-memory exporter: the trace and span ids of the task's span on the log records a task
emits (async and thread tasks; none outside a task), ``error.type`` of a timeout, and the
RabbitMQ broker's ``server.*`` attributes (without a stream consumer group)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from blitzq import Queue
from blitzq.integrations.opentelemetry import BlitzqInstrumentor
from blitzq.logcontext import TaskContextFilter
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.broker_kinds import is_amqp

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider (not the global one) exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class Keep(logging.Handler):
    """Keeps the records of the ``tests.otel.logs`` logger, after the task-fields filter."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(TaskContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Keep]:
    handler = Keep()
    log = logging.getLogger("tests.otel.logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def _count(exporter: InMemorySpanExporter, name: str) -> int:
    return len(spans(exporter, name))


async def test_log_records_in_a_task_carry_its_trace_and_span_ids(
    make_queue: Callable[..., Queue],
    traced: tuple[TracerProvider, InMemorySpanExporter],
    kept: Keep,
) -> None:
    provider, exporter = traced
    queue = make_queue(name="otellog")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)
    log = logging.getLogger("tests.otel.logs")

    @queue.task(name="otel.log.async")
    async def in_loop(n: int) -> int:
        log.info("async %s", n)
        return n

    @queue.task(name="otel.log.thread", executor="thread")
    def in_thread(n: int) -> int:
        log.info("thread %s", n)
        return n

    @queue.task(name="otel.log.slow", timeout=0.05, retries=0)
    async def slow() -> None:
        import asyncio

        await asyncio.sleep(30)

    log.info("outside any task")
    async with running(make_worker(queue)):
        first = await in_loop.enqueue(1)
        second = await in_thread.enqueue(2)
        timed = await slow.enqueue()
        assert await first.result(timeout=30) == 1
        assert await second.result(timeout=30) == 2
        await eventually(lambda: _count(exporter, "process otellog"), lambda n: n == 3)
    await queue.close()

    by_id = {
        (s.attributes or {})["messaging.message.id"]: s for s in spans(exporter, "process otellog")
    }
    records = {r.getMessage(): r for r in kept.records}
    for message, handle in (("async 1", first), ("thread 2", second)):
        record, span = records[message], by_id[handle.id]
        assert vars(record)["trace_id"] == f"{span.context.trace_id:032x}"
        assert vars(record)["span_id"] == f"{span.context.span_id:016x}"
        assert vars(record)["task_id"] == handle.id
    assert "trace_id" not in vars(records["outside any task"])
    assert "span_id" not in vars(records["outside any task"])
    # A timeout's span names its type (qualified: not a builtin).
    timeout_span = by_id[timed.id]
    assert timeout_span.status.status_code is StatusCode.ERROR
    assert (timeout_span.attributes or {})["error.type"] == "blitzq.exceptions.TaskTimeout"


async def test_amqp_spans_name_the_rabbitmq_server(
    server_url: str, namespace: str, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    url = amqp_or_skip()
    provider, exporter = traced
    queue = Queue("otelamqp", redis_url=server_url, namespace=namespace, amqp_url=url)
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)

    @queue.task(name="otel.amqp.echo")
    async def echo(n: int) -> int:
        return n

    try:
        async with running(make_worker(queue)):
            handle = await echo.enqueue(3)
            assert await handle.result(timeout=30) == 3
            await eventually(lambda: _count(exporter, "process otelamqp"), lambda n: n == 1)
    finally:
        broker = queue.broker
        await queue.close()
        await delete_amqp_queues(url, [broker] if is_amqp(broker) else [])
    (send,) = spans(exporter, "send otelamqp")
    (process,) = spans(exporter, "process otelamqp")
    for span in (send, process):
        attrs = span.attributes or {}
        assert attrs["server.address"] == urlsplit(url).hostname
        assert attrs["server.port"] == (urlsplit(url).port or 5672)
        assert "messaging.consumer.group.name" not in attrs  # no stream group on RabbitMQ
