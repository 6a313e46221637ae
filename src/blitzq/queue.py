"""The application object that producers and workers both import.

A :class:`Queue` holds the task registry, the configuration and the broker. It makes one broker
(one set of connections) per event loop, so the same Queue serves an asyncio app, the sync API's
background loop and a worker alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from ._checks import flag, integer, seconds
from .broker import Broker, Guarantee
from .client.admin import Admin
from .client.delegate import delegate
from .client.publish import Producer
from .client.results import Results
from .client.sync import Portal, blocking
from .client.workflows import Workflows
from .exceptions import (
    ConfigurationError,
    SerializationError,
    UnknownTask,
)
from .extensions.middleware import EnqueueFilter, EnqueueObserver, Middleware
from .extensions.ratelimit import queue_limits
from .extensions.registry import Extensions
from .extensions.signals import Handler, Signal, Signals
from .limits import (
    DEFAULT_DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TTL,
    DEFAULT_MAX_RESULT_SIZE,
)
from .ratelimit import RateLimit
from .retries import DEFAULT_RETRY_POLICY, RetryPolicy
from .routing import Priority, Routes, check_name, route
from .task import BoundTask, Executor, Task, TaskHandle, default_task_name
from .workflow.engine import attach as attach_workflow

if TYPE_CHECKING:
    from .scheduler import MissedPolicy, PeriodicTask
    from .schedules import Schedule

P = ParamSpec("P")
R = TypeVar("R")

Mode = Literal["reliable", "fast"]
#: Default largest message accepted, in bytes.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024


Hook = Callable[[], Awaitable[None]]


class Hooks(list[Hook]):
    """Async callables a Worker awaits at start (``on_startup``) or after stopping
    (``on_shutdown``), in order. Use as a decorator (``@queue.on_startup``) or append.
    """

    def __call__(self, hook: Hook) -> Hook:
        """Register ``hook`` and return it unchanged (decorator form)."""
        self.append(hook)
        return hook


class Queue:
    """A task queue: register tasks, enqueue them, read results and dead letters.

    The Queue holds the configuration and the task registry; what it does with them is done
    by the clients it is made of (:mod:`blitzq.client`), whose methods it offers as its own:
    the producer (``send``), results (``get_result``, ``inspect``, ``cancel``, progress),
    admin (dead letters, purges, ``stats``) and workflows.

    Args:
        name: default queue for tasks registered here.
        redis_url: ``redis://host:port/db``, ``rediss://…``, ``unix:///path.sock`` or
            ``memory://[name]`` (in-process: the same code on a private Valkey, one namespace
            per name). ``None`` reads ``BLITZQ_REDIS_URL``, and without it starts (or reuses)
            the embedded Valkey server in ``./.blitzq`` (``BLITZQ_DATA_DIR`` moves it).
        namespace: prefix of every key (``{namespace}:…``); apps sharing a server use
            different namespaces. ``BLITZQ_NAMESPACE`` overrides the default.
        mode: ``"reliable"`` (Redis Streams, at-least-once) or ``"fast"`` (lists,
            at-most-once). ``BLITZQ_MODE`` overrides the default.
        visibility_timeout: seconds a delivery may go without a lease renewal before another
            worker recovers it (reliable mode).
        max_deliveries: deliveries of one message (crashes included) before it is
            dead-lettered.
        store_results: store return values of successful tasks (failures are always stored).
        result_ttl: seconds a record is kept.
        max_message_size: largest encoded message in bytes, refused at enqueue.
        broker: a ready :class:`~blitzq.broker.Broker` to use instead of ``redis_url``.
        dead_letter_cap: dead letters kept before the oldest are dropped.
        routes: queue for tasks whose decorator names none: ``{"emails.*": "emails"}``
            (glob patterns on the task name, first match wins) or a callable
            ``name -> queue | None``. A per-call ``queue=`` beats the decorator, which beats
            the routes.
        queue_rate_limits: rate limit per queue, shared by every task consumed from it and
            by all workers: ``{"emails": "10/s"}`` (see :class:`~blitzq.RateLimit`).
        track_state: keep each task's record current through its life (scheduled, queued,
            running, retrying, then its final state) at the cost of a record write per
            step; without it only final states are stored.
        max_result_size: largest encoded task record in bytes (the return value included);
            a larger result fails the task with :class:`~blitzq.ResultTooLarge`.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of stored dead letters; beyond it the oldest
            are dropped.

    Every numeric option must be a real number (``int`` where a count or size is asked for;
    never ``bool``), finite and in range, and every duration at most ten years
    (``blitzq.limits.MAX_SECONDS``); see docs/configuration.md.

    Raises:
        ConfigurationError: an invalid argument (a bool, NaN or infinite number, a value out
            of range, or a value of the wrong type).
    """

    def __init__(
        self,
        name: str = "default",
        redis_url: str | None = None,
        namespace: str | None = None,
        mode: Mode | None = None,
        visibility_timeout: float = 60.0,
        max_deliveries: int = 5,
        store_results: bool = True,
        result_ttl: int = 86400,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        broker: Broker | None = None,
        dead_letter_cap: int = 100_000,
        routes: Routes | None = None,
        queue_rate_limits: Mapping[str, str | RateLimit] | None = None,
        track_state: bool = False,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
        dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
    ) -> None:
        self.name = check_name("queue name", name)
        self.namespace = check_name(
            "namespace", namespace or os.environ.get("BLITZQ_NAMESPACE") or "blitzq"
        )
        resolved_mode = mode or os.environ.get("BLITZQ_MODE") or "reliable"
        if resolved_mode not in ("reliable", "fast"):
            raise ConfigurationError(f"mode must be 'reliable' or 'fast', got {resolved_mode!r}")
        self.mode: Mode = resolved_mode  # type: ignore[assignment]
        # Numbers are real numbers (not bool), finite and in range; see blitzq._checks.
        seconds("visibility_timeout", visibility_timeout)
        integer("max_deliveries", max_deliveries, minimum=1)
        flag("store_results", store_results)
        seconds("result_ttl", result_ttl, minimum=1, strict=False)
        integer("max_message_size", max_message_size, minimum=64, unit="bytes")
        integer("max_result_size", max_result_size, minimum=64, unit="bytes")
        integer("dead_letter_cap", dead_letter_cap, minimum=1)
        seconds("dead_letter_ttl", dead_letter_ttl, minimum=1, strict=False)
        integer("dead_letter_max_bytes", dead_letter_max_bytes, minimum=1024, unit="bytes")
        flag("track_state", track_state)
        if redis_url is not None and not isinstance(redis_url, str):
            raise ConfigurationError(f"redis_url must be a str, got {redis_url!r}")
        if routes is not None and not (callable(routes) or isinstance(routes, Mapping)):
            raise ConfigurationError(f"routes must be a dict or a callable, got {routes!r}")
        self.visibility_timeout = float(visibility_timeout)
        self.max_deliveries = max_deliveries
        self.store_results = store_results
        self.result_ttl = int(result_ttl)
        self.max_message_size = max_message_size
        self.dead_letter_cap = dead_letter_cap
        self.max_result_size = max_result_size
        self.dead_letter_ttl = int(dead_letter_ttl)
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self.routes = routes
        self.queue_rate_limits = queue_limits(queue_rate_limits)
        self.track_state = track_state
        self._redis_url = redis_url
        self._shared_broker = broker
        self._brokers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Broker] = (
            weakref.WeakKeyDictionary()
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodic_tasks: dict[str, PeriodicTask] = {}
        self._url: str | None = None
        self._portal = Portal()  # the sync API's loop; every *_sync twin runs on it
        self._producer = Producer(self, self._portal)
        self._results = Results(self)
        self._admin = Admin(self)
        self._workflows = Workflows(self)
        self.on_startup = Hooks()
        self.on_shutdown = Hooks()
        #: Coroutines that see each batch before it is published (see
        #: :mod:`blitzq.extensions.middleware`).
        self.enqueue_filters: list[EnqueueFilter] = []
        #: Coroutines called with what was published (same).
        self.enqueue_observers: list[EnqueueObserver] = []
        #: Registered middleware and signal handlers (see :mod:`blitzq.extensions.registry`).
        self._extensions = Extensions(self)

    def __repr__(self) -> str:
        return f"<Queue {self.name} namespace={self.namespace} mode={self.mode}>"

    # ---------------------------------------------------------------- broker
    @property
    def url(self) -> str:
        """The broker URL in use (resolving it may start the embedded server)."""
        if self._url is None:
            url = self._redis_url or os.environ.get("BLITZQ_REDIS_URL")
            if not url:
                from .broker.redis.embedded import ensure_server

                url = ensure_server()
            if url.startswith("valkey://"):
                url = "redis://" + url.removeprefix("valkey://")
            elif url.startswith("valkeys://"):
                url = "rediss://" + url.removeprefix("valkeys://")
            if not url.startswith(("redis://", "rediss://", "unix://", "memory://")):
                raise ConfigurationError(
                    f"unsupported broker URL {url!r}: use redis://, rediss://, unix:// or memory://"
                )
            self._url = url
        return self._url

    def _connect_to(self, url: str) -> None:
        """Use the broker at ``url`` instead of the configured one (the CLI's ``--redis-url``);
        call it before the Queue is used. Not for a Queue given a ready ``broker=``.
        """
        self._redis_url = url
        self._url = None

    def _make_broker(self) -> Broker:
        url, namespace = self.url, self.namespace
        memory = url.startswith("memory://")
        if memory:  # the same Redis code and Lua, on this process's private Valkey server
            from .broker.redis.ephemeral import ensure_server, memory_namespace

            url, namespace = ensure_server(), memory_namespace(url.removeprefix("memory://"))
        broker: Broker
        if self.mode == "reliable":
            from .broker.redis.reliable import ReliableRedisBroker

            broker = ReliableRedisBroker(url, namespace, **self._dead_letter_limits())
        else:
            from .broker.redis.fast import FastRedisBroker

            broker = FastRedisBroker(url, namespace, **self._dead_letter_limits())
        if memory:
            broker.guarantee = Guarantee.EPHEMERAL  # whatever the mode: gone with the process
        return broker

    def _dead_letter_limits(self) -> dict[str, Any]:
        return {
            "dead_letter_cap": self.dead_letter_cap,
            "dead_letter_ttl": self.dead_letter_ttl,
            "dead_letter_max_bytes": self.dead_letter_max_bytes,
        }

    @property
    def broker(self) -> Broker:
        """The broker of the running event loop (made on first use in each loop)."""
        if self._shared_broker is not None:
            return self._shared_broker
        loop = asyncio.get_running_loop()
        broker = self._brokers.get(loop)
        if broker is None:
            broker = self._brokers[loop] = self._make_broker()
        return broker

    # ----------------------------------------------------------- registration
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
    ) -> _TaskDecorator: ...

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
    ) -> Task[Any, Any] | _TaskDecorator:
        """Register a function as a task; use bare (``@queue.task``) or with options.

        Args:
            name: task name workers look up (default ``module.qualname``).
            queue: queue its messages go to (default: this Queue's ``name``).
            retries: retries after a failed attempt (``retry_policy.max_retries`` wins).
            retry_policy: backoff and which errors retry; see :class:`RetryPolicy`.
            timeout: seconds one attempt may run; over it the attempt fails with TaskTimeout.
            executor: ``"async"`` (coroutines, the default for ``async def``), ``"thread"``
                (the default for plain functions) or ``"process"`` (a process pool; the
                function must be importable at module level).
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

        Raises:
            ConfigurationError: a bad option, or a second task with the same name.
        """
        # Every keyword above, by name: the one place they are gathered (blitzq.options).
        given = {k: v for k, v in locals().items() if k not in ("self", "fn")}

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            import inspect

            from .extensions import builtin_middleware
            from .options import build_options

            chosen: Executor = executor or (
                "async" if inspect.iscoroutinefunction(function) else "thread"
            )
            task_name = name or default_task_name(function)
            if task_name in self.tasks and self.tasks[task_name].fn is not function:
                raise ConfigurationError(f"a task named {task_name!r} is already registered")
            options = build_options(task_name, given, builtin_middleware())
            registered: Task[Any, Any] = Task(
                self,
                function,
                name=task_name,
                queue=check_name("queue name", queue or route(self.routes, task_name) or self.name),
                retries=retries,
                retry_policy=retry_policy or DEFAULT_RETRY_POLICY,
                timeout=timeout,
                executor=chosen,
                store_result=store_result,
                dead_letter=dead_letter,
                priority=priority,
                options=options,
            )  # fmt: skip
            self.tasks[task_name] = registered
            attach_workflow(registered)  # its finisher advances workflows it is a step of
            return registered

        if fn is not None:
            return register(fn)
        return register

    def periodic(
        self,
        schedule: Schedule | str | float | datetime.timedelta,
        *,
        tz: str | None = None,
        missed: MissedPolicy = "run_once",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: str | None = None,
        **task_options: Any,
    ) -> _TaskDecorator:
        """Register a function as a task (like :meth:`task`) that a Scheduler runs periodically.

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
            task_options: any other option of :meth:`task` (retries, timeout, ...).

        Raises:
            ConfigurationError: a bad schedule or option, or a name already registered.
            SerializationError: ``args`` or ``kwargs`` are not plain data.
        """

        def register(fn: Callable[..., Any]) -> Task[Any, Any]:
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
        schedule: Schedule | str | float | datetime.timedelta,
        *,
        tz: str | None = None,
        missed: MissedPolicy = "run_once",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: str | None = None,
    ) -> PeriodicTask:
        """Run an already registered task periodically; see :meth:`periodic` for the options.

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
        from .scheduler import make_periodic

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
        existing = self.periodic_tasks.get(entry.name)
        if existing is not None and (
            existing.task.fn is not task.fn or dataclasses.replace(existing, task=task) != entry
        ):  # the very same entry registered again (same function, schedule, ...) is a no-op
            raise ConfigurationError(
                f"a periodic task named {entry.name!r} is already registered (give each "
                "schedule of a task its own name=)"
            )
        self.periodic_tasks[entry.name] = entry
        return entry

    def get_task(self, name: str) -> Task[Any, Any]:
        """The task registered under ``name``.

        Raises:
            UnknownTask: nothing is registered under that name.
        """
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} is registered") from None

    # --------------------------------------------------- middleware and signals
    def add_middleware(self, middleware: Middleware) -> None:
        """Register ``middleware`` (see :mod:`blitzq.middleware`); register before the worker
        starts or the producer enqueues.

        Raises:
            TypeError: not a :class:`Middleware` instance.
        """
        self._extensions.add(middleware)

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The registered middleware, in registration order."""
        return tuple(self._extensions.middleware)

    @property
    def signals(self) -> Signals:
        """The Queue's signal handlers; ``queue.signals.emit(signal, event)`` emits one."""
        return self._extensions.signals

    def on(self, signal: Signal | str) -> Callable[[Handler], Handler]:
        """Decorator registering a signal handler (plain function or coroutine function)::

            @queue.on(Signal.TASK_FAILED)
            async def alert(event: SignalEvent) -> None: ...

        Raises:
            ValueError: an unknown signal.
        """
        sig = Signal(signal)

        def register(handler: Handler) -> Handler:
            return self._extensions.signals.connect(sig, handler)

        return register

    # ------------------------------------------ the clients' methods (blitzq.client)
    # Each is the client's own method (docstring and signature included; see delegate());
    # each *_sync twin is made by blocking() from its async partner.
    # (ignore: mypy sees ``self`` as a possible keyword of ``**options``, as for Task.enqueue)
    send = delegate("_producer", Producer.send)  # type: ignore[arg-type]
    send_sync = blocking(send)

    inspect = delegate("_results", Results.inspect)
    inspect_sync = blocking(inspect)
    get_result = delegate("_results", Results.get_result)
    get_result_sync = blocking(get_result)
    get_results = delegate("_results", Results.get_results)
    run = delegate("_results", Results.run)
    run_sync = blocking(run)
    cancel = delegate("_results", Results.cancel)
    cancel_sync = blocking(cancel)
    get_progress = delegate("_results", Results.get_progress)
    get_progress_sync = blocking(get_progress)
    watch_progress = delegate("_results", Results.watch_progress)

    dead_letters = delegate("_admin", Admin.dead_letters)
    dead_letters_sync = blocking(dead_letters)
    dead_letter_count = delegate("_admin", Admin.dead_letter_count)
    dead_letter_count_sync = blocking(dead_letter_count)
    retry = delegate("_admin", Admin.retry)
    retry_sync = blocking(retry)
    purge_dead_letters = delegate("_admin", Admin.purge_dead_letters)
    purge_dead_letters_sync = blocking(purge_dead_letters)
    purge_queue = delegate("_admin", Admin.purge_queue)
    purge_queue_sync = blocking(purge_queue)
    stats = delegate("_admin", Admin.stats)
    stats_sync = blocking(stats)

    sig = delegate("_workflows", Workflows.sig)
    apply = delegate("_workflows", Workflows.apply)
    apply_sync = blocking(apply)
    workflow = delegate("_workflows", Workflows.workflow)

    def get_results_sync(
        self,
        tasks: Iterable[str | TaskHandle[Any]],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Blocking :meth:`get_results`."""
        # By hand, not blocking(): ``tasks`` (perhaps a generator) is consumed here, in the
        # caller's thread, not on the background loop's.
        return self._portal.call(self.get_results(list(tasks), timeout, return_exceptions))

    async def close(self) -> None:
        """Close the current event loop's broker connections."""
        if self._shared_broker is not None:
            await self._shared_broker.close()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always called from a loop
            return
        broker = self._brokers.pop(loop, None)
        if broker is not None:
            await broker.close()

    def close_sync(self) -> None:
        """Close the sync API's connections and stop its background loop."""
        # By hand, not blocking(close): this one also stops the loop it runs on.
        self._portal.close(self.close())


class _TaskDecorator(Protocol):
    """Type of ``queue.task(...)`` called with options: a decorator making a Task."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]: ...


__all__ = ["BoundTask", "Mode", "Queue", "SerializationError"]
