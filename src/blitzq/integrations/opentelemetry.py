"""OpenTelemetry tracing of enqueues and task runs (needs only ``opentelemetry-api``).

::

    from blitzq.integrations.opentelemetry import BlitzqInstrumentor

    BlitzqInstrumentor().instrument()             # every Queue made from now on
    BlitzqInstrumentor().instrument(queue=queue)  # or one Queue (made before or after)

The instrumentor convention of the ``opentelemetry-instrumentation-*`` packages (Celery's among
them), without depending on ``opentelemetry-instrumentation``: ``instrument()`` and
``uninstrument()``, idempotent, ``tracer_provider=`` to use a provider other than the global
one. The SDK, exporters and sampling are the application's to configure.

What is traced, through the middleware of :mod:`blitzq.extensions.middleware` (nothing in the
core knows about tracing):

- **enqueue**: a span ``<queue> publish`` (kind ``PRODUCER``), a child of the caller's current
  span, from the before-enqueue hook to the after-enqueue hook; its context is written into the
  message envelope's ``headers`` with the global text-map propagator (W3C ``traceparent`` /
  ``tracestate`` by default);
- **each attempt**: a span ``<task> process`` (kind ``CONSUMER``) around the run, whose parent
  is the context in the message's headers (the producer span), current while the task body
  runs (so the task's own spans and the tasks it enqueues are its children);
- **a retry's** message carries the attempt's span context in the header :data:`LINK_HEADER`:
  the next attempt's span links to the previous attempt's; **a workflow step** published by a
  finished step carries that step's span context as its parent and as a link (the first steps
  of ``queue.apply`` start new traces: they are not enqueued through the middleware).

Attributes: ``messaging.system`` = ``"blitzq"``, ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the task id), ``messaging.operation`` / ``messaging.operation.type``
(``"send"`` for the publish span, the semantic conventions' name since 1.26, or
``"process"``), ``blitzq.task.name``, ``blitzq.task.attempt`` and, on a
consumer span, ``blitzq.task.outcome`` (``succeeded``, ``failed``, ``retried``,
``dead_lettered``, ``cancelled``, ``requeued``). A failed attempt records its exception on the
span, with status ``ERROR``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from ..broker.ops import Publish, WorkflowStep
from ..exceptions import ConfigurationError, TaskCancelled
from ..extensions.middleware import Middleware, Outgoing
from ..queue import Queue
from ..serialization import Envelope, decode_envelope, encode_envelope
from ..workflow.engine import finish_step

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "blitzq.integrations.opentelemetry needs opentelemetry-api: pip install "
        "opentelemetry-api (or install blitzq from its checkout with the extra: "
        "pip install -e '.[otel]')"
    ) from exc

if TYPE_CHECKING:
    from ..broker import Completion
    from ..context import TaskContext
    from ..options import TaskOptions
    from ..task import Task
    from ..worker.execution import Job

#: Header carrying the W3C ``traceparent`` of the span a consumer span links to (the previous
#: attempt of a retry, the step that published a workflow step).
LINK_HEADER = "blitzq-trace-link"
#: ``messaging.system`` of every span.
MESSAGING_SYSTEM = "blitzq"
#: Producer spans kept open between the before- and after-enqueue hooks at most (a publish
#: that failed never reaches the after hook: the oldest are ended past this many).
MAX_OPEN_PUBLISH_SPANS = 10_000

_TRACER_NAME = "blitzq.integrations.opentelemetry"
#: The link header is always W3C ``traceparent``, whatever the global propagator is.
_W3C = TraceContextTextMapPropagator()


class TracingMiddleware(Middleware):
    """The middleware :class:`BlitzqInstrumentor` adds to a Queue (one per instrumentor).

    Args:
        tracer: the ``opentelemetry.trace.Tracer`` making the spans.
    """

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
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

    async def before_enqueue(self, message: Outgoing) -> None:
        """Start the ``<queue> publish`` span and write its context into the headers."""
        if not self.enabled:
            return
        env = message.envelope
        span = self.tracer.start_span(
            f"{env.queue} publish",
            kind=SpanKind.PRODUCER,
            attributes=_attributes(env.queue, env.id, "send", env.task, env.attempt),
        )
        headers = {k: v for k, v in (env.headers or {}).items() if k != LINK_HEADER}
        propagate.inject(headers, context=trace.set_span_in_context(span))
        message.envelope = _with_headers(env, headers)
        self._publishing[env.id] = span
        while len(self._publishing) > MAX_OPEN_PUBLISH_SPANS:
            _, stale = self._publishing.popitem(last=False)
            stale.set_status(Status(StatusCode.ERROR, "publish not confirmed"))
            stale.end()

    async def after_enqueue(self, message: Outgoing) -> None:
        """End the publish span of ``message``."""
        span = self._publishing.pop(message.envelope.id, None)
        if span is not None:
            span.end()

    # ------------------------------------------------------------- consumer
    async def before_execute(self, context: TaskContext) -> None:
        """Start the ``<task> process`` span, child of the producer's context, and make it
        the current span of the run."""
        if not self.enabled:
            return
        headers = context.headers or {}
        parent = propagate.extract(headers)
        links = []
        origin = headers.get(LINK_HEADER)
        if isinstance(origin, str):
            linked = trace.get_current_span(_W3C.extract({"traceparent": origin}))
            if linked.get_span_context().is_valid:
                links.append(Link(linked.get_span_context(), {"blitzq.link": "origin"}))
        span = self.tracer.start_span(
            f"{context.task} process",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=_attributes(
                context.queue, context.id, "process", context.task, context.attempt
            ),
        )
        self._running[(context.id, context.attempt)] = span
        # The hooks run in the run's own context copy: the task body starts inside the span.
        otel_context.attach(trace.set_span_in_context(span, parent))

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        """End the run's span (outcome ``succeeded``)."""
        span = self._running.pop((context.id, context.attempt), None)
        if span is not None:
            span.set_attribute("blitzq.task.outcome", "succeeded")
            span.end()

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        """Record ``exc`` on the run's span, set status ``ERROR`` and end it."""
        span = self._running.pop((context.id, context.attempt), None)
        if span is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            span.set_attribute("blitzq.task.outcome", "requeued")
        else:
            if isinstance(exc, TaskCancelled):
                span.set_attribute("blitzq.task.outcome", "cancelled")
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    def _finish(
        self, job: Job, completion: Completion, final: bool, error: BaseException | None
    ) -> Completion:
        """Finisher: name the outcome, and carry this attempt's span context into the retry
        and the workflow steps the completion publishes."""
        span = self._running.get((job.envelope.id, job.attempt))
        if span is None:
            return completion
        span.set_attribute("blitzq.task.outcome", _outcome(completion, final, error))
        current = trace.set_span_in_context(span)
        link: dict[str, str] = {}
        _W3C.inject(link, context=current)
        traceparent = link.get("traceparent")
        if traceparent is None:
            return completion
        carrier: dict[str, str] = {}  # a workflow step's parent, in the global format
        propagate.inject(carrier, context=current)
        changes: dict[str, Any] = {}
        if completion.reschedule is not None:  # the retry: same parent, linked to this one
            changes["reschedule"] = _relink(completion.reschedule, traceparent, None)
        if any(isinstance(op, Publish | WorkflowStep) for op in completion.ops):
            changes["ops"] = tuple(
                msgspec.structs.replace(op, message=_relink(op.message, traceparent, carrier))
                if isinstance(op, Publish | WorkflowStep)
                else op
                for op in completion.ops
            )
        return replace(completion, **changes) if changes else completion


def _relink(data: bytes, traceparent: str, parent: dict[str, str] | None) -> bytes:
    """``data`` (an encoded envelope) with the link header set to ``traceparent`` and, when
    ``parent`` is given, its trace context replaced by ``parent``'s headers."""
    env = decode_envelope(data)
    headers = dict(env.headers or {})
    if parent is not None:
        for key in ("traceparent", "tracestate"):
            headers.pop(key, None)
        headers.update(parent)
    headers[LINK_HEADER] = traceparent
    return encode_envelope(_with_headers(env, headers), len(data) + 1024)


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
    queue: str, message_id: str, operation: str, task: str, attempt: int
) -> dict[str, Any]:
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": message_id,
        "messaging.operation": operation,
        "messaging.operation.type": operation,
        "blitzq.task.name": task,
        "blitzq.task.attempt": attempt,
    }


class BlitzqInstrumentor:
    """Trace blitzq enqueues and task runs with OpenTelemetry (see the module docstring).

    A singleton, as the ``opentelemetry-instrumentation`` instrumentors are:
    ``BlitzqInstrumentor()`` always returns the same object, so ``BlitzqInstrumentor()
    .uninstrument()`` undoes what another ``BlitzqInstrumentor().instrument()`` did.
    ``instrument()`` twice on one Queue with the same provider adds one middleware. Meant for
    start-up code, not to be toggled per request.
    """

    _instance: ClassVar[BlitzqInstrumentor | None] = None
    _made: list[TracingMiddleware]
    _current: TracingMiddleware | None
    _provider: trace.TracerProvider | None
    _original_init: Callable[..., None] | None

    def __new__(cls) -> BlitzqInstrumentor:
        if cls._instance is None:
            instance = super().__new__(cls)
            instance._made, instance._current, instance._provider = [], None, None
            instance._original_init = None
            cls._instance = instance
        return cls._instance

    @property
    def is_instrumented(self) -> bool:
        """Whether :meth:`instrument` was called and :meth:`uninstrument` not since."""
        return self._current is not None

    def instrument(
        self, queue: Queue | None = None, *, tracer_provider: trace.TracerProvider | None = None
    ) -> None:
        """Start tracing.

        Args:
            queue: the Queue to trace; ``None`` traces every Queue made after this call
                (``Queue.__init__`` is wrapped until :meth:`uninstrument`); Queues made
                before it must be passed one by one.
            tracer_provider: the provider of the tracer; default: the global one
                (``opentelemetry.trace.set_tracer_provider``). A Queue instrumented twice
                with different providers makes its spans twice.

        Raises:
            ConfigurationError: ``queue`` is not a :class:`~blitzq.Queue`.
        """
        if queue is not None and not isinstance(queue, Queue):
            raise ConfigurationError(f"instrument(queue=...) takes a blitzq.Queue, not {queue!r}")
        if self._current is None or tracer_provider is not self._provider:
            tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)
            self._current, self._provider = TracingMiddleware(tracer), tracer_provider
            self._made.append(self._current)
        middleware = self._current
        if queue is not None:
            _add(queue, middleware)
            return
        self._restore_init()
        original = self._original_init = Queue.__init__

        def init(this: Queue, *args: Any, **kwargs: Any) -> None:
            original(this, *args, **kwargs)
            _add(this, middleware)

        Queue.__init__ = init  # type: ignore[method-assign,assignment]

    def _restore_init(self) -> None:
        if self._original_init is not None:
            Queue.__init__ = self._original_init  # type: ignore[method-assign]
            self._original_init = None

    def uninstrument(self) -> None:
        """Stop tracing: the middleware added stays registered but does nothing, and Queues
        made from now on are not traced (``Queue.__init__`` restored)."""
        self._restore_init()
        for middleware in self._made:
            middleware.enabled = False
        self._made.clear()
        self._current = self._provider = None


def _add(queue: Queue, middleware: TracingMiddleware) -> None:
    if middleware not in queue.middleware:
        queue.add_middleware(middleware)


__all__ = [
    "LINK_HEADER",
    "MAX_OPEN_PUBLISH_SPANS",
    "MESSAGING_SYSTEM",
    "BlitzqInstrumentor",
    "TracingMiddleware",
]
