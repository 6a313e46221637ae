"""Sentry reporting of final failures (issue 27, item 3): a real worker on a real Redis,
with sentry-sdk's own client and a transport that keeps the envelopes in memory (no network).

A task that fails for good is one event (its exception type and traceback, the task's tags,
the trace context of its OpenTelemetry span or of its message's ``traceparent``); an attempt
that is retried and a task that succeeds after a retry are none; the worker's ERROR record of
the failure does not become a second event through Sentry's logging integration, while
without the middleware that record reaches Sentry by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

sentry_sdk = pytest.importorskip(
    "sentry_sdk", reason="sentry-sdk is not installed (the dev lock adds it; extra 'sentry')"
)

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from sentry_sdk.envelope import Envelope  # noqa: E402
from sentry_sdk.integrations import logging as sentry_logging  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402

from blitzq import Queue, RetryPolicy, TaskFailed  # noqa: E402
from blitzq.integrations.opentelemetry import BlitzqInstrumentor  # noqa: E402
from blitzq.integrations.sentry import SentryMiddleware, trace_context  # noqa: E402
from blitzq.worker.ending import OUTCOME_LOGGER  # noqa: E402

from .proc_tasks import make_worker, running  # noqa: E402

pytestmark = pytest.mark.timeout(60)

FAST_RETRY = RetryPolicy(base=0.05, jitter="none")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class MemoryTransport(Transport):
    """A Sentry transport that keeps the events of the envelopes it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.events.append(dict(event))

    def flush(self, timeout: float, callback: Any = None) -> None:
        return None

    def kill(self) -> None:
        return None


@pytest.fixture
def sentry() -> Iterator[MemoryTransport]:
    """An active Sentry client sending to memory, with its logging integration (events from
    ERROR records) and nothing else; closed and unset after the test."""
    transport = MemoryTransport()
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=transport,
        default_integrations=False,
        auto_enabling_integrations=False,
        integrations=[sentry_logging.LoggingIntegration()],
    )
    try:
        yield transport
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


@pytest.fixture
def logging_reports_outcomes() -> Iterator[None]:
    """Undo the middleware's process-wide ``ignore_logger`` after the test (so that a later
    test sees Sentry's logging integration as an application without the middleware does)."""
    try:
        yield
    finally:
        sentry_logging._IGNORED_LOGGERS.discard(OUTCOME_LOGGER)


def tags(event: dict[str, Any]) -> dict[str, str]:
    """The tags of ``event`` as a dict (the SDK sends a dict)."""
    return dict(event.get("tags") or {})


def exception_of(event: dict[str, Any]) -> dict[str, Any]:
    """The last (outermost) exception of ``event``."""
    values = event["exception"]["values"]
    assert values
    return dict(values[-1])


async def settle(handle: Any) -> None:
    """Wait for the task of ``handle`` to fail."""
    with pytest.raises(TaskFailed):
        await handle.result(timeout=30)


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_final_failure_is_one_event_and_a_retry_none(
    make_queue: Callable[..., Queue],
    sentry: MemoryTransport,
    logging_reports_outcomes: None,
    mode: str,
) -> None:
    queue = make_queue(name="sentq", mode=mode)
    queue.add_middleware(SentryMiddleware())
    tries: list[int] = []

    @queue.task(name="sent.broken", retries=1, retry_policy=FAST_RETRY, dead_letter=False)
    async def broken(n: int) -> None:
        raise ValueError(f"broken {n}")

    @queue.task(name="sent.flaky", retries=2, retry_policy=FAST_RETRY)
    async def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise KeyError("only once")
        return "ok"

    async with running(make_worker(queue, name="w-sentry")):
        good = await flaky.enqueue()
        assert await good.result(timeout=30) == "ok"
        bad = await broken.enqueue(4)
        await settle(bad)
    await queue.close()  # the worker's stop waited for the after-hooks

    (event,) = sentry.events  # one: not the retries, not the ERROR record besides it
    error = exception_of(event)
    assert (error["type"], error["value"]) == ("ValueError", "broken 4")
    assert error["mechanism"] == {"type": "blitzq", "handled": False}
    frames = [f["function"] for f in error["stacktrace"]["frames"]]
    assert "broken" in frames
    assert event["level"] == "error"
    assert event["transaction"] == "sent.broken"
    assert tags(event) == {
        "blitzq.task": "sent.broken",
        "blitzq.queue": "sentq",
        "blitzq.task_id": bad.id,
        "blitzq.attempt": "2",
        "blitzq.outcome": "failed",
    }
    details = event["contexts"]["blitzq"]
    assert (details["task_id"], details["attempt"], details["max_attempts"]) == (bad.id, 2, 2)
    assert details["worker_id"] == "w-sentry"
    assert not any(tags(e).get("blitzq.task_id") == good.id for e in sentry.events)


async def test_timed_out_dead_lettered_and_unstorable_for_good(
    make_queue: Callable[..., Queue], sentry: MemoryTransport, logging_reports_outcomes: None
) -> None:
    queue = make_queue(name="sentto")
    queue.add_middleware(SentryMiddleware())

    @queue.task(name="sent.slow", retries=0, timeout=0.2, dead_letter=True)
    async def slow() -> None:
        await asyncio.Event().wait()

    @queue.task(name="sent.unstorable", retries=0, dead_letter=False)
    async def unstorable() -> object:
        return object()

    async with running(make_worker(queue)):
        handle = await slow.enqueue()
        await settle(handle)
        other = await unstorable.enqueue()
        await settle(other)
    await queue.close()
    by_task = {tags(e)["blitzq.task"]: e for e in sentry.events}
    assert len(sentry.events) == len(by_task) == 2
    timed_out = by_task["sent.slow"]
    assert exception_of(timed_out)["type"] == "TaskTimeout"
    assert tags(timed_out)["blitzq.outcome"] == "dead_lettered"
    assert tags(timed_out)["blitzq.task_id"] == handle.id
    failed = by_task["sent.unstorable"]
    assert exception_of(failed)["type"] == "SerializationError"  # the encoder's own error
    assert tags(failed)["blitzq.outcome"] == "failed"


async def test_the_trace_context_is_the_runs_opentelemetry_span(
    make_queue: Callable[..., Queue], sentry: MemoryTransport, logging_reports_outcomes: None
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = make_queue(name="senttr")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)
    queue.add_middleware(SentryMiddleware())

    @queue.task(name="sent.traced", retries=0)
    async def traced() -> None:
        raise RuntimeError("traced failure")

    try:
        async with running(make_worker(queue)):
            await settle(await traced.enqueue())
        await queue.close()
    finally:
        BlitzqInstrumentor().uninstrument()
        provider.shutdown()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "process senttr"]
    (event,) = sentry.events
    trace = event["contexts"]["trace"]
    assert trace["trace_id"] == format(span.context.trace_id, "032x")
    assert trace["span_id"] == format(span.context.span_id, "016x")


async def test_without_a_span_the_trace_comes_from_the_traceparent_header(
    make_queue: Callable[..., Queue], sentry: MemoryTransport, logging_reports_outcomes: None
) -> None:
    queue = make_queue(name="sentth")
    queue.add_middleware(SentryMiddleware())

    @queue.task(name="sent.headed", retries=0)
    async def headed() -> None:
        raise RuntimeError("headed failure")

    async with running(make_worker(queue)):
        await settle(await headed.options(headers={"traceparent": TRACEPARENT}).enqueue())
    await queue.close()
    (event,) = sentry.events
    trace = event["contexts"]["trace"]
    assert trace["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace["parent_span_id"] == "00f067aa0ba902b7"
    assert len(trace["span_id"]) == 16
    assert trace["span_id"] != "00f067aa0ba902b7"


async def test_without_the_middleware_the_error_record_reaches_sentry(
    make_queue: Callable[..., Queue], sentry: MemoryTransport
) -> None:
    """An application that only calls ``sentry_sdk.init``: the worker's ERROR record of the
    final failure is an event of Sentry's logging integration, with the task's fields; the
    retry's WARNING is not."""
    assert OUTCOME_LOGGER not in sentry_logging._IGNORED_LOGGERS
    queue = make_queue(name="sentlog")

    @queue.task(name="sent.logged", retries=1, retry_policy=FAST_RETRY)
    async def logged() -> None:
        raise ValueError("logged failure")

    async with running(make_worker(queue)):
        handle = await logged.enqueue()
        await settle(handle)
    await queue.close()
    (event,) = sentry.events
    assert event["logger"] == OUTCOME_LOGGER
    assert exception_of(event)["type"] == "ValueError"
    extra = event["extra"]
    assert (extra["task_id"], extra["task"], extra["attempt"]) == (handle.id, "sent.logged", 2)
    assert extra["error_type"] == "ValueError"


def test_no_active_client_reports_nothing_and_bad_arguments_are_refused() -> None:
    assert not sentry_sdk.get_client().is_active()
    with pytest.raises(TypeError, match="ignore_outcome_logger"):
        SentryMiddleware(ignore_outcome_logger="no")  # type: ignore[arg-type]
    SentryMiddleware(ignore_outcome_logger=False)
    assert OUTCOME_LOGGER not in sentry_logging._IGNORED_LOGGERS


@pytest.mark.parametrize(
    "value",
    [
        None,
        7,
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # three parts
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # invalid version
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",  # not hex
        "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",  # short
    ],
    ids=repr,
)
def test_a_bad_traceparent_gives_no_trace_context(value: Any) -> None:
    from blitzq import TaskContext

    context = TaskContext("id", "t", "q", 1, 1, None, {"traceparent": value})
    assert trace_context(context) is None
