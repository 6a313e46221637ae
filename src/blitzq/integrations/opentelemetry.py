"""OpenTelemetry tracing of enqueues, workflow starts and task runs (needs only
``opentelemetry-api``).

::

    from blitzq.integrations.opentelemetry import BlitzqInstrumentor

    BlitzqInstrumentor().instrument()             # every Queue made from now on
    BlitzqInstrumentor().instrument(queue=queue)  # or one Queue (made before or after)

The instrumentor convention of the ``opentelemetry-instrumentation-*`` packages (Celery's among
them), without depending on ``opentelemetry-instrumentation``: ``instrument()`` and
``uninstrument()``, idempotent, ``tracer_provider=`` to use a provider other than the global
one. The SDK, exporters and sampling are the application's to configure.

Spans follow the messaging semantic conventions (v1.26 and later: ``messaging.operation.type``
``send`` / ``process``, span names ``{operation} {destination}``), made through the middleware
of :mod:`blitzq.extensions.middleware` (nothing in the core knows about tracing):

- **enqueue** (``enqueue``, ``enqueue_many``, ``send``, an enqueue from inside a task): a span
  ``send <queue>`` (kind ``PRODUCER``), a child of the caller's current span, from the
  before-enqueue hook to the after-enqueue hook; its context is written into the message's
  ``headers`` with the global text-map propagator (W3C ``traceparent`` / ``tracestate`` by
  default);
- **workflow start** (``queue.apply``): a span ``send <queue>`` (``send`` alone when the first
  steps go to several queues; kind ``PRODUCER``), a child of the caller's current span, from
  the before-apply to the after-apply hook; its context goes into the headers of every first
  step, and its W3C ``traceparent`` into the header :data:`ORIGIN_HEADER`, which every later
  step of the workflow carries too: the workflow's *origin*;
- **each attempt**: a span ``process <queue>`` (kind ``CONSUMER``) around the run, whose
  parent is the context in the message's headers, current while the task body runs (the
  task's own spans and the tasks it enqueues are its children). The parent is the producer
  span of the enqueue or workflow start; for a workflow step published by a worker (the next
  step of a chain, a chord's callback) it is the consumer span of the step whose completion
  published it (for a chord callback: the member that finished last and fired it).

Links of a consumer span: a retry's message carries the previous attempt's span context in
the header :data:`LINK_HEADER`, and the next attempt's span links to it
(``blitzq.link.type`` = ``previous_attempt``); a workflow step whose parent is not the origin
itself (a chain's later steps, a chord callback and their retries) links to the origin
(``blitzq.link.type`` = ``workflow_origin``); a first step, a child of the origin, does not.
A chord callback is not linked to every member (the broker joins the members' results, not
their trace contexts): it is a child of the member that fired it and linked to the origin.

Attributes: ``messaging.system`` = ``"blitzq"`` (:data:`MESSAGING_SYSTEM`: the same whichever
broker, Redis or AMQP, carries the messages), ``messaging.operation.name`` and
``messaging.operation.type`` (``"send"`` or ``"process"``), ``messaging.destination.name``
(the physical queue), ``messaging.message.id`` (the task id),
``messaging.message.conversation_id`` (the correlation id: a workflow step's is its
workflow's id),
``blitzq.task.name``, ``blitzq.task.attempt`` and, on a consumer span, ``blitzq.task.outcome``
(``succeeded``, ``failed``, ``retried``, ``dead_lettered``, ``cancelled``, ``requeued``). A
workflow start's span has ``blitzq.workflow.id`` and, instead of the message attributes when it
publishes more than one step, ``messaging.batch.message_count``. ``server.address`` and
``server.port`` name the broker carrying the messages (the Queue's Redis URL, or its
``amqp_url``), and a consumer span in reliable mode on Redis has
``messaging.consumer.group.name`` (the streams' group, ``blitzq``). A failed attempt records
its exception on the span, sets ``error.type`` (the exception's qualified type name) and the
status ``ERROR``. Log records a task emits carry the span's ``trace_id`` and ``span_id``
(:class:`blitzq.logcontext.TaskContextFilter`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..exceptions import ConfigurationError
from ..queue import Queue

try:
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "blitzq.integrations.opentelemetry needs opentelemetry-api: pip install "
        "opentelemetry-api (or install blitzq from its checkout with the extra: "
        "pip install -e '.[otel]')"
    ) from exc

from .opentelemetry_spans import (
    LINK_HEADER,
    LINK_TYPE,
    MAX_OPEN_PUBLISH_SPANS,
    MESSAGING_SYSTEM,
    ORIGIN_HEADER,
    TRACER_NAME,
    TracingMiddleware,
)


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
            tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
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


def _add(queue: Queue, template: TracingMiddleware) -> None:
    """Add to ``queue`` a middleware of ``template``'s tracer bound to it (for its broker's
    address), once per tracer."""
    for existing in queue.middleware:
        if isinstance(existing, TracingMiddleware) and existing.tracer is template.tracer:
            return
    instance = BlitzqInstrumentor()
    middleware = TracingMiddleware(template.tracer, queue)
    instance._made.append(middleware)
    queue.add_middleware(middleware)


__all__ = [
    "LINK_HEADER",
    "LINK_TYPE",
    "MAX_OPEN_PUBLISH_SPANS",
    "MESSAGING_SYSTEM",
    "ORIGIN_HEADER",
    "BlitzqInstrumentor",
    "TracingMiddleware",
]
