"""Middleware: code that runs around every enqueue and every task run of a Queue.

Subclass :class:`Middleware`, override the hooks you need and register an instance with
``queue.add_middleware(m)``. Hooks are coroutines (a plain ``def`` works too):

==============================================  ===============================================
hook                                            when
==============================================  ===============================================
``before_enqueue(message)``                     producer, before a message is published; raise
                                                to refuse the enqueue (nothing is published)
``after_enqueue(message)``                      producer, after it was published
``before_publish(queue, batch)``                producer, once per batch after the
                                                ``before_enqueue`` hooks: may refuse it or
                                                mark duplicates (``existing_id``)
``after_publish(queue, batch)``                 producer, once per batch after the
                                                ``after_enqueue`` hooks
``before_execute(context)``                     worker, before the task body starts
``after_execute(context, result)``              worker, after a run returned ``result``
``on_error(context, exc)``                      worker, after a run failed (each attempt)
``on_retry(context, exc, delay)``               worker, after ``on_error`` when the task will be
                                                retried in ``delay`` seconds
``on_failure(context, exc, kind)``              worker, after ``on_error`` when the task failed
                                                for good (``kind``: ``"failed"`` or
                                                ``"dead_lettered"``): no attempt follows
``before_apply(workflow)``                      producer, before ``queue.apply`` publishes a
                                                workflow's first steps; raise to refuse it
``after_apply(workflow)``                       producer, after they were published
``on_worker_start(worker)``                     worker (and the eager test mode), once at start,
                                                before any task is fetched; raise to fail the
                                                start
``on_worker_stop(worker)``                      worker, once after its runs ended and their
                                                completions were written
``on_signal(event)``                            wherever a signal is emitted (producer, worker,
                                                scheduler): every :class:`~blitzq.Signal` in
                                                :attr:`Middleware.observes`, with its
                                                :class:`~blitzq.SignalEvent`
==============================================  ===============================================

``message`` is an :class:`Outgoing` (``message.envelope`` has the id, task name,
queue, args, kwargs and headers; ``message.due`` is the Unix time it becomes due or ``None``).
``workflow`` is an :class:`OutgoingWorkflow`: the first steps of a workflow go through the
apply hooks, not the enqueue hooks; headers a before-apply hook puts in ``workflow.headers``
are written into every first step's message (the steps a worker publishes later get none
from it: their finishers may add their own).
A before-enqueue hook may replace ``message.envelope`` (``msgspec.structs.replace(env,
headers=...)``) to change the arguments or headers; the message is then re-encoded. ``context``
is the run's :class:`~blitzq.TaskContext` (the same object ``current_task()`` returns inside
the task).

Order: ``before_*`` hooks run in registration order, ``after_*``, ``on_error``,
``on_retry`` and ``on_failure`` in reverse order (the first middleware registered wraps all others).
``on_worker_start`` runs in registration order after the Queue's own lifecycle sugar
(``@queue.on_startup`` hooks, then ``@queue.lifespan`` entered: the built-in
:class:`~blitzq.extensions.lifecycle.QueueHooks`), so its resources are ready;
``on_worker_stop`` runs in reverse order, before the shutdown hooks and the lifespans' close.
``worker`` is a :class:`RunningWorker` (its ``id``, ``queue`` and ``resources``).

Errors:

- ``before_apply`` raising refuses the ``apply`` call in the same way (nothing is published).
- ``before_enqueue`` raising refuses the whole enqueue call (all messages of an
  ``enqueue_many``): a :class:`~blitzq.BlitzQError` (such as :class:`EnqueueRefused`)
  propagates as it is, any other exception is wrapped in :class:`EnqueueRefused` naming the
  middleware and the task.
- ``before_execute`` raising fails the attempt with that exception without running the task
  body (the retry policy applies; ``on_error`` hooks run as for any failure).
- ``on_worker_start`` raising fails the worker's start (nothing is fetched).
- ``after_enqueue``, ``after_apply``, ``after_execute``, ``on_error``, ``on_retry``,
  ``on_failure`` and ``on_worker_stop`` raising is logged (logger ``blitzq.middleware``) and
  changes nothing: the enqueue succeeds, the worker goes on; ``on_signal`` raising likewise
  (logger ``blitzq.signals``).

Signals: every signal blitzq emits (:mod:`blitzq.extensions.signals`) goes through the
middleware chain: the ``on_signal`` hook of each middleware that observes it, in
registration order, then the handlers of ``@queue.on(signal)``, which is sugar over one
built-in middleware (:class:`~blitzq.extensions.signals.SignalHandlers`). The event carries
what the other hooks do not: the worker's id, the physical queue, the stored error's type
and message, a retry's delay, the signal's ``extra`` fields. When and how it is called
(awaited, or at once for a plain ``def`` from synchronous emit sites) is as for a
``queue.on`` handler of the same signal; a middleware that does not override ``on_signal``
costs nothing there.

Every run whose before-execute hooks ran ends with exactly one call of either ``after_execute``
(success) or ``on_error`` (failure, timeout, cancellation, or being put back on the queue at
worker shutdown).

Sync tasks (``executor="thread"``, ``"process"`` or ``"cpu"``): ``before_execute`` runs on the
worker's event loop, as a coroutine, before the call is submitted to the thread, process or CPU
pool; the
after-hooks run on the loop too, after the call returned. After-hooks and signal handlers run
after the run's completion was handed to the writer, concurrently with it: they never delay
the acknowledgement, and cannot change the stored result.

A Queue without middleware and signal observers pays nothing: the worker checks one boolean
per run.

Per-task options: a middleware declares the options of ``@queue.task(...)`` it handles in
:attr:`Middleware.task_options` (name → :class:`~blitzq.options.Option`: default and check),
built-in or registered with ``queue.add_middleware`` before the task;
:func:`blitzq.options.build_options` checks each value once with the declaring middleware's
check and rejects an option nobody declares (:class:`~blitzq.ConfigurationError`), and
:meth:`Middleware.setup_task` then plugs the middleware into each task that uses it. The
built-in middleware (:mod:`blitzq.extensions.ratelimit`, :mod:`~blitzq.extensions.expiry`,
:mod:`~blitzq.extensions.locks`, :mod:`~blitzq.extensions.unique`) work this way, through
the per-task extension points below and the narrow :class:`WorkerContext` the worker exposes
(see docs/architecture.md, "Adding a per-task option"):

- **start checks** (``task.checks``, :class:`StartCheck`): awaited before a task starts; one
  returns ``None`` to let it start, or a completion that ends this delivery instead (e.g.
  :meth:`WorkerContext.reschedule`: back on the schedule, no attempt spent, no slot held);
- **finishers** (``task.finishers``, :class:`Finisher`): called with every completion of the
  task before it is written; one may add atomic operations (``Completion.ops``);
- **batch hooks** (:meth:`Middleware.before_publish` / :meth:`~Middleware.after_publish`):
  see a batch of :class:`Outgoing` messages before / after it is published (the
  ``queue.enqueue_filters`` / ``enqueue_observers`` lists are sugar over them: a built-in
  middleware, :class:`~blitzq.extensions.lifecycle.EnqueueLists`, runs them).

A task or queue without any of these pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from ..exceptions import BlitzQError

if TYPE_CHECKING:
    from ..broker import Broker, Completion
    from ..context import TaskContext
    from ..dependencies import Resources
    from ..options import Option, TaskOptions
    from ..seams import QueueSettings
    from ..serialization import Envelope
    from ..task import Task
    from ..worker.execution import Job
    from .signal_events import Signal, SignalEvent


class EnqueueRefused(BlitzQError):
    """A before-enqueue middleware hook refused the enqueue; nothing was published.

    Raise it (or any exception) from :meth:`Middleware.before_enqueue` to refuse.
    """


@dataclass(slots=True)
class Outgoing:
    """One message about to be published.

    Attributes:
        envelope: the decoded message.
        data: its encoded bytes (re-encode with ``encode_envelope`` after changing
            ``envelope``).
        due: Unix time it becomes due by the producer's clock (an estimate for filters and
            observers), or ``None`` for now. What decides is the broker's clock: see
            ``delay``.
        task: the registered task, or ``None`` for ``queue.send`` of an unknown name.
        existing_id: set by a ``before_publish`` hook (an enqueue filter) to the id of an
            existing task this one duplicates; the message is then not published and the
            caller's handle points at that task.
        delay: for a ``delay=``, its seconds, sent as such so that the broker adds them to
            its own clock; ``None`` for an absolute ``eta=`` (``due``), which the broker
            compares with its clock as given.
        unique: set by the built-in ``unique`` enqueue filter: the message's unique key
            (``<task>:<unique key>``) and the seconds it is held at most. The producer then
            claims the key and writes the message in one broker step
            (``Broker.enqueue_unique``), and sets ``existing_id`` when another task holds it.
    """

    envelope: Envelope
    data: bytes
    due: float | None
    task: Task[Any, Any] | None
    existing_id: str | None = None
    delay: float | None = None
    unique: tuple[str, float] | None = None


@dataclass(slots=True)
class OutgoingWorkflow:
    """A workflow ``queue.apply`` is about to start.

    Attributes:
        workflow_id: the workflow's id (the correlation id of every step).
        queue: name of the Queue applying it.
        steps: the messages of the steps the start publishes (the first step of a chain, every
            member of a group), as built, without ``headers``; read-only.
        headers: headers written into every one of those messages; a before-apply hook may
            add to it (plain values, ``str`` keys).
    """

    workflow_id: str
    queue: str
    steps: tuple[Envelope, ...]
    headers: dict[str, Any] = field(default_factory=dict)


#: What happened to a run, as the worker's middleware and signals see it.
OutcomeKind = Literal["succeeded", "failed", "dead_lettered", "retried", "cancelled", "requeued"]
#: The outcomes of a run after which the task never runs again because it failed.
FailureKind = Literal["failed", "dead_lettered"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one run, handed by the worker to the after-hooks and signals.

    Attributes:
        kind: what the completion written for the run means.
        error: the run's exception when the worker has it, else ``None`` (the hooks then get
            an exception made from ``error_type`` and ``error_message``).
        error_type: qualified type name of the error as stored in the record, or ``None``.
        error_message: the error's message as stored, or ``None``.
        delay: seconds until the retry of a ``"retried"`` run, else ``None``.
    """

    kind: OutcomeKind
    error: BaseException | None = None
    error_type: str | None = None
    error_message: str | None = None
    delay: float | None = None


class WorkerContext(Protocol):
    """What a worker exposes to middleware on its side (start checks, finishers); the
    runner implements it. Nothing else of the worker is theirs to reach.

    Attributes:
        worker_id: id of the worker (written in records).
        broker: the worker's broker (lock, rate and unique operations).
        result_ttl: seconds task records live.
        visibility_timeout: seconds a delivery's lease lasts (the default lock lease).
    """

    @property
    def worker_id(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def result_ttl(self) -> int: ...

    @property
    def visibility_timeout(self) -> float: ...

    def reschedule(self, job: Job, delay: float, reserved: bool | None = None) -> Completion:
        """Completion putting ``job`` back on the schedule for ``delay`` seconds, unstarted
        (attempt unchanged, no slot held while it waits)."""
        ...

    def write(self, completion: Completion) -> None:
        """Hand ``completion`` to the worker's writer (written with the next group commit)."""
        ...


class RunningWorker(Protocol):
    """What a worker-lifecycle hook sees of the worker (a :class:`~blitzq.Worker`, or the
    eager test mode's)."""

    @property
    def id(self) -> str:
        """The worker's id."""
        ...

    @property
    def queue(self) -> QueueSettings:
        """Its Queue's settings and broker."""
        ...

    @property
    def resources(self) -> Resources:
        """Its per-worker resources (the lifespans' values, ``Depends()``)."""
        ...


class StartCheck(Protocol):
    """A coroutine awaited before a task starts: ``None`` to let it start, else the
    completion that ends this delivery instead."""

    async def __call__(self, worker: WorkerContext, job: Job) -> Completion | None: ...


class Finisher(Protocol):
    """Called with each completion of a task before it is written.

    Args:
        job: the delivery that ended.
        completion: what will be written.
        final: whether the task reached a final state (succeeded, failed, dead-lettered,
            cancelled) rather than a retry, a requeue or a reschedule.
        error: the exception of a failed attempt, else ``None``.
    """

    def __call__(
        self, job: Job, completion: Completion, final: bool, error: BaseException | None
    ) -> Completion: ...


class EnqueueFilter(Protocol):
    """A coroutine that sees each batch before it is published; it may raise to refuse the
    enqueue, or set ``Outgoing.existing_id`` to mark a duplicate."""

    async def __call__(self, queue: QueueSettings, batch: list[Outgoing]) -> None: ...


class EnqueueObserver(Protocol):
    """Called with each batch that was published (duplicates left out)."""

    async def __call__(self, queue: QueueSettings, batch: list[Outgoing]) -> None: ...


class Middleware:
    """Base class of middleware; every hook does nothing unless overridden.

    See the module docstring for when each hook runs, their order and error handling.

    Attributes:
        task_options: the per-task options (of ``@queue.task``) this middleware handles:
            name → :class:`~blitzq.options.Option` (default and check). Declared once on the
            class; see :func:`blitzq.options.build_options`. ``@queue.task`` accepts those of
            the built-in middleware (:func:`blitzq.extensions.builtin_middleware`, named in
            its signature) and those of the middleware registered with
            ``queue.add_middleware`` before it (through its ``**options``).
        call_options: the per-call options (of ``task.options(...)``, ``enqueue_many``'s
            per-item options and ``queue.send``) this middleware handles: name →
            :class:`~blitzq.options.Option` (its check; the default is unused: an option not
            given is absent). A value given travels in the message's generic ``options``
            field; the middleware reads it back as ``job.envelope.options[name]`` (``options``
            is ``None`` when the call has none). Declared once on the class, like
            ``task_options``; nothing else changes for a new one.
        observes: the signals whose events :meth:`on_signal` receives; ``None`` (the
            default): every signal. Ignored unless ``on_signal`` is overridden. Naming them
            keeps the others free: nothing is built for a signal nobody observes (the
            workflow-end signals read the workflow's state back).
    """

    task_options: ClassVar[Mapping[str, Option]] = {}
    call_options: ClassVar[Mapping[str, Option]] = {}
    observes: ClassVar[Collection[Signal] | None] = None

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Called once per registered task with its checked options: plug this
        middleware's start checks and finishers into the tasks that use its options.

        A middleware registered with ``queue.add_middleware`` gets this call for each task of
        that Queue: at its registration for the tasks registered after it, and at
        ``add_middleware`` (with its options' defaults) for those registered before.

        Args:
            task: the task being registered (``task.checks``, ``task.finishers``,
                ``task.owner.enqueue_filters`` may be extended).
            options: the task's options; ``options.get(name)`` for this middleware's own.

        Raises:
            ConfigurationError: an option value that does not fit the task.
        """

    async def on_worker_start(self, worker: RunningWorker) -> None:
        """Once when a worker starts, before it fetches anything (after the Queue's startup
        hooks and lifespans); the place to open what the middleware needs per worker.

        Raises:
            Exception: anything raised fails the worker's start.
        """

    async def on_worker_stop(self, worker: RunningWorker) -> None:
        """Once when a worker stops, after its runs ended and their completions were
        written (before the Queue's shutdown hooks and lifespans' close); errors are
        logged."""

    async def on_signal(self, event: SignalEvent) -> None:
        """Called with the event of each signal in :attr:`observes` (every signal when
        ``None``), wherever it is emitted: producer, worker or scheduler, as the
        ``queue.on`` handlers of that signal are and just before them (see the module
        docstring). ``event.signal`` says which; the table of ``docs/middleware-signals.md``
        says when each fires and what its event carries. Errors are logged (logger
        ``blitzq.signals``), never raised to the emitter.

        Args:
            event: the :class:`~blitzq.SignalEvent`.
        """

    def signal_handlers(
        self, signal: Signal
    ) -> Sequence[Callable[[SignalEvent], Awaitable[None] | None]]:
        """The callables this middleware contributes to ``signal``'s observers when the
        registry builds the signal table (at each registration, never per event): its
        bound :meth:`on_signal` when overridden and ``signal`` is observed, else none. The
        built-in :class:`~blitzq.extensions.signals.SignalHandlers` returns the
        ``queue.on`` handlers instead; other middleware override :meth:`on_signal`.

        Args:
            signal: the :class:`~blitzq.Signal`.
        """
        if type(self).on_signal is Middleware.on_signal:
            return ()
        observes = self.observes
        if observes is not None and signal not in observes:
            return ()
        return (self.on_signal,)

    async def before_enqueue(self, message: Outgoing) -> None:
        """Before ``message`` is published; raise to refuse the enqueue.

        Args:
            message: the outgoing message (``message.envelope`` may be replaced).
        """

    async def after_enqueue(self, message: Outgoing) -> None:
        """After ``message`` was published (errors are logged, not raised)."""

    async def before_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Once per batch about to be published (one enqueue, an ``enqueue_many``, a
        ``send_many``), after every ``before_enqueue`` hook; raise to refuse the whole batch
        (as for ``before_enqueue``), or set ``Outgoing.existing_id`` on a message to mark it
        a duplicate of that task (it is then not published). One round trip for the batch:
        the built-in ``unique`` claim works this way.

        Args:
            queue: the Queue's settings and broker.
            batch: the messages, in the caller's order.
        """

    async def after_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Once per batch after it was published (duplicates left out), after every
        ``after_enqueue`` hook; errors propagate to the caller (the messages are
        published)."""

    async def before_apply(self, workflow: OutgoingWorkflow) -> None:
        """Before ``queue.apply`` publishes ``workflow``'s first steps; raise to refuse it.

        Args:
            workflow: the workflow (``workflow.headers`` may be added to).
        """

    async def after_apply(self, workflow: OutgoingWorkflow) -> None:
        """After ``workflow``'s first steps were published (errors are logged, not raised)."""

    async def before_execute(self, context: TaskContext) -> None:
        """Before the task body runs; raising fails the attempt with that exception.

        Args:
            context: the run's :class:`~blitzq.TaskContext` (id, task name, queue, attempt,
                headers).
        """

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        """After a successful run that returned ``result`` (errors are logged)."""

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        """After a failed run (each attempt), with the exception (errors are logged).

        ``exc`` is the task's exception; a :class:`~blitzq.TaskTimeout` for a timeout, a
        :class:`~blitzq.TaskCancelled` for a cancellation, ``asyncio.CancelledError`` for a
        run put back on its queue at shutdown, or a :class:`~blitzq.TaskFailed` describing
        the stored error when the exception object is not available.
        """

    async def on_retry(self, context: TaskContext, exc: BaseException, delay: float) -> None:
        """After :meth:`on_error` when the task will run again in ``delay`` seconds."""

    async def on_failure(self, context: TaskContext, exc: BaseException, kind: FailureKind) -> None:
        """After :meth:`on_error` when the task failed for good: its retries are spent, the
        retry policy or the error ruled a retry out, or its last attempt timed out; the
        place for alerts (:mod:`blitzq.integrations.sentry` reports from here). Not called
        for a retry, a cancellation, or a run put back on its queue at shutdown.

        Args:
            context: the last run's :class:`~blitzq.TaskContext`.
            exc: as for :meth:`on_error` (a :class:`~blitzq.Retry` raised past the last
                attempt keeps its cause in ``__cause__``).
            kind: ``"failed"`` (a ``failed`` record), or ``"dead_lettered"`` (the task has
                ``dead_letter=True``: its message went to the dead letters too).
        """


__all__ = [
    "EnqueueFilter",
    "EnqueueObserver",
    "EnqueueRefused",
    "FailureKind",
    "Finisher",
    "Middleware",
    "Outcome",
    "Outgoing",
    "OutgoingWorkflow",
    "RunningWorker",
    "StartCheck",
    "WorkerContext",
]
