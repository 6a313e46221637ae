"""OpenTelemetry tracing (issue 11, "Tracing"): spans read back from the SDK's in-memory
exporter, in this process (in-process worker) and in a worker process (dumped as JSON when
it stops).

A producer span ``send <queue>`` per enqueue and per workflow start, a consumer span
``process <queue>`` per attempt whose parent is the producer's context, a retry's span
linked to the previous attempt's, the steps of a workflow in the trace of its ``apply`` and
linked to it, the exception of a failed attempt recorded with status ERROR; and across a
worker process, one span tree.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from blitzq import ConfigurationError, Queue, RetryPolicy
from blitzq.integrations.opentelemetry import BlitzqInstrumentor
from blitzq.workflow import chord

from .otel_spans import SpanTree, record
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


def broker_server(url: str) -> dict[str, Any]:
    """``server.address``/``server.port`` the spans should carry for a Redis URL."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return {"server.address": parts.path}
    return {"server.address": parts.hostname, "server.port": parts.port or 6379}


async def test_producer_consumer_retry_and_error(
    make_queue: Callable[..., Queue],
    traced: tuple[TracerProvider, InMemorySpanExporter],
    server_url: str,
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
        await eventually(lambda: _value(len(by_name(exporter, "process otelq"))), lambda n: n == 2)
    await queue.close()

    (publish,) = by_name(exporter, "send otelq")
    assert publish.kind is SpanKind.PRODUCER
    assert publish.parent is not None
    assert publish.parent.span_id == client.get_span_context().span_id
    assert dict(publish.attributes or {}) == {
        "messaging.system": "blitzq",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "otelq",
        "messaging.message.id": handle.id,
        "blitzq.task.name": "otel.flaky",
        "blitzq.task.attempt": 1,
        **broker_server(server_url),
    }

    first, second = by_name(exporter, "process otelq")
    for span, attempt in ((first, 1), (second, 2)):
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None
        # Both attempts are children of the producer span, in the client's trace.
        assert span.parent.span_id == publish.context.span_id
        assert span.context.trace_id == client.get_span_context().trace_id
        attrs = span.attributes or {}
        assert attrs["messaging.system"] == "blitzq"
        assert attrs["messaging.operation.name"] == attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "otelq"
        assert attrs["messaging.message.id"] == handle.id
        assert attrs["blitzq.task.name"] == "otel.flaky"
        assert attrs["blitzq.task.attempt"] == attempt
        assert "messaging.operation" not in attrs  # the deprecated name
        # The broker's address and the streams' consumer group (reliable mode on Redis).
        assert {k: attrs.get(k) for k in broker_server(server_url)} == broker_server(server_url)
        assert attrs["messaging.consumer.group.name"] == "blitzq"
    assert (first.attributes or {})["blitzq.task.outcome"] == "retried"
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "ValueError"
    assert "error.type" not in (second.attributes or {})
    assert [e.name for e in first.events] == ["exception"]
    assert (first.events[0].attributes or {})["exception.type"] == "ValueError"
    assert (second.attributes or {})["blitzq.task.outcome"] == "succeeded"
    assert second.status.status_code is not StatusCode.ERROR
    # The retry's span links to the previous attempt's.
    assert SpanTree.links(record(second)) == {"previous_attempt": f"{first.context.span_id:016x}"}
    assert not first.links


async def test_workflow_steps_carry_the_origin_of_apply(
    make_queue: Callable[..., Queue],
    traced: tuple[TracerProvider, InMemorySpanExporter],
    server_url: str,
) -> None:
    """``queue.apply`` makes a producer span; the first steps are its children, a chain's
    later step is a child of the step before and links to the origin, as does a chord's
    callback (a child of the member that fired it); a task enqueued from a task is a child
    of that task's span and links to nothing."""
    provider, exporter = traced
    queue = make_queue(name="otelwf")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)

    @queue.task(name="otel.inc")
    async def inc(x: int) -> int:
        return x + 1

    @queue.task(name="otel.double")
    async def double(x: int) -> int:
        return x * 2

    @queue.task(name="otel.total")
    async def total(values: list[int]) -> int:
        return sum(values)

    @queue.task(name="otel.done")
    async def done() -> str:
        return "done"

    @queue.task(name="otel.parent")
    async def parent() -> str:
        child = await double.enqueue(21)  # from inside a task: a child of this run's span
        return child.id

    tracer = provider.get_tracer("test")
    async with running(make_worker(queue)):
        with tracer.start_as_current_span("client") as client:
            line = await queue.apply(inc.s(1) | double.s())
            fan = await queue.apply(chord([inc.s(1), inc.s(2)], total.s()) | double.s())
            fixed = await queue.apply(chord([inc.s(5)], done.si()))  # immutable callback
        assert await line.get(timeout=30) == 4
        assert await fan.get(timeout=30) == 10
        assert await fixed.get(timeout=30) == "done"
        child_id = await (await parent.enqueue()).result(timeout=30)
        await eventually(
            lambda: _value(len(by_name(exporter, "process otelwf"))), lambda n: n == 10
        )
        line_ids = [h.id for h in await line.children()]
        fan_ids = [h.id for h in await fan.children()]
        fixed_ids = [h.id for h in await fixed.children()]
    await queue.close()
    tree = SpanTree(record(span) for span in exporter.get_finished_spans())
    client_id = f"{client.get_span_context().span_id:016x}"
    trace_id = f"{client.get_span_context().trace_id:032x}"

    # A chain: its start's producer span, step 1 its child, step 2 the child of step 1.
    start = tree.one("send otelwf", blitzq_workflow_id=line.id)
    assert start["kind"] == "PRODUCER"
    assert start["parent_span_id"] == client_id
    assert start["attributes"] == {
        "messaging.system": "blitzq",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "otelwf",
        "messaging.message.id": line_ids[0],
        "messaging.message.conversation_id": line.id,
        "blitzq.workflow.id": line.id,
        "blitzq.task.name": "otel.inc",
        **broker_server(server_url),
    }
    step1 = tree.one("process otelwf", messaging_message_id=line_ids[0])
    step2 = tree.one("process otelwf", messaging_message_id=line_ids[1])
    assert step1["parent_span_id"] == start["span_id"]
    assert not step1["links"]  # its parent is the origin
    assert step2["parent_span_id"] == step1["span_id"]
    assert tree.links(step2) == {"workflow_origin": start["span_id"]}
    for span in (step1, step2):
        assert span["trace_id"] == trace_id
        assert span["attributes"]["messaging.message.conversation_id"] == line.id

    # A chord, then a step: two members under the start, the callback under one of them.
    start = tree.one("send otelwf", blitzq_workflow_id=fan.id)
    assert start["attributes"]["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in start["attributes"]
    members = [tree.one("process otelwf", messaging_message_id=i) for i in fan_ids[:2]]
    callback = tree.one("process otelwf", messaging_message_id=fan_ids[2])
    after = tree.one("process otelwf", messaging_message_id=fan_ids[3])
    for member in members:
        assert member["parent_span_id"] == start["span_id"]
        assert not member["links"]
    assert callback["attributes"]["blitzq.task.name"] == "otel.total"
    assert callback["parent_span_id"] in {member["span_id"] for member in members}
    assert tree.links(callback) == {"workflow_origin": start["span_id"]}
    assert after["parent_span_id"] == callback["span_id"]
    assert tree.links(after) == {"workflow_origin": start["span_id"]}
    assert {span["trace_id"] for span in (*members, callback, after)} == {trace_id}
    # An immutable callback (no results spliced into it) is carried the same way.
    start = tree.one("send otelwf", blitzq_workflow_id=fixed.id)
    member = tree.one("process otelwf", messaging_message_id=fixed_ids[0])
    callback = tree.one("process otelwf", messaging_message_id=fixed_ids[1])
    assert member["parent_span_id"] == start["span_id"]
    assert callback["parent_span_id"] == member["span_id"]
    assert tree.links(callback) == {"workflow_origin": start["span_id"]}

    # A task enqueued from inside a task.
    parent_run = tree.one("process otelwf", blitzq_task_name="otel.parent")
    child_publish = tree.one("send otelwf", messaging_message_id=child_id)
    child = tree.one("process otelwf", messaging_message_id=child_id)
    assert child_publish["parent_span_id"] == parent_run["span_id"]
    assert child["parent_span_id"] == child_publish["span_id"]
    assert not child["links"]  # a fresh enqueue links to nothing


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


async def test_one_span_tree_across_a_worker_process(
    server_url: str,
    namespace: str,
    tmp_path: Path,
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """The producer spans in this process's in-memory exporter, the consumer spans in the
    worker process's (dumped as JSON when it stopped): one tree, parent/child and links
    across the two processes."""
    provider, exporter = traced
    spans_file = tmp_path / "spans.json"
    queue = Queue(redis_url=server_url, namespace=namespace, name="otel")
    BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        BLITZQ_TEST_SPANS=str(spans_file),
        BLITZQ_REDIS_URL=server_url,
        BLITZQ_NAMESPACE=namespace,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "blitzq", "worker", "tests.integration.otel_app:queue",
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    tracer = provider.get_tracer("test")
    try:
        with tracer.start_as_current_span("client") as client:
            handle = await queue.send("otel.flaky", [5])
            flow = await queue.apply(
                chord([queue.sig("otel.add", 1, 2), queue.sig("otel.add", 3, 4)],
                      queue.sig("otel.total")) | queue.sig("otel.add", 100)
            )  # fmt: skip
        assert await handle.result(timeout=60) == 5
        assert await flow.get(timeout=60) == 110
        steps = [h.id for h in await flow.children()]
    finally:
        worker.terminate()  # a graceful stop: the worker dumps its spans once stopped
        _, errors = await asyncio.wait_for(worker.communicate(), 60)
    await queue.close()
    stderr = errors.decode(errors="replace")
    assert worker.returncode == 0, stderr
    remote = json.loads(spans_file.read_text())
    assert remote, stderr
    assert all(span["kind"] == "CONSUMER" for span in remote)
    local = [record(span) for span in exporter.get_finished_spans()]
    tree = SpanTree([*local, *remote])
    client_id = f"{client.get_span_context().span_id:016x}"
    trace_id = f"{client.get_span_context().trace_id:032x}"
    assert {span["trace_id"] for span in tree.spans} == {trace_id}  # one trace

    # The retried task: a producer span here, both attempts under it there, linked.
    publish = tree.one("send otel", messaging_message_id=handle.id)
    assert publish["kind"] == "PRODUCER"
    root = tree.one("client")
    assert root["span_id"] == client_id
    assert tree.parent(root) is None
    assert tree.parent(publish) is root
    first = tree.one("process otel", messaging_message_id=handle.id, blitzq_task_attempt=1)
    second = tree.one("process otel", messaging_message_id=handle.id, blitzq_task_attempt=2)
    assert tree.parent(first) is publish
    assert tree.parent(second) is publish
    assert first["attributes"]["blitzq.task.outcome"] == "retried"
    assert first["status"] == "ERROR"
    assert first["events"] == ["exception"]
    assert second["attributes"]["blitzq.task.outcome"] == "succeeded"
    assert tree.links(second) == {"previous_attempt": first["span_id"]}
    assert not first["links"]

    # The workflow: its start here, the members under it, the callback under the member
    # that fired it, the last step under the callback; the later steps linked to the start.
    start = tree.one("send otel", blitzq_workflow_id=flow.id)
    assert start["kind"] == "PRODUCER"
    assert tree.parent(start) is root
    members = [tree.one("process otel", messaging_message_id=i) for i in steps[:2]]
    callback = tree.one("process otel", messaging_message_id=steps[2])
    last = tree.one("process otel", messaging_message_id=steps[3])
    for member in members:
        assert tree.parent(member) is start
        assert not member["links"]
    assert callback["attributes"]["blitzq.task.name"] == "otel.total"
    assert any(tree.parent(callback) is member for member in members)
    assert tree.links(callback) == {"workflow_origin": start["span_id"]}
    assert tree.parent(last) is callback
    assert tree.links(last) == {"workflow_origin": start["span_id"]}
    for span in (*members, callback, last):
        assert span["attributes"]["messaging.message.conversation_id"] == flow.id
        assert span["attributes"]["blitzq.task.outcome"] == "succeeded"
    assert len(remote) == 6  # two attempts, four steps: nothing else


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
