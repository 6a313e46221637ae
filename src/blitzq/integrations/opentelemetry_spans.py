"""The middleware of :mod:`blitzq.integrations.opentelemetry`: the spans, the headers that
carry their context, the links (see that module for what is traced).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..broker.effects import ChordMember, Op, Publish, WorkflowStep
from ..broker.factory import resolve_amqp_url
from ..broker.redis.keys import GROUP
from ..client import testmode
from ..exceptions import TaskCancelled
from ..extensions.middleware import Middleware, Outgoing, OutgoingWorkflow
from ..serialization import Envelope, decode_envelope, encode_envelope
from ..worker.tally import exception_name
from ..workflow.callback import rewrite_chord_callback
from ..workflow.steps import finish_step

if TYPE_CHECKING:
    from ..broker import Completion
    from ..context import TaskContext
    from ..options import TaskOptions
    from ..queue import Queue
    from ..task import Task
    from ..worker.execution import Job

#: Header carrying the W3C ``traceparent`` of a retry's previous attempt (its consumer span).
LINK_HEADER = "blitzq-trace-link"
#: Header carrying the W3C ``traceparent`` of a workflow's origin (its start's producer span),
#: on every step of the workflow.
ORIGIN_HEADER = "blitzq-trace-origin"
#: Attribute names of blitzq's own (the ``messaging.*`` ones are the semantic conventions').
TASK_NAME = "blitzq.task.name"
TASK_ATTEMPT = "blitzq.task.attempt"
TASK_OUTCOME = "blitzq.task.outcome"
WORKFLOW_ID = "blitzq.workflow.id"
#: Semantic-convention attributes: the broker's address and port, the stream's consumer group,
#: the qualified type of the exception a failed attempt raised.
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
CONSUMER_GROUP = "messaging.consumer.group.name"
ERROR_TYPE = "error.type"
#: Attribute of a link: ``previous_attempt`` or ``workflow_origin``.
LINK_TYPE = "blitzq.link.type"
#: ``messaging.system`` of every span.
MESSAGING_SYSTEM = "blitzq"
#: Producer spans kept open between the before- and after-enqueue hooks at most (a publish
#: that failed never reaches the after hook: the oldest are ended past this many).
MAX_OPEN_PUBLISH_SPANS = 10_000

TRACER_NAME = "blitzq.integrations.opentelemetry"
logger = logging.getLogger(TRACER_NAME)
#: Headers a published step's trace headers replace (the global propagator's own fields too).
_TRACE_HEADERS = frozenset({"traceparent", "tracestate", LINK_HEADER, ORIGIN_HEADER})
#: The link header is always W3C ``traceparent``, whatever the global propagator is.
_W3C = TraceContextTextMapPropagator()


class TracingMiddleware(Middleware):
    """The middleware :class:`BlitzqInstrumentor` adds to a Queue (one per instrumentor).

    Args:
        tracer: the ``opentelemetry.trace.Tracer`` making the spans.
        queue: the Queue it traces, whose broker gives ``server.address``, ``server.port``
            and ``messaging.consumer.group.name`` (``None``: no such attributes).
    """

    def __init__(self, tracer: trace.Tracer, queue: Queue | None = None) -> None:
        self.tracer = tracer
        self.queue = queue
        self._server: dict[str, Any] | None = None  # read once the broker is in use
        self._group: dict[str, Any] = {}
        #: Off after ``uninstrument()``: every hook then returns at once.
        self.enabled = True
        self._publishing: OrderedDict[str, trace.Span] = OrderedDict()
        self._running: dict[tuple[str, int], trace.Span] = {}

    # ------------------------------------------------------------- producer
    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Add the finisher that links retries and workflow steps to this attempt (after
        the workflow engine's, which adds the next steps it rewrites)."""
        if finish_step not in task.finishers:  # registration adds it after setup_task
            task.finishers.append(finish_step)
        if self._finish not in task.finishers:
            task.finishers.append(self._finish)

    def _opened(self, key: str, span: trace.Span) -> None:
        self._publishing[key] = span
        while len(self._publishing) > MAX_OPEN_PUBLISH_SPANS:
            _, stale = self._publishing.popitem(last=False)
            stale.set_status(Status(StatusCode.ERROR, "publish not confirmed"))
            stale.end()

    async def before_enqueue(self, message: Outgoing) -> None:
        """Start the ``send <queue>`` span and write its context into the headers."""
        if not self.enabled:
            return
        env = message.envelope
        attributes = _attributes("send", env.queue, env.id, env.correlation_id)
        attributes.update({TASK_NAME: env.task, TASK_ATTEMPT: env.attempt})
        span = self.tracer.start_span(
            f"send {env.queue}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        headers = {
            k: v for k, v in (env.headers or {}).items() if k not in (LINK_HEADER, ORIGIN_HEADER)
        }
        propagate.inject(headers, context=trace.set_span_in_context(span))
        message.envelope = _with_headers(env, headers)
        self._opened(env.id, span)

    async def after_enqueue(self, message: Outgoing) -> None:
        """End the publish span of ``message``."""
        span = self._publishing.pop(message.envelope.id, None)
        if span is not None:
            span.set_attributes(self._server_attributes())
            span.end()

    async def before_apply(self, workflow: OutgoingWorkflow) -> None:
        """Start the workflow start's ``send`` span; write its context (and the origin
        header) into the headers of the first steps."""
        if not self.enabled:
            return
        steps = workflow.steps
        queues = sorted({env.queue for env in steps})
        single = steps[0] if len(steps) == 1 else None
        attributes = _attributes(
            "send",
            queues[0] if len(queues) == 1 else None,
            single.id if single is not None else None,
            workflow.workflow_id,
        )
        attributes[WORKFLOW_ID] = workflow.workflow_id
        if single is not None:
            attributes[TASK_NAME] = single.task
        else:
            attributes["messaging.batch.message_count"] = len(steps)
        name = f"send {queues[0]}" if len(queues) == 1 else "send"
        span = self.tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
        current = trace.set_span_in_context(span)
        propagate.inject(workflow.headers, context=current)
        origin: dict[str, str] = {}
        _W3C.inject(origin, context=current)
        if "traceparent" in origin:
            workflow.headers[ORIGIN_HEADER] = origin["traceparent"]
        self._opened(f"workflow:{workflow.workflow_id}", span)

    async def after_apply(self, workflow: OutgoingWorkflow) -> None:
        """End the workflow start's span."""
        span = self._publishing.pop(f"workflow:{workflow.workflow_id}", None)
        if span is not None:
            span.set_attributes(self._server_attributes())
            span.end()

    # ------------------------------------------------------------- consumer
    async def before_execute(self, context: TaskContext) -> None:
        """Start the ``process <queue>`` span, child of the context in the headers, and make
        it the current span of the run."""
        if not self.enabled:
            return
        headers = context.headers or {}
        parent = propagate.extract(headers)
        parent_id = trace.get_current_span(parent).get_span_context().span_id
        links = []
        for header, kind in ((LINK_HEADER, "previous_attempt"), (ORIGIN_HEADER, "workflow_origin")):
            linked = _span_context(headers.get(header))
            if linked is not None and linked.span_id != parent_id:
                links.append(Link(linked, {LINK_TYPE: kind}))
        attributes = _attributes("process", context.queue, context.id, context.correlation_id)
        attributes.update({TASK_NAME: context.task, TASK_ATTEMPT: context.attempt})
        attributes.update(self._server_attributes())
        attributes.update(self._group)
        span = self.tracer.start_span(
            f"process {context.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        )
        self._running[(context.id, context.attempt)] = span
        # The hooks run in the run's own context copy: the task body starts inside the span.
        otel_context.attach(trace.set_span_in_context(span, parent))

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        """End the run's span (outcome ``succeeded``)."""
        span = self._running.pop((context.id, context.attempt), None)
        if span is not None:
            span.set_attribute(TASK_OUTCOME, "succeeded")
            span.end()

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        """Record ``exc`` on the run's span, set status ``ERROR`` and end it."""
        span = self._running.pop((context.id, context.attempt), None)
        if span is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            span.set_attribute(TASK_OUTCOME, "requeued")
        else:
            if isinstance(exc, TaskCancelled):
                span.set_attribute(TASK_OUTCOME, "cancelled")
            span.record_exception(exc)
            span.set_attribute(ERROR_TYPE, exception_name(type(exc)))
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    def _server_attributes(self) -> dict[str, Any]:
        """``server.address`` / ``server.port`` of the broker that carries the messages (and
        the consumer group of reliable mode on Redis), read once, after the Queue first used
        its broker (never starting one); ``{}`` when unknown."""
        server = self._server
        if server is not None:
            return server
        queue = self.queue
        if queue is None:
            self._server = {}
            return self._server
        try:
            # As the Queue picks its broker: RabbitMQ when it has an AMQP URL, unless the
            # test mode of blitzq.testing keeps everything on its memory backend.
            amqp = None
            if testmode.forced_url is None:
                amqp = resolve_amqp_url(getattr(queue, "_amqp_url", None))
            server = _server(amqp or queue.url)
        except Exception:  # tracing never fails a run or an enqueue
            logger.debug("could not read the broker's address", exc_info=True)
            server = {}
        if queue.mode == "reliable" and not amqp:
            self._group = {CONSUMER_GROUP: GROUP}
        self._server = server
        return server

    def _finish(
        self, job: Job, completion: Completion, final: bool, error: BaseException | None
    ) -> Completion:
        """Finisher: name the outcome, and carry this attempt's span context into the retry
        (as its link) and into the workflow steps the completion publishes (as their
        parent, with the workflow's origin)."""
        span = self._running.get((job.envelope.id, job.attempt))
        if span is None:
            return completion
        span.set_attribute(TASK_OUTCOME, _outcome(completion, final, error))
        current = trace.set_span_in_context(span)
        link: dict[str, str] = {}
        _W3C.inject(link, context=current)
        traceparent = link.get("traceparent")
        if traceparent is None:
            return completion
        carrier: dict[str, Any] = {}  # a published step's parent, in the global format
        propagate.inject(carrier, context=current)
        origin = (job.envelope.headers or {}).get(ORIGIN_HEADER)
        if isinstance(origin, str):
            carrier[ORIGIN_HEADER] = origin
        changes: dict[str, Any] = {}
        if completion.reschedule is not None:  # the retry: same parent, linked to this one
            env = decode_envelope(completion.reschedule)
            headers = {**(env.headers or {}), LINK_HEADER: traceparent}
            changes["reschedule"] = _encode(_with_headers(env, headers), completion.reschedule)
        if any(isinstance(op, Publish | WorkflowStep | ChordMember) for op in completion.ops):
            limit = job.task.owner.max_message_size
            changes["ops"] = tuple(_carry(op, carrier, limit) for op in completion.ops)
        return replace(completion, **changes) if changes else completion


def _carry(op: Op, carrier: dict[str, Any], limit: int) -> Op:
    """``op`` with the message it publishes (a step, a chord callback) given the trace
    headers of ``carrier`` (its parent and origin) instead of its own; ``op`` unchanged if
    that fails (tracing never costs a completion)."""
    try:
        return _carried(op, carrier, limit)
    except Exception:
        logger.warning(
            "could not carry the trace context into %s", type(op).__name__, exc_info=True
        )
        return op


def _carried(op: Op, carrier: dict[str, Any], limit: int) -> Op:

    def change(env: Envelope) -> Envelope:
        headers = {k: v for k, v in (env.headers or {}).items() if k not in _TRACE_HEADERS}
        headers.update(carrier)
        return _with_headers(env, headers)

    if isinstance(op, Publish | WorkflowStep):
        return msgspec.structs.replace(
            op, message=_encode(change(decode_envelope(op.message)), op.message)
        )
    if isinstance(op, ChordMember):
        return rewrite_chord_callback(op, change, max(limit, len(op.head) + len(op.tail) + 1024))
    return op


def _encode(env: Envelope, before: bytes) -> bytes:
    return encode_envelope(env, len(before) + 1024)


#: Default ports of the URL schemes whose URLs may leave the port out.
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}


def _server(url: str) -> dict[str, Any]:
    """``server.address`` (host name, IP, or a Unix socket's path) and ``server.port`` of a
    broker URL; ``{}`` for an in-process ``memory://`` one."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "memory":  # in-process: its name is no host
        return {}
    if scheme == "unix":
        return {SERVER_ADDRESS: parts.path} if parts.path else {}
    host = parts.hostname
    if not host:
        return {}
    attributes: dict[str, Any] = {SERVER_ADDRESS: host}
    port = parts.port or (None if "sentinel" in parts.scheme else _DEFAULT_PORTS.get(scheme))
    if port is not None:
        attributes[SERVER_PORT] = port
    return attributes


def _span_context(traceparent: Any) -> trace.SpanContext | None:
    """The span context of a W3C ``traceparent`` value, or ``None`` if it is not one."""
    if not isinstance(traceparent, str):
        return None
    linked = trace.get_current_span(_W3C.extract({"traceparent": traceparent}))
    span_context = linked.get_span_context()
    return span_context if span_context.is_valid else None


def _with_headers(env: Envelope, headers: dict[str, Any]) -> Envelope:
    return msgspec.structs.replace(env, headers=headers or None)


def _outcome(completion: Completion, final: bool, error: BaseException | None) -> str:
    if completion.reschedule is not None:
        return "retried"
    if completion.requeue is not None:
        return "requeued"
    if completion.dead_letter is not None:
        return "dead_lettered"
    return "failed" if error is not None else "succeeded"


def _attributes(
    operation: str, queue: str | None, message_id: str | None, conversation_id: str | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    if conversation_id is not None:
        attributes["messaging.message.conversation_id"] = conversation_id
    return attributes


__all__ = [
    "CONSUMER_GROUP",
    "ERROR_TYPE",
    "LINK_HEADER",
    "LINK_TYPE",
    "MAX_OPEN_PUBLISH_SPANS",
    "MESSAGING_SYSTEM",
    "ORIGIN_HEADER",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "TASK_ATTEMPT",
    "TASK_NAME",
    "TASK_OUTCOME",
    "TRACER_NAME",
    "WORKFLOW_ID",
    "TracingMiddleware",
]
