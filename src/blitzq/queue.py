"""The application object that producers and workers both import.

A :class:`Queue` holds the task registry, the configuration and the broker. It makes one broker
(one set of connections) per event loop, so the same Queue serves an asyncio app, the sync API's
background loop and a worker alike.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

from . import config
from ._checks import flag, integer, seconds
from .broker import Broker
from .broker.factory import (
    check_url,
    describe_connection,
    make_broker,
    resolve_amqp_url,
    resolve_url,
)
from .client import testmode
from .client.admin import Admin
from .client.delegate import delegate
from .client.publish import Producer
from .client.reading import Results
from .client.sync import Portal, blocking
from .client.workflows import Workflows
from .dependencies import Lifespans
from .exceptions import ConfigurationError, SerializationError, UnknownTask
from .extensions.lifecycle import Hook, Hooks, QueueHooks
from .extensions.middleware import EnqueueFilter, EnqueueObserver, Middleware
from .extensions.ratelimit import queue_limits
from .extensions.registry import Extensions
from .extensions.signals import Handler, Signal, Signals
from .limits import (
    DEFAULT_DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TTL,
    DEFAULT_MAX_RESULT_SIZE,
)
from .options import declared_options
from .ratelimit import RateLimit
from .registration import Registrar, adopt_middleware, task_middleware
from .routing import Routes, check_namespace, check_queue_name
from .task import BoundTask, Task, TaskHandle

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from .periodic import PeriodicTask
    from .registration import TaskDecorator
    from .retries import RetryPolicy
    from .routing import Priority
    from .task import Executor

    P = ParamSpec("P")
    R = TypeVar("R")

Mode = Literal["reliable", "fast"]
#: Default largest message accepted, in bytes.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024


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
            the embedded Valkey server in ``./.blitzq`` (``BLITZQ_DATA_DIR`` moves it). The
            empty string is refused (so is an empty ``BLITZQ_REDIS_URL``, at first use).
        namespace: prefix of every key (``{namespace}:…``); apps sharing a server use
            different namespaces. ``BLITZQ_NAMESPACE`` overrides the default.
        mode: ``"reliable"`` (Redis Streams, at-least-once) or ``"fast"`` (lists,
            at-most-once). ``BLITZQ_MODE`` overrides the default.
        visibility_timeout: seconds a delivery may go without a lease renewal before another
            worker recovers it (reliable mode). Each worker's own: while it is registered,
            its deliveries are left that long by workers with shorter ones.
        max_deliveries: deliveries of one message (crashes included) before it is
            dead-lettered.
        store_results: store return values of successful tasks (failures are always stored).
        result_ttl: seconds a record is kept.
        max_message_size: largest encoded message in bytes (envelope included), refused at enqueue.
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
        max_result_size: largest return value in bytes (encoded, without the record's
            fields); a larger result fails the task with :class:`~blitzq.ResultTooLarge`.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of stored dead letters; beyond it the oldest
            are dropped.
        amqp_url: ``amqp://user:password@host:port/vhost`` (or ``amqps://``): messages
            travel through RabbitMQ quorum queues (at-least-once) while ``redis_url`` keeps
            records, results, the schedule and dead letters. ``None`` reads
            ``BLITZQ_AMQP_URL``; without it messages travel through Redis.
        redis: the application's own ``redis.asyncio.Redis`` or ``ConnectionPool`` to use
            instead of ``redis_url`` (``decode_responses=False``, the default): enqueues and
            result reads share its connections, and blitzq never closes it. For producers:
            a :class:`~blitzq.Worker` refuses such a Queue (it needs connections of its own),
            and the connection serves the event loop it is first used in (the ``*_sync``
            twins, which run on a loop of their own, raise ``ConfigurationError`` there).
            Not with ``redis_url``, ``broker`` or ``amqp_url`` (with ``amqp_connection`` it
            keeps the state of the RabbitMQ transport); not a Redis Cluster client (give its
            URL).
        amqp_connection: the application's own aio-pika connection (``connect_robust``
            recommended) or ``aio_pika.pool.Pool`` of connections, to publish on instead of
            ``amqp_url``: messages travel through RabbitMQ as with ``amqp_url``, on a
            publishing channel blitzq opens on it (and closes with the Queue); blitzq never
            closes the connection or the pool. For producers, as ``redis=``: a
            :class:`~blitzq.Worker` refuses such a Queue. The state store is ``redis_url``
            (or ``redis=``). Not with ``amqp_url`` or ``broker``.
        log_queue: move the root logger's handlers behind a bounded, non-blocking queue
            written by a listener thread (:func:`blitzq.logcontext.install_log_queue`), so a
            slow handler never holds the event loop; ``None`` reads ``BLITZQ_LOG_QUEUE``
            (default off: an application keeps its logging as it set it up).
        recent_index: tasks kept per physical queue in the index of ended tasks that the
            dashboard lists (id, task name, final state and end time of each; each worker
            writes what ended once a second, one call per queue; the index expires
            ``result_ttl`` after its last write); ``0`` keeps none.

    Every numeric option must be a real number (``int`` where a count or size is asked for;
    never ``bool``), finite and in range, and every duration at most ten years
    (``blitzq.limits.MAX_SECONDS``); see docs/configuration.md.

    Raises:
        ConfigurationError: an invalid argument (a bool, NaN or infinite number, a value out
            of range, or a value of the wrong type), or a queue name (``name``, a route's,
            a ``queue_rate_limits`` key) that looks like a URL or ends in ``":high"`` /
            ``":low"`` (see :func:`blitzq.routing.check_queue_name`), or ``redis_url=''``.
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
        amqp_url: str | None = None,
        log_queue: bool | None = None,
        redis: Any = None,
        amqp_connection: Any = None,
        recent_index: int = 10_000,
    ) -> None:
        self.name = check_queue_name("queue name", name)
        self.namespace = config.resolve("namespace", namespace, "blitzq", check_namespace)
        self.mode: Mode = config.resolve("mode", mode or None, "reliable", config.check_mode)
        if config.resolve("log_queue", log_queue, False, config.check_bool):
            from .logcontext import install_log_queue

            install_log_queue()
        # Numbers are real numbers (not bool), finite and in range; see blitzq._checks.
        visibility_timeout = seconds("visibility_timeout", visibility_timeout)
        integer("max_deliveries", max_deliveries, minimum=1)
        flag("store_results", store_results)
        result_ttl = int(seconds("result_ttl", result_ttl, minimum=1, strict=False))
        integer("max_message_size", max_message_size, minimum=64, unit="bytes")
        integer("max_result_size", max_result_size, minimum=64, unit="bytes")
        integer("dead_letter_cap", dead_letter_cap, minimum=1)
        dead_letter_ttl = seconds("dead_letter_ttl", dead_letter_ttl, minimum=1, strict=False)
        integer("dead_letter_max_bytes", dead_letter_max_bytes, minimum=1024, unit="bytes")
        flag("track_state", track_state)
        integer("recent_index", recent_index, minimum=0)
        if redis_url is not None and not isinstance(redis_url, str):
            raise ConfigurationError(f"redis_url must be a str, got {type(redis_url).__name__}")
        if redis_url == "":
            raise ConfigurationError(
                "redis_url='' is empty: leave redis_url out (None) to use the embedded server "
                "or BLITZQ_REDIS_URL, or give a broker URL (redis://host:6379/0)"
            )
        if redis_url:
            check_url(redis_url)  # an unsupported scheme is refused here, not at first use
        if amqp_url is not None and not isinstance(amqp_url, str):
            raise ConfigurationError(f"amqp_url must be a str, got {type(amqp_url).__name__}")
        if amqp_url:
            resolve_amqp_url(amqp_url, self.name)  # refused here, not at first use
        self._injected: Any = None
        self._injected_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        if redis is not None:
            if redis_url is not None or broker is not None or amqp_url:
                raise ConfigurationError(
                    "give one of redis= (a connection), redis_url= or broker=; redis= does "
                    "not go with amqp_url= either (amqp_connection= does)"
                )
            describe_connection(redis)  # refused here, not at first use
            self._injected = redis
        self._amqp_injected: Any = None
        if amqp_connection is not None:
            if amqp_url or broker is not None:
                raise ConfigurationError(
                    "give one of amqp_connection= (a connection or pool), amqp_url= or broker="
                )
            from .broker.amqp.injected import check_amqp_connection  # aio-pika: the amqp extra

            check_amqp_connection(amqp_connection)  # refused here, not at first use
            self._amqp_injected = amqp_connection
        if routes is not None and not (callable(routes) or isinstance(routes, Mapping)):
            raise ConfigurationError(f"routes must be a dict or a callable, got {routes!r}")
        for target in routes.values() if isinstance(routes, Mapping) else ():
            check_queue_name("queue name of a route", target)
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
        self.recent_index = recent_index
        self._redis_url = redis_url
        self._amqp_url = amqp_url
        self._shared_broker = broker
        self._brokers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Broker] = (
            weakref.WeakKeyDictionary()
        )
        self._mode_generation = testmode.generation
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodic_tasks: dict[str, PeriodicTask] = {}
        self._url: str | None = None
        # The sync API's loop; every *_sync twin runs on it (closed at exit if still open).
        self._portal = Portal(closer=self.close)
        self.on_startup = Hooks()
        self.on_shutdown = Hooks()
        #: Per-worker resources for ``Depends()`` parameters (:mod:`blitzq.dependencies`).
        self.lifespan = Lifespans()
        #: Coroutines that see each batch before it is published, and coroutines called
        #: with what was published: sugar over a built-in middleware's batch hooks
        #: (:class:`~blitzq.extensions.lifecycle.EnqueueLists`).
        self.enqueue_filters: list[EnqueueFilter] = []
        self.enqueue_observers: list[EnqueueObserver] = []
        #: Registered middleware and signal handlers (see :mod:`blitzq.extensions.registry`).
        self._extensions = Extensions(self)
        # on_startup, on_shutdown and lifespan: sugar over one built-in lifecycle middleware.
        self._extensions.builtin.append(
            QueueHooks(self.on_startup, self.on_shutdown, self.lifespan)
        )
        self._producer = Producer(self, self._portal, self._extensions)
        self._results = Results(self)
        self._admin = Admin(self)
        #: Makes the tasks and periodic entries (``task``, ``periodic``, ``add_periodic``).
        self._registrar = Registrar(self, self._producer)
        self._workflows = Workflows(self, self._extensions, self._producer.known_queues)

    def __repr__(self) -> str:
        return f"<Queue {self.name} namespace={self.namespace} mode={self.mode}>"

    # ---------------------------------------------------------------- broker
    @property
    def url(self) -> str:
        """The broker URL in use (resolving it may start the embedded server; in the test
        mode of :mod:`blitzq.testing`, the memory backend instead)."""
        if testmode.forced_url is not None:
            return testmode.forced_url(self)
        if self._url is None:
            injected = self._injected
            self._url = (
                resolve_url(self._redis_url) if injected is None else describe_connection(injected)
            )
        return self._url

    @property
    def connection_injected(self) -> bool:
        """Whether this Queue works over an application's connection (``redis=`` or
        ``amqp_connection=``)."""
        return self._injected is not None or self._amqp_injected is not None

    @property
    def injected_connections(self) -> list[str]:
        """The options this Queue was given an application's connection by, of
        ``["redis=", "amqp_connection="]``."""
        given = [("redis=", self._injected), ("amqp_connection=", self._amqp_injected)]
        return [name for name, value in given if value is not None]

    def _connect_to(self, url: str) -> None:
        """Use the broker at ``url`` instead of the configured one (the CLI's ``--redis-url``);
        call it before the Queue is used. Not for a Queue given a ready ``broker=``.
        """
        self._redis_url = url
        self._url = None
        self._injected = None  # the URL given wins over an injected connection

    def _make_broker(self) -> Broker:
        """A new broker for this Queue's URL, namespace, mode and dead-letter limits."""
        limits = {
            "dead_letter_cap": self.dead_letter_cap,
            "dead_letter_ttl": self.dead_letter_ttl,
            "dead_letter_max_bytes": self.dead_letter_max_bytes,
        }
        # The eager test mode keeps everything on its memory backend (blitzq.testing).
        amqp = None if testmode.forced_url is not None else resolve_amqp_url(self._amqp_url)
        injected = None if testmode.forced_url is not None else self._injected
        amqp_injected = None if testmode.forced_url is not None else self._amqp_injected
        if amqp_injected is not None:
            amqp = None  # the connection given wins over BLITZQ_AMQP_URL
        if injected is not None or amqp_injected is not None:
            loop = asyncio.get_running_loop()
            first = self._injected_loop() if self._injected_loop is not None else None
            if first is not None and first is not loop:
                raise ConfigurationError(
                    f"this Queue works over an injected {' and '.join(self.injected_connections)} "
                    "connection, which serves the "
                    "event loop it was first used in; this is another loop (the *_sync "
                    "methods run on one of their own): use the async API there, or give "
                    "the Queue redis_url= instead"
                )
            self._injected_loop = weakref.ref(loop)
        return make_broker(
            self.url,
            self.namespace,
            self.mode,
            limits,
            amqp,
            self.max_deliveries,
            self.visibility_timeout,
            injected,
            amqp_injected,
        )

    @property
    def broker(self) -> Broker:
        """The broker of the running event loop (made on first use in each loop)."""
        if self._shared_broker is not None:
            return self._shared_broker
        if self._mode_generation != testmode.generation:  # blitzq.testing switched modes
            self._brokers = weakref.WeakKeyDictionary()
            self._mode_generation = testmode.generation
        loop = asyncio.get_running_loop()
        broker = self._brokers.get(loop)
        if broker is None:
            broker = self._brokers[loop] = self._make_broker()
        return broker

    # ----------------------------------------------------------- registration
    # The registrar's own methods (signature, overloads and docstring are theirs; see
    # delegate()): blitzq.registration.Registrar.
    # (typed by these overloads, as Registrar.task is: delegate() keeps one signature only)
    if TYPE_CHECKING:

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

        def task(self, fn: Any = None, /, **options: Any) -> Any: ...

    else:
        task = delegate("_registrar", Registrar.task)
    periodic = delegate("_registrar", Registrar.periodic)  # type: ignore[arg-type]  # as send
    add_periodic = delegate("_registrar", Registrar.add_periodic)

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

        Its per-task options (``Middleware.task_options``) can be given to the tasks
        registered after this call; the tasks registered before it get their defaults, and
        its ``setup_task`` runs for every task either way (see
        :func:`blitzq.registration.adopt_middleware`).

        Raises:
            TypeError: not a :class:`Middleware` instance.
            ConfigurationError: it declares a per-task option another registered or built-in
                middleware declares too.
        """
        if isinstance(middleware, Middleware):  # a second declaration of an option: refused
            declared_options((*task_middleware(self), middleware))
        self._extensions.add(middleware)
        adopt_middleware(self, middleware)

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The registered middleware, in registration order."""
        return tuple(self._extensions.middleware)

    @property
    def signals(self) -> Signals:
        """Where the Queue's signals are emitted (:class:`~blitzq.extensions.signals.Signals`):
        ``queue.signals.emit(signal, event)`` calls every observer of ``signal``, the
        registered middleware's ``on_signal`` hooks, then the ``queue.on`` handlers."""
        return self._extensions.signals

    def on(self, signal: Signal | str) -> Callable[[Handler], Handler]:
        """Decorator registering a signal handler (plain function or coroutine function)::

            @queue.on(Signal.TASK_FAILED)
            async def alert(event: SignalEvent) -> None: ...

        Sugar over the middleware chain: the handler is held by a built-in middleware
        (:class:`~blitzq.extensions.signals.SignalHandlers`), called after the ``on_signal``
        hooks of the registered middleware (:meth:`blitzq.Middleware.on_signal`).

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
    send_many = delegate("_producer", Producer.send_many)
    send_many_sync = blocking(send_many)

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
    dead_letter_summary = delegate("_admin", Admin.dead_letter_summary)
    dead_letter_summary_sync = blocking(dead_letter_summary)
    retry_dead_letters = delegate("_admin", Admin.retry_dead_letters)
    retry_dead_letters_sync = blocking(retry_dead_letters)
    purge_queue = delegate("_admin", Admin.purge_queue)
    purge_queue_sync = blocking(purge_queue)
    delayed_count = delegate("_admin", Admin.delayed_count)
    delayed_count_sync = blocking(delayed_count)
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


__all__ = ["BoundTask", "Hook", "Hooks", "Mode", "Queue", "SerializationError"]
