"""How ``@queue.task`` makes a :class:`~blitzq.task.Task` and ``@queue.periodic`` a periodic
entry: the :class:`Registrar` a Queue holds (whose methods ``task``, ``periodic`` and
``add_periodic`` the Queue offers as its own), the default task name, and the middleware whose
per-task options a task may be given.

A task's options are checked once, when it is registered, by :func:`blitzq.options.build_options`
against the built-in middleware and those registered on the Queue at that moment
(``queue.add_middleware`` before the ``@queue.task`` line); an option nobody declares is
rejected there. A middleware added after some tasks were registered is plugged into them by
:func:`adopt_middleware`: they get its options' defaults and its ``setup_task`` call (they
could not have been given its options: registering them would have failed).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import inspect
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from .client.context import QueueContext
from .exceptions import ConfigurationError
from .extensions import builtin_middleware
from .extensions.middleware import Middleware
from .options import build_options, declared_call_options
from .ratelimit import RateLimit
from .retries import DEFAULT_RETRY_POLICY, RetryPolicy
from .routing import Priority, check_queue_name, check_task_name, route
from .task import Executor, Task, TaskProducer
from .workflow.steps import COLLECT, WORKFLOW_STEPS, collect

if TYPE_CHECKING:
    from .periodic import MissedPolicy, PeriodicTask
    from .schedules import Schedule

P = ParamSpec("P")
R = TypeVar("R")


class RegistryContext(QueueContext, Protocol):
    """A Queue as its :class:`Registrar` sees it: what its clients see
    (:class:`~blitzq.client.context.QueueContext`) and its periodic entries.

    Attributes:
        periodic_tasks: the periodic entries, by name.
    """

    periodic_tasks: dict[str, PeriodicTask]


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


class Registrar:
    """Makes the tasks and periodic entries of one Queue: ``@queue.task``, ``@queue.periodic``
    and ``queue.add_periodic`` are its methods, which the Queue offers as its own.

    Args:
        queue: the Queue (as :class:`RegistryContext`): where the tasks and entries are kept,
            and what each task sees as its ``owner``.
        producer: what the tasks send their calls through (the Queue's producer).
    """

    def __init__(self, queue: RegistryContext, producer: TaskProducer) -> None:
        self.queue = queue
        self.producer = producer

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        retries: int = 3,
        retry_policy: RetryPolicy | None = None,
        timeout: float | None = None,
        executor: Executor | None = None,
        store_result: bool | None = None,
        dead_letter: bool = True,
        priority: Priority = "normal",
        rate_limit: str | RateLimit | None = None,
        rate_key: str | None = None,
        unique: bool = False,
        unique_until: Literal["start", "completion"] = "completion",
        unique_ttl: float = 3600.0,
        lock: str | None = None,
        lock_limit: int = 1,
        lock_ttl: float | None = None,
        soft_timeout: float | None = None,
        hard_timeout: float | None = None,
        max_age: float | None = None,
        mode: Literal["fast"] | None = None,
        **options: Any,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        retries: int = 3,
        retry_policy: RetryPolicy | None = None,
        timeout: float | None = None,
        executor: Executor | None = None,
        store_result: bool | None = None,
        dead_letter: bool = True,
        priority: Priority = "normal",
        rate_limit: str | RateLimit | None = None,
        rate_key: str | None = None,
        unique: bool = False,
        unique_until: Literal["start", "completion"] = "completion",
        unique_ttl: float = 3600.0,
        lock: str | None = None,
        lock_limit: int = 1,
        lock_ttl: float | None = None,
        soft_timeout: float | None = None,
        hard_timeout: float | None = None,
        max_age: float | None = None,
        mode: Literal["fast"] | None = None,
        **options: Any,
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a function as a task; use bare (``@queue.task``) or with options.

        Args:
            name: task name workers look up (default ``module.qualname``); a non-empty str
                without spaces, braces or newlines (:func:`~blitzq.routing.check_task_name`).
            queue: queue its messages go to (default: this Queue's ``name``).
            retries: retries after a failed attempt (``retry_policy.max_retries`` wins).
            retry_policy: backoff and which errors retry; see :class:`RetryPolicy`.
            timeout: seconds one attempt may run; over it the attempt fails with TaskTimeout.
            executor: ``"async"`` (coroutines, the default for ``async def``), ``"thread"``
                (the default for plain functions), ``"process"`` (a process pool; the
                function must be importable at module level) or ``"cpu"`` (a child process
                forked from the worker's forkserver, killed alone at a hard timeout or cancel;
                importable too; POSIX only; see docs/control.md, "Executors").
            store_result: store the return value (default: the Queue's ``store_results``).
            dead_letter: dead-letter the task when its retries are exhausted (else it ends
                ``failed`` with its record only).
            priority: ``"high"``, ``"normal"`` or ``"low"``: published to ``<queue>:high``,
                ``<queue>`` or ``<queue>:low``, which workers of ``<queue>`` take in that order.
            rate_limit: ``"10/s"``, ``"100/m"``, ``"1000/hour"`` or a :class:`RateLimit`: task
                starts per period across all workers; a task over it waits on the schedule.
            rate_key: bucket name shared by several tasks (default: the task name).
            unique, unique_until, unique_ttl: a call equal to one already waiting (same
                arguments, or the same ``unique_key=`` call option) is not enqueued again
                until the first one starts (``"start"``) or ends (``"completion"``), or
                ``unique_ttl`` seconds pass; see docs/control.md.
            lock, lock_limit, lock_ttl: a key over the task's arguments (``"user:{user_id}"``)
                that at most ``lock_limit`` runs hold at once; ``lock_ttl`` seconds is the
                lease a crashed worker's place is freed after (default: the queue's
                ``visibility_timeout``).
            soft_timeout: seconds after which SoftTimeoutError is raised inside the task.
            hard_timeout: seconds after which the run is stopped (``timeout=`` is its alias).
            max_age: seconds a call may wait before it starts; older ones are expired.
            mode: ``"fast"``: fire-and-forget on a reliable Queue: the task's messages
                travel the fast path (a Redis list, at-most-once: a worker that dies while
                it runs one loses it) while the Queue's other tasks stay reliable, and the
                Queue's workers consume both. A retry, a delayed call and a requeue of it
                travel the Queue's path. ``None`` (the default): the Queue's ``mode``. On a
                fast Queue every task is fast already; with RabbitMQ or the spread layout of
                a Redis Cluster there is no fast path and the option changes nothing (the
                task is delivered at-least-once). See docs/guarantees.md.
            options: the options of middleware registered with ``queue.add_middleware`` before
                this line (each declares its own in ``Middleware.task_options``), by name; see
                docs/architecture.md, "Adding a per-task option".

        Raises:
            ConfigurationError: a bad option, an option no middleware declares, a ``name``
                :func:`~blitzq.routing.check_task_name` refuses (empty, holding a space, brace
                or newline), a second task with the same name, or the decorator applied to a
                Task (decorated twice).
        """
        # Every keyword above, by name, and the extra ones: the one place they are gathered.
        given = {k: v for k, v in locals().items() if k not in ("self", "fn", "options")}
        given.update(options)  # no overlap: Python refuses a keyword given twice

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            if isinstance(function, Task):  # @queue.task twice: it has no __qualname__ to name
                raise ConfigurationError(
                    f"{function.name!r} is already a task: apply @queue.task once, with all its "
                    "options (use @queue.periodic(...) alone to make it periodic too)"
                )
            chosen: Executor = executor or (
                "async" if inspect.iscoroutinefunction(function) else "thread"
            )
            task_name = default_task_name(function) if name is None else check_task_name(name)
            tasks = self.queue.tasks
            if task_name in tasks and tasks[task_name].fn is not function:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            target = queue or route(self.queue.routes, task_name) or self.queue.name
            middleware = task_middleware(self.queue)
            checked = build_options(task_name, given, middleware)
            registered: Task[Any, Any] = Task(
                self.queue,
                function,
                name=task_name,
                queue=check_queue_name("queue name", target),
                retries=retries,
                retry_policy=retry_policy or DEFAULT_RETRY_POLICY,
                timeout=timeout,
                executor=chosen,
                store_result=store_result,
                dead_letter=dead_letter,
                priority=priority,
                options=checked,
                middleware=middleware,
                producer=self.producer,
            )
            registered.executor_given = executor is not None
            tasks[task_name] = registered
            if COLLECT not in tasks:  # the step that collects a group's results, once
                self.task(name=COLLECT, retries=0)(collect)
            return registered

        if fn is not None:
            return register(fn)
        return register

    def periodic(
        self,
        schedule: Schedule | str | float | _dt.timedelta,
        *,
        tz: str | None = None,
        missed: MissedPolicy = "run_once",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: str | None = None,
        **task_options: Any,
    ) -> TaskDecorator:
        """Register a function as a task (like ``Queue.task``) that a Scheduler runs periodically.

        Args:
            schedule: ``Every(seconds)``, ``Cron("*/5 * * * *", tz=...)``, a cron string
                (evaluated in ``tz``) or an interval in seconds.
            tz: IANA zone of a cron string (default UTC).
            missed: what a scheduler does with occurrences missed while none ran:
                ``"run_once"`` (the newest only), ``"run_all"`` (each, up to 100) or
                ``"skip"`` (none); see :mod:`blitzq.scheduler`.
            args, kwargs: arguments of every periodic call (plain data).
            name: task name (default ``module.qualname``), also the periodic entry's name.
            queue: queue its messages go to (default: this Queue's ``name``).
            priority: ``"high"``, ``"normal"`` or ``"low"`` for the periodic messages
                (``None``: the task's own priority).
            task_options: any other option of ``Queue.task`` (retries, timeout, ...).

        Raises:
            ConfigurationError: a bad schedule or option, a name already registered, or the
                decorator applied to a Task (stacked on ``@queue.task``).
            SerializationError: ``args`` or ``kwargs`` are not plain data.
        """

        def register(fn: Callable[..., Any]) -> Task[Any, Any]:
            if isinstance(fn, Task):  # stacked on @queue.task
                raise ConfigurationError(
                    f"@queue.periodic(...) was applied to {fn.name!r}, already a task: use "
                    "@queue.periodic(...) instead of @queue.task (it registers the task too, with "
                    "the same options), or queue.add_periodic(task, schedule) for a registered task"
                )
            registered: Task[Any, Any] = self.task(name=name, queue=queue, **task_options)(fn)
            self.add_periodic(
                registered,
                schedule,
                tz=tz,
                missed=missed,
                args=args,
                kwargs=kwargs,
                priority=priority,
            )
            return registered

        return register

    def add_periodic(
        self,
        task: Task[Any, Any],
        schedule: Schedule | str | float | _dt.timedelta,
        *,
        tz: str | None = None,
        missed: MissedPolicy = "run_once",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: str | None = None,
    ) -> PeriodicTask:
        """Run an already registered task periodically; see ``Queue.periodic`` for the options.

        Args:
            name: the periodic entry's name (default: the task's name); give distinct names to
                run one task on several schedules or with different arguments.
            queue: queue to publish to (default: the task's queue).

        Raises:
            ConfigurationError: a bad option, or another periodic entry with the same name (the
                same task on another schedule or with other arguments included; registering
                an identical entry again changes nothing).
            SerializationError: ``args`` or ``kwargs`` are not plain data.
        """
        from .periodic import make_periodic  # periodic.py and schedules.py: on first use

        entry = make_periodic(
            task,
            schedule,
            tz=tz,
            missed=missed,
            args=args,
            kwargs=kwargs,
            name=name,
            queue=queue,
            priority=priority,
        )
        existing = self.queue.periodic_tasks.get(entry.name)
        if existing is not None and (
            existing.task.fn is not task.fn or dataclasses.replace(existing, task=task) != entry
        ):  # the very same entry registered again (same function, schedule, ...) is a no-op
            raise ConfigurationError(
                f"a periodic task named {entry.name!r} is already registered (give each "
                "schedule of a task its own name=)"
            )
        self.queue.periodic_tasks[entry.name] = entry
        return entry


def task_middleware(queue: RegistryContext) -> tuple[Middleware, ...]:
    """The middleware whose per-task options ``queue``'s tasks may be given, in the order
    their ``setup_task`` runs: the built-in ones, then those registered on ``queue``, then the
    workflow engine (:class:`~blitzq.workflow.steps.WorkflowSteps`: its finisher after
    theirs)."""
    return (*builtin_middleware(), *queue.middleware, WORKFLOW_STEPS)


def adopt_middleware(queue: RegistryContext, middleware: Middleware) -> None:
    """Plug ``middleware``, just registered with ``queue.add_middleware``, into the tasks
    registered before it: each gets the defaults of the options it declares (in
    ``task.controls``) and then its :meth:`~blitzq.Middleware.setup_task` call.

    Raises:
        ConfigurationError: its ``setup_task`` refuses a task.
    """
    for registered in queue.tasks.values():
        extra = build_options(registered.name, {}, (middleware,)).extensions
        if extra:
            merged = {**registered.controls.extensions, **extra}
            registered.controls = dataclasses.replace(registered.controls, extensions=merged)
        calls = declared_call_options((middleware,))
        if calls:
            registered.call_controls = {**registered.call_controls, **calls}
        middleware.setup_task(registered, registered.controls)


class TaskDecorator(Protocol):
    """Type of ``queue.task(...)`` called with options: a decorator making a Task."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]: ...


__all__ = [
    "Registrar",
    "RegistryContext",
    "TaskDecorator",
    "adopt_middleware",
    "default_task_name",
    "task_middleware",
]
