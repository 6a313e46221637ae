"""Registered tasks, per-call options and handles.

``@queue.task`` turns a function into a :class:`Task`, typed with ``ParamSpec`` so that
``enqueue(*args, **kwargs)`` is checked against the function's own signature. Per-call options
go through :meth:`Task.options`, so they never collide with the task's argument names.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import math
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar

from ._checks import flag, integer, seconds, text
from .client.sync import blocking
from .exceptions import ConfigurationError
from .limits import MAX_SECONDS
from .records import TaskRecord
from .retries import RetryPolicy
from .routing import check_name, check_priority

if TYPE_CHECKING:
    from .client.sync import Portal
    from .extensions.middleware import Finisher, StartCheck
    from .options import TaskOptions
    from .queue import Queue
    from .ratelimit import RateLimit
    from .workflow.signature import Signature

P = ParamSpec("P")
R = TypeVar("R")

Executor = Literal["async", "thread", "process"]
EXECUTORS: frozenset[str] = frozenset({"async", "thread", "process"})


def default_task_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function; a script run as ``__main__`` uses its file stem.

    So that a producer script and a worker importing the same file agree on the name.
    """
    module = fn.__module__
    if module in ("__main__", "__mp_main__"):
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
        else:
            path = getattr(main, "__file__", None)
            if path:
                module = path.rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{fn.__qualname__}"


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Options of one enqueue, bound with :meth:`Task.options`.

    Every option is checked when the options are made (ConfigurationError): numbers must be
    real numbers (not ``bool``), finite, and durations at most ``MAX_SECONDS`` (10 years);
    strings must be non-empty ``str``.

    Attributes:
        delay: seconds from now before the task may start (``countdown`` in Celery),
            0 to 10 years.
        eta: absolute start time (aware datetime, or Unix seconds), at most 10 years ahead
            (checked at enqueue; a past eta runs at once).
        task_id: id to use instead of a random one.
        headers: plain-data metadata carried with the message.
        timeout: seconds the task may run, overriding the task's ``timeout``.
        queue: queue to publish to, overriding the task's.
        correlation_id: id shared by related tasks, a non-empty ``str`` (default: inherited
            from the task that enqueues, if any).
        priority: ``"high"``, ``"normal"`` or ``"low"``, overriding the task's.
        unique_key: key of a ``unique=True`` task's call instead of the hash of its arguments.
        max_age: seconds the call may wait before it starts, overriding the task's
            ``max_age`` (see :mod:`blitzq.extensions.expiry`).
    """

    delay: float | None = None
    eta: _dt.datetime | float | None = None
    task_id: str | None = None
    headers: Mapping[str, Any] | None = None
    timeout: float | None = None
    queue: str | None = None
    correlation_id: str | None = None
    priority: str | None = None
    unique_key: str | None = None
    max_age: float | None = None

    def __post_init__(self) -> None:
        # Every option is checked here, where it enters (not in a worker's loop later):
        # numbers are real (not bool), finite and within MAX_SECONDS; strings are str.
        if self.delay is not None:
            seconds("delay", self.delay, strict=False)
        if (
            self.eta is not None
            and not isinstance(self.eta, _dt.datetime)
            and (isinstance(self.eta, bool) or not _finite(self.eta))
        ):
            raise ConfigurationError(
                f"eta must be an aware datetime or a finite Unix time, got {self.eta!r}"
            )
        if self.timeout is not None:
            seconds("timeout", self.timeout)
        if self.task_id is not None:
            check_name("task_id", self.task_id)
        if self.queue is not None:
            check_name("queue", self.queue)
        if self.priority is not None:
            check_priority(self.priority)
        text("unique_key", self.unique_key)
        text("correlation_id", self.correlation_id)
        if self.headers is not None and not isinstance(self.headers, Mapping):
            raise ConfigurationError(
                f"headers must be a dict with str keys, got {type(self.headers).__name__}"
            )
        if self.max_age is not None:
            seconds("max_age", self.max_age)

    def due_time(self, now: float) -> float | None:
        """Unix time the message becomes due by the clock that gave ``now``, or ``None`` to
        publish at once.

        A ``delay`` gives ``now + delay`` (the broker receives the delay itself and counts
        it on its own clock; see :meth:`relative_delay`). An ``eta`` is returned as is, even
        when it looks past by ``now``: the broker compares it with its own clock.

        Raises:
            ConfigurationError: a naive datetime, an eta more than ``MAX_SECONDS`` (10
                years) ahead, or both delay and eta.
        """
        if self.delay is not None and self.eta is not None:
            raise ConfigurationError("give delay= or eta=, not both")
        if self.delay is not None:
            return now + self.delay if self.delay > 0 else None
        if self.eta is None:
            return None
        if isinstance(self.eta, _dt.datetime):
            if self.eta.tzinfo is None:
                raise ConfigurationError("eta must be a timezone-aware datetime")
            due = self.eta.timestamp()
        else:
            due = float(self.eta)
        if due - now > MAX_SECONDS:
            raise ConfigurationError(
                f"eta must be at most {MAX_SECONDS} s (10 years) ahead, got {self.eta!r}"
            )
        return due

    def relative_delay(self) -> float | None:
        """Seconds of ``delay`` to send the broker, or ``None`` for none or an ``eta``."""
        return self.delay if self.delay is not None and self.delay > 0 else None


class Task(Generic[P, R]):
    """A function registered with a :class:`~blitzq.Queue`.

    Calling the task object runs the function directly, in-process; ``enqueue`` sends it to
    a worker. Made by ``@queue.task``; see :meth:`blitzq.Queue.task` for the options.
    """

    def __init__(
        self,
        owner: Queue,
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
        self.owner = owner
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retry_policy.max_retries if retry_policy.max_retries is not None else retries
        self.retry_policy = retry_policy
        self.timeout = timeout
        self.executor: Executor = executor
        self.store_result = store_result
        self.dead_letter = dead_letter
        self.priority = check_priority(priority)
        #: Its rate limit (keyed), set by :mod:`blitzq.extensions.ratelimit`, or ``None``.
        self.rate_limit: RateLimit | None = None
        self.signature = inspect.signature(fn)
        #: Coroutines awaited before each start (see :mod:`blitzq.extensions.middleware`).
        self.checks: list[StartCheck] = []
        #: Called with each completion before it is written (same).
        self.finishers: list[Finisher] = []
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        from .extensions import builtin_middleware
        from .options import build_options

        builtins = builtin_middleware()
        if options is None:
            options = build_options(name, {}, builtins)
        if options.hard_timeout is not None:
            if self.timeout is not None and self.timeout != options.hard_timeout:
                raise ConfigurationError(f"task {name}: give timeout= or hard_timeout=, not both")
            self.timeout = options.hard_timeout
        if options.soft_timeout is not None and executor == "process":
            raise ConfigurationError(
                f"task {name}: soft_timeout is not supported for process tasks (use hard_timeout)"
            )
        #: The task's options, checked (see :mod:`blitzq.options`); the middleware-declared
        #: ones read as ``task.controls.get("max_age")``.
        self.controls = options
        for middleware in builtins:  # each plugs in where the task uses its options
            middleware.setup_task(self, options)

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
        delay: float | None = None,
        eta: _dt.datetime | float | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        queue: str | None = None,
        correlation_id: str | None = None,
        priority: str | None = None,
        unique_key: str | None = None,
        max_age: float | None = None,
    ) -> BoundTask[P, R]:
        """Bind per-call options; see :class:`CallOptions` for each (seconds for times).

        Raises:
            ConfigurationError: an invalid value (a bool or non-finite number, a duration over
                10 years, a non-``str`` id, ``headers`` that are not a mapping, an unknown
                priority).
        """
        return BoundTask(
            self,
            CallOptions(
                delay, eta, task_id, headers, timeout, queue, correlation_id, priority,
                unique_key=unique_key, max_age=max_age,
            ),
        )  # fmt: skip

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self.owner._producer.portal

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Send one call to the queue; returns at once with a handle.

        Raises:
            SerializationError: an argument is not plain data.
            MessageTooLarge: the encoded message is over the queue's limit.
            BrokerError: the broker could not be reached.
        """
        return await self.owner._producer.enqueue(self, args, kwargs, _NO_OPTIONS)

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
        return await self.owner._producer.enqueue_many(self, calls, _NO_OPTIONS)

    enqueue_many_sync = blocking(enqueue_many)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A workflow step calling this task; in a chain the previous step's result is
        prepended to ``args`` (see :mod:`blitzq.workflow`).

        Raises:
            SerializationError: an argument is not plain data.
        """
        from .workflow.signature import Signature

        return Signature(self.name, args, kwargs, queue=self.queue, priority=self.priority)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable workflow step: like :meth:`s`, but it ignores the previous result."""
        from .workflow.signature import Signature

        return Signature(
            self.name, args, kwargs, immutable=True, queue=self.queue, priority=self.priority
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
        try:
            options = replace(self.call_options, **changes)
        except TypeError as exc:  # an unknown option name
            raise ConfigurationError(f"unknown call option: {exc}") from None
        return BoundTask(self.task, options)

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self.task.owner._producer.portal

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """:meth:`Task.enqueue` with the bound options."""
        return await self.task.owner._producer.enqueue(self.task, args, kwargs, self.call_options)

    enqueue_sync = blocking(enqueue)  # type: ignore[arg-type]  # as Task.enqueue_sync

    async def enqueue_many(
        self, calls: Iterable[tuple[Any, ...] | tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[TaskHandle[R]]:
        """:meth:`Task.enqueue_many` with the bound options (``task_id`` is not allowed)."""
        return await self.task.owner._producer.enqueue_many(self.task, calls, self.call_options)

    enqueue_many_sync = blocking(enqueue_many)


class TaskHandle(Generic[R]):
    """What an enqueue returns: the task's id and queue, and ways to follow it.

    Attributes:
        id: the task id.
        queue: the physical queue it was published to.
        task: the task name.
        duplicate: ``True`` when nothing was published because the call duplicated a task
            that already exists (``id`` is that task's id; see unique tasks).
        stores_result: whether the task stores its return value (``False``:
            ``store_result=False``, so :meth:`result` raises
            :class:`~blitzq.ResultNotStored` at once); ``None`` when unknown (a handle made
            from an id, or ``queue.send`` of a task this process has not registered).
    """

    __slots__ = ("_owner", "duplicate", "id", "queue", "stores_result", "task")

    def __init__(
        self,
        owner: Queue,
        task_id: str,
        queue: str,
        task: str,
        duplicate: bool = False,
        stores_result: bool | None = None,
    ) -> None:
        self._owner = owner
        self.id = task_id
        self.queue = queue
        self.task = task
        self.duplicate = duplicate
        self.stores_result = stores_result

    def __repr__(self) -> str:
        return f"<TaskHandle {self.task} id={self.id} queue={self.queue}>"

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self._owner._producer.portal

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the task's result.

        Args:
            timeout: seconds to wait; ``None`` waits without limit.

        Raises:
            TaskFailed: the task ended failed or dead-lettered.
            ResultNotStored: the task does not store its result (``store_result=False``):
                raised at once, without waiting (a failure already recorded raises
                TaskFailed instead).
            ResultTimeout: no final record within ``timeout``.
        """
        if self.stores_result is False:
            value: R = await self._owner._results.no_stored_result(self.id)
            return value
        value = await self._owner.get_result(self.id, timeout=timeout)
        return value

    result_sync = blocking(result)

    async def cancel(self) -> str:
        """Cancel the task; see :meth:`blitzq.Queue.cancel` for what happens and the answer."""
        return await self._owner.cancel(self.id)

    cancel_sync = blocking(cancel)

    async def status(self) -> TaskRecord | None:
        """The task's record, or ``None`` when none is stored (queued, or expired)."""
        return await self._owner.inspect(self.id)

    status_sync = blocking(status)


def now() -> float:
    """Unix time in seconds (one place, so tests can see what the code uses)."""
    return time.time()
