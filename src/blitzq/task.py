"""Registered tasks and tasks with per-call options bound.

``@queue.task`` (:mod:`blitzq.registration`) turns a function into a :class:`Task`, typed with
``ParamSpec`` so that ``enqueue(*args, **kwargs)`` is checked against the function's own
signature. Per-call options go through :meth:`Task.options` (a :class:`BoundTask`), so they
never collide with the task's argument names. The per-call options themselves are
:class:`~blitzq.options.CallOptions` and what an enqueue returns is a
:class:`~blitzq.handle.TaskHandle`; both are re-exported here.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from ._checks import flag, integer, seconds, text
from .arguments import TypedCall
from .client.sync import blocking
from .dependencies import injected_parameters, refuse_given
from .exceptions import ConfigurationError
from .handle import TaskHandle
from .options import CallOptions, call_options
from .ratelimit import RateLimit
from .retries import RetryPolicy
from .routing import check_priority

if TYPE_CHECKING:
    from .broker import Completion
    from .client.sync import Portal
    from .options import Option, TaskOptions
    from .ratelimit import RateLimit
    from .seams import QueueSettings
    from .workflow.canvas import Signature

P = ParamSpec("P")
R = TypeVar("R")
#: The parameters of a task after its first (a chained step's previous result fills it).
Q = ParamSpec("Q")

Executor = Literal["async", "thread", "process", "cpu"]
EXECUTORS: frozenset[str] = frozenset({"async", "thread", "process", "cpu"})

#: A start check (:class:`blitzq.extensions.middleware.StartCheck`): awaited with the worker's
#: context and the job before a run starts.
StartCheck = Callable[..., Awaitable["Completion | None"]]
#: A finisher (:class:`blitzq.extensions.middleware.Finisher`): called with each completion.
Finisher = Callable[..., "Completion"]


def _seconds(value: float | _dt.timedelta | None) -> float | None:
    """A ``timedelta`` as its seconds (checked with the numbers by :class:`CallOptions`)."""
    return value.total_seconds() if isinstance(value, _dt.timedelta) else value


class TaskProducer(Protocol):
    """What a task sends its calls through: its Queue's producer
    (:class:`blitzq.client.publish.Producer`)."""

    @property
    def portal(self) -> Portal:
        """The sync-API loop the ``*_sync`` twins run on."""
        ...

    async def enqueue(
        self, task: Task[Any, Any], args: Any, kwargs: dict[str, Any], opts: CallOptions
    ) -> TaskHandle[Any]:
        """Publish one call of ``task``."""
        ...

    async def enqueue_many(
        self, task: Task[Any, Any], calls: Iterable[Any], opts: CallOptions
    ) -> list[TaskHandle[Any]]:
        """Publish many calls of ``task`` in one round trip."""
        ...


class TaskPlugin(Protocol):
    """What a task reads of a middleware while it is made: the per-task options it declares
    and its :meth:`~blitzq.Middleware.setup_task` (a :class:`~blitzq.Middleware` is one)."""

    @property
    def task_options(self) -> Mapping[str, Option]:
        """Option name → its :class:`~blitzq.options.Option`."""
        ...

    @property
    def call_options(self) -> Mapping[str, Option]:
        """Per-call option name → its :class:`~blitzq.options.Option`."""
        ...

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Plug into ``task`` where it uses the middleware's options."""
        ...


class Task(Generic[P, R]):
    """A function registered with a :class:`~blitzq.Queue`.

    Calling the task object runs the function directly, in-process; ``enqueue`` sends it to
    a worker. Made by ``@queue.task``; see :meth:`blitzq.Queue.task` for the options.
    """

    def __init__(
        self,
        owner: QueueSettings,
        fn: Callable[P, R] | Callable[P, Awaitable[R]],
        *,
        name: str,
        queue: str,
        retries: int,
        retry_policy: RetryPolicy,
        timeout: float | None,
        executor: Executor,
        store_result: bool | None,
        dead_letter: bool,
        priority: str = "normal",
        options: TaskOptions | None = None,
        middleware: tuple[TaskPlugin, ...] | None = None,
        producer: TaskProducer,
    ) -> None:
        if executor not in EXECUTORS:
            raise ConfigurationError(f"executor must be one of {sorted(EXECUTORS)}")
        is_async = inspect.iscoroutinefunction(fn)
        if executor == "async" and not is_async:
            raise ConfigurationError(f"task {name}: executor='async' needs an async function")
        if executor != "async" and is_async:
            raise ConfigurationError(f"task {name}: an async function runs with executor='async'")
        text("task name", name, optional=False)
        integer(f"task {name}: retries", retries, minimum=0)
        flag(f"task {name}: dead_letter", dead_letter)
        if store_result is not None:
            flag(f"task {name}: store_result", store_result)
        if timeout is not None:
            timeout = seconds(f"task {name}: timeout", timeout)
        #: The Queue's settings and broker (a narrow view: :class:`blitzq.seams.QueueSettings`).
        self.owner = owner
        #: What its calls are sent through (its Queue's producer).
        self.producer = producer
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retry_policy.max_retries if retry_policy.max_retries is not None else retries
        self.retry_policy = retry_policy
        self.timeout = timeout
        self.executor: Executor = executor
        #: Whether ``executor`` was chosen by the task's author (``False``: the default, which
        #: ``blitzq worker --pool cpu`` may move to the CPU pool).
        self.executor_given = True
        self.store_result = store_result
        self.dead_letter = dead_letter
        self.priority = check_priority(priority)
        #: Its rate limit (keyed), set by :mod:`blitzq.extensions.ratelimit`, or ``None``.
        self.rate_limit: RateLimit | None = None
        self.signature = inspect.signature(fn)
        #: Parameters the worker fills with its resources (``Depends()``), by name: their
        #: types (see :mod:`blitzq.dependencies`).
        self.injected = injected_parameters(fn)
        if self.injected and executor in ("process", "cpu"):
            raise ConfigurationError(
                f"task {name}: a {executor} task cannot take Depends() parameters (resources "
                "live in the worker's process)"
            )
        #: How rich annotated arguments and results travel, or ``None`` (plain data only;
        #: see :mod:`blitzq.arguments`).
        self.arguments = TypedCall.of(fn, skip=self.injected)
        #: Whether a call needs more than the message's arguments (conversion, resources).
        self.prepared_call = self.arguments is not None or bool(self.injected)
        #: Coroutines awaited before each start (see :mod:`blitzq.extensions.middleware`).
        self.checks: list[StartCheck] = []
        #: Called with each completion before it is written (same).
        self.finishers: list[Finisher] = []
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        from .extensions import builtin_middleware
        from .options import build_options, declared_call_options

        if middleware is None:  # the built-in ones (registration passes the Queue's too)
            middleware = tuple(builtin_middleware())
        if options is None:
            options = build_options(name, {}, middleware)
        if options.hard_timeout is not None:
            if self.timeout is not None and self.timeout != options.hard_timeout:
                raise ConfigurationError(f"task {name}: give timeout= or hard_timeout=, not both")
            self.timeout = options.hard_timeout
        if options.soft_timeout is not None and executor in ("process", "cpu"):
            raise ConfigurationError(
                f"task {name}: soft_timeout is not supported for {executor} tasks "
                "(use hard_timeout)"
            )
        soft = options.soft_timeout
        if soft is not None and self.timeout is not None and soft >= self.timeout:
            raise ConfigurationError(
                f"task {name}: soft_timeout ({soft:g} s) must be shorter than the hard timeout "
                f"({self.timeout:g} s): the hard timeout would end the run first, and the soft "
                "one never fire"
            )
        #: The task's options, checked (see :mod:`blitzq.options`); the middleware-declared
        #: ones read as ``task.controls.get("max_age")``.
        self.controls = options
        #: Whether its messages travel the fast path (``@queue.task(mode="fast")``).
        self.fast = options.mode == "fast"
        #: The per-call options its middleware declare (``Middleware.call_options``), by
        #: name: what :meth:`options` accepts besides the core ones.
        self.call_controls: dict[str, Option] = declared_call_options(middleware)
        for m in middleware:  # each plugs in where the task uses its options
            m.setup_task(self, options)

    def call_arguments(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The arguments of one call as they go into its message: rich values as plain data
        (:mod:`blitzq.arguments`); none for a ``Depends()`` parameter.

        Raises:
            ConfigurationError: a value is given for a ``Depends()`` parameter.
            SerializationError: a rich value cannot be encoded.
        """
        if self.injected:
            refuse_given(self.name, self.injected, self.signature, args, kwargs)
        if self.arguments is None:
            return args, kwargs
        return self.arguments.encode(args, kwargs)

    @property
    def max_attempts(self) -> int:
        """Attempts in all: the first one plus ``retries``."""
        return self.retries + 1

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R | Awaitable[R]:
        """Run the function directly in this process (no queue involved)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue} executor={self.executor}>"

    def options(
        self,
        *,
        delay: float | _dt.timedelta | None = None,
        eta: _dt.datetime | float | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        timeout: float | _dt.timedelta | None = None,
        queue: str | None = None,
        correlation_id: str | None = None,
        priority: str | None = None,
        unique_key: str | None = None,
        max_age: float | _dt.timedelta | None = None,
        **options: Any,
    ) -> BoundTask[P, R]:
        """Bind per-call options; see :class:`CallOptions` for each (seconds for times;
        ``delay``, ``timeout`` and ``max_age`` also take a ``timedelta``, checked as its
        seconds: a negative one is refused as a negative number is).

        ``max_age`` (:mod:`blitzq.extensions.expiry`) and ``options`` are the per-call
        options middleware declare (``Middleware.call_options``; ``max_age`` is named here
        for type checkers); they travel in the message's ``options`` field.

        Raises:
            ConfigurationError: an invalid value (a bool or non-finite number, a duration over
                10 years, a negative ``delay`` or ``eta``, a non-``str`` id, ``headers`` that
                are not a mapping, an unknown priority), or an option no middleware of the
                task declares.
        """
        core = CallOptions(
            _seconds(delay),
            eta,
            task_id,
            headers,
            _seconds(timeout),
            queue,
            correlation_id,
            priority,
            unique_key,
        )
        declared = {"max_age": max_age, **options}
        if all(value is None for value in declared.values()):
            return BoundTask(self, core)
        return BoundTask(self, call_options(declared, core, self.call_controls))

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self.producer.portal

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Send one call to the queue; returns at once with a handle.

        Raises:
            SerializationError: an argument is not plain data.
            MessageTooLarge: the encoded message is over the queue's limit.
            OutcomeUnknown: the message was sent and the reply lost, or (``unreplicated``)
                the primary has it and its replicas did not confirm it in time
                (``redis+sentinel://``, a Redis Cluster with replicas): it may or may not run.
            BrokerError: the broker could not be reached (nothing was sent).
        """
        return await self.producer.enqueue(self, args, kwargs, _NO_OPTIONS)

    # mypy flags ``self`` as a possible keyword of ``P.kwargs`` (enqueue's ``self`` is not
    # positional-only, and making it so would change the public signature); the twin's type
    # is still ``(*P.args, **P.kwargs) -> TaskHandle[R]``, checked at every call.
    enqueue_sync = blocking(enqueue)  # type: ignore[arg-type]

    async def enqueue_many(
        self, calls: Iterable[tuple[Any, ...] | tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[TaskHandle[R]]:
        """Enqueue many calls in one round-trip.

        Args:
            calls: each item is a tuple of positional arguments, or ``(args, kwargs)`` given as
                a tuple whose second element is a dict and whose first is a tuple, or
                ``(args, kwargs, options)`` with a dict of per-item call options (``delay``,
                ``task_id``, ``priority``, … as in :meth:`options`; see docs/progress-batch.md).

        Raises:
            SerializationError, MessageTooLarge: before anything is published.
        """
        return await self.producer.enqueue_many(self, calls, _NO_OPTIONS)

    enqueue_many_sync = blocking(enqueue_many)

    @overload
    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature: ...

    @overload
    def s(self: Task[Concatenate[Any, Q], Any], *args: Q.args, **kwargs: Q.kwargs) -> Signature: ...

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A workflow step calling this task; in a chain the previous step's result is
        prepended to ``args`` (see :mod:`blitzq.workflow`).

        Typed against the function: the arguments are either all of its parameters (a first
        step, a group member) or all but the first (a step after another, a chord's
        callback, whose first argument is the previous result); anything else is a type
        error, as for :meth:`enqueue`.

        Raises:
            SerializationError: an argument is not plain data.
        """
        from .workflow.canvas import Signature

        if self.arguments is None:
            return Signature(self.name, args, kwargs, queue=self.queue, priority=self.priority)
        wire_args, wire_kwargs = self.arguments.encode_step(args, kwargs)
        return Signature(
            self.name, wire_args, wire_kwargs, queue=self.queue, priority=self.priority
        )

    def si(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """An immutable workflow step: like :meth:`s`, but it ignores the previous result
        (so it takes all of the function's arguments, typed as for :meth:`enqueue`)."""
        from .workflow.canvas import Signature

        wire_args, wire_kwargs = (
            self.arguments.encode(args, kwargs) if self.arguments is not None else (args, kwargs)
        )
        return Signature(
            self.name,
            wire_args,
            wire_kwargs,
            immutable=True,
            queue=self.queue,
            priority=self.priority,
        )


_NO_OPTIONS = CallOptions()


class BoundTask(Generic[P, R]):
    """A task with per-call options bound; made by :meth:`Task.options`."""

    def __init__(self, task: Task[P, R], options: CallOptions) -> None:
        self.task = task
        self.call_options = options

    def options(self, **changes: Any) -> BoundTask[P, R]:
        """Return a copy with more options changed.

        Raises:
            ConfigurationError: an unknown option name or an invalid value.
        """
        return BoundTask(
            self.task, call_options(changes, self.call_options, self.task.call_controls)
        )

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self.task.producer.portal

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """:meth:`Task.enqueue` with the bound options."""
        return await self.task.producer.enqueue(self.task, args, kwargs, self.call_options)

    enqueue_sync = blocking(enqueue)  # type: ignore[arg-type]  # as Task.enqueue_sync

    async def enqueue_many(
        self, calls: Iterable[tuple[Any, ...] | tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[TaskHandle[R]]:
        """:meth:`Task.enqueue_many` with the bound options (``task_id`` is not allowed)."""
        return await self.task.producer.enqueue_many(self.task, calls, self.call_options)

    enqueue_many_sync = blocking(enqueue_many)


def now() -> float:
    """Unix time in seconds (one place, so tests can see what the code uses)."""
    return time.time()


__all__ = ["EXECUTORS", "BoundTask", "CallOptions", "Executor", "Task", "TaskHandle", "now"]
