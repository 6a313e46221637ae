"""A Redis primary found through Redis Sentinel: the ``redis+sentinel://`` URL and its client.

URL grammar (``[...]`` optional, ``,``-separated sentinels, default port 26379)::

    redis+sentinel://[[username:]password@]host[:port][,host[:port]...]/service[/db][?query]

- The userinfo and ``db`` are the Redis server's (the primary's) credentials and database,
  as in a ``redis://`` URL; ``?password=`` and ``?username=`` work too.
- ``sentinel_password`` and ``sentinel_username`` in the query are the credentials of the
  sentinels themselves (``requirepass`` in ``sentinel.conf``); without them the sentinels
  are asked without authentication.
- ``wait_replicas`` (an integer ``>= 0``) and ``wait_timeout`` (seconds, ``> 0``, default
  0.5, under ``socket_timeout``). Whatever the URL says, a worker's fetches and completions
  are followed by ``WAIT`` for the replicas that exist (:data:`durable_writes`): a task starts
  only once the replicas know its lease, and its record is acknowledged only once they have
  it (docs/architecture.md, "Failovers"). By default a producer's writes of messages are too
  (:data:`~.replicas.enqueue_writes`: an enqueue, a schedule, a unique enqueue, a dead-letter
  replay; a workflow start and ``track_state``'s records go through the completion path,
  waited for whatever the URL says): the ``XADD``, ``RPUSH``/``LPUSH`` or script call is followed
  by ``WAIT 1 <timeout>`` in the same round trip when the primary has a replica (the
  timeout is ``wait_timeout`` raised to 2 s, at most half of ``socket_timeout``:
  :func:`~.replicas.enqueue_wait_timeout`, since a busy host's replica may take a second),
  and an enqueue its replica did not acknowledge in time raises :class:`~blitzq.OutcomeUnknown`
  (``unreplicated``: the primary has it, a failover may lose it) instead of returning.
  ``wait_replicas=0`` opts the producer's writes out (an enqueue is then acknowledged by the
  primary alone: the enqueue window of docs/guarantees.md); ``wait_replicas=N`` (``N >= 1``)
  waits for ``N`` replicas after every single write command of the broker (a script call,
  ``XADD``, ``RPUSH``/``LPUSH``: lease renewals and the worker's upkeep included). A command
  waits for the least of what it asks and the replicas that exist (``replicas.py``), and
  fails with :class:`~blitzq.BrokerError` (transient, ``unreplicated``) when fewer
  acknowledged it in time (a worker's completion is then retried, and its delivery
  acknowledged only with it). A lease renewal is never waited for unless ``wait_replicas``
  is ``>= 1``: a lagging replica must not make leases lapse (a recovery storm).
- Every other query parameter is a pool or connection option of a ``redis://`` URL
  (``max_connections``, ``timeout``, ``socket_timeout``...: ``client.py``); the sentinels
  use the same ``socket_timeout`` and ``socket_connect_timeout``, cut to 1 s and 0.5 s
  (``sentinel_discovery.py``).

Following a failover (redis-py's ``redis.asyncio.sentinel`` underneath):

- A new connection asks the sentinels for the primary's address first, one sentinel after
  another, the one that answered last first (``sentinel_discovery.SentinelDiscovery``).
- At most every :data:`MASTER_CHECK_INTERVAL` seconds (while the broker sends commands) the
  pool asks the sentinels again; when the primary moved, idle connections are closed and
  busy ones are closed when they are released, so every command after that reaches the new
  primary (a pub/sub connection moves when the old primary drops it as Sentinel demotes it).
- A command (or the taking of a connection) that meets a connection error, no sentinel
  naming a primary, a ``READONLY`` reply (the old primary, demoted) or a ``NOREPLICAS``
  reply (the old primary lost its replica, with ``min-replicas-to-write``) is sent again on
  a fresh connection with jittered backoff of 50 ms to 0.5 s for
  :data:`~.sentinel_discovery.FAILOVER_SECONDS` (10 s, from the call's start or the
  client's first failure, whichever is earlier: ``sentinel_discovery.DeadlineRetry``); then
  it raises :class:`~blitzq.BrokerError` (transient) with a one-line message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from ...exceptions import BrokerError
from .client import _check_pool, connection_options
from .pool import BoundedPool
from .replicas import (
    DEFAULT_WAIT_TIMEOUT,
    REPLICAS_CHECK,
    WAITED,
    WAITED_READS,
    ReplicaWatch,
    check_acknowledged,
    durable_writes,
    durably,
    enqueue_wait_timeout,
    enqueue_writes,
)
from .sentinel_discovery import FAILOVER_SECONDS, DeadlineRetry, SentinelDiscovery

#: URL scheme of a primary found through Sentinel.
SCHEME = "redis+sentinel"
#: Port of a sentinel named without one.
DEFAULT_SENTINEL_PORT = 26379
#: Seconds between two questions to the sentinels about the primary's address.
MASTER_CHECK_INTERVAL = 1.0
#: Seconds between two questions to the sentinels while the primary is superseded.
_SUPERSEDED_POLL = 0.1
#: Query parameters meant for the sentinels, not the Redis server.
_SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")
#: Query parameters of the WAIT after writes (not the Redis server's connection options).
_WAIT_OPTIONS = ("wait_replicas", "wait_timeout")


@dataclass
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL.

    Attributes:
        sentinels: ``(host, port)`` of each sentinel, in the URL's order.
        service: the monitored primary's name (``sentinel monitor <service> ...``).
        server_url: a ``redis://`` URL with the server's credentials, database and options
            (its host is a placeholder: the sentinels give the real one).
        sentinel_options: ``username``/``password`` for the sentinels.
        wait_replicas: replicas every write waits for (0: only the durable ones wait).
        wait_timeout: seconds a WAIT lasts at most.
        wait_given: whether the URL named ``wait_replicas`` (0 included).
        wait_enqueues: whether a producer's writes wait for the replicas that exist (all
            but an explicit ``wait_replicas=0``).
    """

    sentinels: list[tuple[str, int]]
    service: str
    server_url: str = field(repr=False)  # holds the password: never in a repr
    sentinel_options: dict[str, str] = field(default_factory=dict, repr=False)
    wait_replicas: int = 0
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    wait_given: bool = False

    @property
    def wait_enqueues(self) -> bool:
        """See the class docstring."""
        return self.wait_replicas > 0 or not self.wait_given


def parse_sentinel_url(url: str) -> SentinelURL:
    """Split a ``redis+sentinel://`` URL (grammar in the module docstring).

    Raises:
        ValueError: another scheme, no sentinel, a bad port, no service name, a ``db`` that
            is not an integer, or more path segments than ``/service/db``.
    """
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"not a {SCHEME}:// URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = [_host_port(item) for item in hosts.split(",") if item.strip()]
    if not sentinels:
        raise ValueError("no sentinel address (redis+sentinel://host:26379,.../service)")
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if not segments or len(segments) > 2:
        raise ValueError("the path must be /<service name> or /<service name>/<db>")
    service, db = segments[0], segments[1] if len(segments) == 2 else ""
    if db and not db.isdigit():
        raise ValueError(f"db {db!r} is not a non-negative integer")
    query = parse_qs(parts.query, keep_blank_values=True)
    sentinel_options = {
        name.removeprefix("sentinel_"): query.pop(name)[-1]
        for name in _SENTINEL_OPTIONS
        if name in query
    }
    wait = {name: query.pop(name)[-1] for name in _WAIT_OPTIONS if name in query}
    replicas = wait.get("wait_replicas", "0").strip()
    if not replicas.isdigit():
        raise ValueError(f"wait_replicas={replicas!r} is not a non-negative integer")
    try:
        wait_timeout = float(wait.get("wait_timeout", DEFAULT_WAIT_TIMEOUT))
    except ValueError:
        raise ValueError(f"wait_timeout={wait['wait_timeout']!r} is not a number") from None
    if not 0 < wait_timeout < 3600:
        raise ValueError(f"wait_timeout={wait_timeout!r} must be a number of seconds > 0")
    authority = f"{userinfo}@sentinel-primary" if userinfo else "sentinel-primary"
    rest = urlencode(query, doseq=True)
    server_url = f"redis://{authority}/{quote(db)}" + (f"?{rest}" if rest else "")
    return SentinelURL(
        sentinels,
        service,
        server_url,
        sentinel_options,
        int(replicas),
        wait_timeout,
        "wait_replicas" in wait,
    )


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [ipv6]:port
        host, _, port = item[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(f"sentinel address {item!r} has no host")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"sentinel address {item!r} has a bad port")
    return host, int(port)


class FailoverConnection(SentinelManagedConnection):
    """A connection to the primary the sentinels name, which reads a ``NOREPLICAS`` reply
    (the old primary cut off from its replicas by a failover, with ``min-replicas-to-write``)
    like redis-py reads ``READONLY``: as a connection error, after closing the connection,
    so the command is retried on a connection to the new primary."""

    async def connect(self) -> None:
        """Connect to the primary the sentinels name now, once (the callers retry)."""
        await self.connect_check_health(check_health=self.connection_pool.check_connection)

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        """Connect (once) to the primary the sentinels name now, unless connected.

        redis-py reconnects a dropped connection through this method, not ``connect``: the
        address is asked for here, so a reconnection after a failover reaches the new
        primary instead of the old one.
        """
        if self.is_connected:
            return
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health, retry_socket_connect=False)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The reply; ``NOREPLICAS`` becomes ``redis.ConnectionError``."""
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if "NOREPLICAS" not in str(exc) or not self.connection_pool.is_master:
                raise
            await self.disconnect()
            raise RedisConnectionError(f"the primary has no replica left: {exc}") from exc


class BoundedSentinelPool(SentinelConnectionPool, BoundedPool):
    """The bounded blocking pool of ``client.py`` on the primary the sentinels name.

    Taking a connection is retried across a failover (a fresh address each time); every
    :data:`MASTER_CHECK_INTERVAL` seconds of use the sentinels are asked again in the
    background, and connections to a primary that is no longer one are closed.
    """

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._checked_at = -MASTER_CHECK_INTERVAL
        self._check: asyncio.Task[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the current primary; waits up to ``timeout`` seconds when all
        are in use; retried (a fresh address each time) while the primary is unreachable."""
        now = asyncio.get_running_loop().time()
        if now - self._checked_at >= MASTER_CHECK_INTERVAL and self.master_address is not None:
            self._checked_at = now
            if self._check is None or self._check.done():
                self._check = asyncio.create_task(self._check_master(), name="blitzq-sentinel")
        retry = self.connection_kwargs["retry"]
        return await retry.call_with_retry(
            super().get_connection, _no_cleanup, is_retryable=_not_pool_timeout
        )

    async def get_master_address(self) -> Any:
        """The primary's ``(host, port)`` as the sentinels name it now; when it moved, the
        connections to the old one are dropped (see :meth:`_moved_to`).

        Raises:
            redis.exceptions.ConnectionError: no sentinel names a primary (``MasterNotFoundError``).
            redis.exceptions.ResponseError: every sentinel answered, none monitors the service
                or accepts the credentials (``SentinelConfigError``).
        """
        address = await self.sentinel_manager.discover_master(self.service_name)
        await self._moved_to(address)
        return address

    async def _check_master(self) -> None:
        try:
            address = await self.sentinel_manager.discover_master(self.service_name)
        except (RedisError, OSError):
            return  # connections stay where they are; a failing command moves them
        await self._moved_to(address)

    async def _moved_to(self, address: Any) -> None:
        """Record the primary's ``address``; when it moved, take the idle connections out of
        the pool before closing them (redis-py's ``disconnect(inuse_connections=False)``
        closes them in place, under a caller that may take one meanwhile) and mark the busy
        ones to be closed when released."""
        known = self.master_address
        if address == known:
            return
        self.master_address = address
        if known is None:
            return
        stale = list(self._available_connections)
        self._available_connections.clear()
        for connection in self._in_use_connections:
            if (connection.host, connection.port) != tuple(address):  # type: ignore[attr-defined]
                connection.mark_for_reconnect()  # type: ignore[no-untyped-call]
        await asyncio.gather(*(c.disconnect() for c in stale), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop a check in flight and close every connection (the sentinels' too)."""
        if self._check is not None:
            self._check.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._check
        await super().aclose()
        with contextlib.suppress(RedisError, OSError):
            await self.sentinel_manager.aclose()


class ReplicatedRedis(aioredis.Redis):
    """A client whose durable commands are each followed by ``WAIT`` in the same round trip.

    Durable: the single write commands (:data:`~.replicas.WAITED`) when
    :attr:`wait_replicas` is set; under :data:`durable_writes` (a worker's completions and
    fetches, whatever the URL) those and the reads that take leases
    (:data:`~.replicas.WAITED_READS`), waiting for at least one replica; under
    :data:`~.replicas.enqueue_writes` (a producer's writes of messages) the single writes,
    waiting for at least one replica, unless :attr:`wait_enqueues` is off.
    A command waits for ``min(asked, replicas that exist)`` (``replicas.py``'s
    :class:`~.replicas.ReplicaWatch`): the primary's connected replicas, read (``ROLE``) at
    most every :data:`~.replicas.REPLICAS_CHECK` seconds and again after a ``WAIT`` that fell
    short. So after a failover, while the new primary has no replica yet (until Sentinel
    turns the old primary into one, about 10 s), commands go unwaited instead of each
    blocking ``wait_timeout`` and failing: a worker's completions and lease renewals go on
    (no lease lapses because a ``WAIT`` blocked, no recovery storm), durable on every replica
    there is. A primary whose replica was promoted (the old primary during a failover) is
    sent no durable command: it is held until the sentinels name the new primary, at most
    :data:`~.sentinel_discovery.FAILOVER_SECONDS`.

    Attributes:
        wait_replicas: replicas that must acknowledge each write (0: only the durable ones).
        wait_timeout: seconds the WAIT lasts at most.
        enqueue_wait_timeout: seconds the WAIT of a producer's write lasts at most
            (:func:`~.replicas.enqueue_wait_timeout`).
        wait_enqueues: whether a producer's writes are durable (``False``: the URL said
            ``wait_replicas=0``).
    """

    wait_replicas: int = 0
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    enqueue_wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    wait_enqueues: bool = True
    _watch: ReplicaWatch | None = None

    def _watcher(self) -> ReplicaWatch:
        if self._watch is None:
            kwargs = self.connection_pool.connection_kwargs
            self._watch = ReplicaWatch(
                {"username": kwargs.get("username"), "password": kwargs.get("password")}
            )
        return self._watch

    async def replicas(self) -> int:
        """Replicas a durable command waits for now: the primary's connected replicas, and
        a replica gone from them that answers as promoted (see ``replicas.py``); 0 when the
        server is not a primary."""
        primary = getattr(self.connection_pool, "master_address", None)
        return await self._watcher().count(_Plain(self), primary)

    async def wanted(self, asked: int) -> int:
        """Replicas (at most ``asked``) a durable command must reach now; 0: send it unwaited.

        Waits, at most :data:`~.sentinel_discovery.FAILOVER_SECONDS`, while the primary is
        superseded (one of its replicas was promoted), asking the sentinels again meanwhile.

        Raises:
            BrokerError: (transient, ``unavailable``) the primary is still superseded at the
                end of the wait: a failover is under way.
        """
        count = await self.replicas()
        watch, pool = self._watcher(), self.connection_pool
        if not self._superseded(watch):
            return min(asked, count)
        deadline = time.monotonic() + FAILOVER_SECONDS
        while self._superseded(watch):
            superseded = watch.superseded
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"the primary {superseded[0]}:{superseded[1]} may be being replaced (one "
                    "of its replicas was promoted, or left it and does not answer) and the "
                    "sentinels name no other yet: the command was not sent",
                    unavailable=True,
                )
            with contextlib.suppress(RedisError, OSError):
                if isinstance(pool, BoundedSentinelPool):
                    await pool.get_master_address()  # moves the connections when it moved
            if getattr(pool, "master_address", None) == superseded:
                await asyncio.sleep(_SUPERSEDED_POLL)
                watch.forget()
            count = await self.replicas()
        return min(asked, count)

    def _superseded(self, watch: ReplicaWatch) -> bool:
        """Whether the primary the pool names now was found superseded."""
        primary = getattr(self.connection_pool, "master_address", None)
        return watch.superseded is not None and watch.superseded == primary

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; a durable one raises :class:`~blitzq.BrokerError` (transient,
        ``unavailable``) when fewer of the replicas that exist (up to the replicas asked)
        acknowledged it in time, or when the primary is superseded (:meth:`wanted`)."""
        durable = durable_writes.get()
        asked = self.wait_replicas or (
            1 if durable or (self.wait_enqueues and enqueue_writes.get()) else 0
        )
        if not asked:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        name = str(args[0]).upper()
        if name not in WAITED and not (durable and name in WAITED_READS):
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        wanted = await self.wanted(asked)
        if not wanted:  # no replica to wait for: durable on all there are
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        producing = not durable and enqueue_writes.get()
        timeout = self.enqueue_wait_timeout if producing else self.wait_timeout
        pipe = self.pipeline(transaction=False)
        try:
            pipe.execute_command(*args, **options)
            pipe.execute_command("WAIT", wanted, int(timeout * 1000))
            reply, acknowledged = await pipe.execute()
        finally:
            await pipe.reset()  # type: ignore[no-untyped-call]
        check_acknowledged(self._watcher(), str(args[0]), acknowledged, wanted, timeout)
        return reply

    async def settle(
        self, send: Callable[..., Awaitable[Any]], what: str, on_primary: Callable[[], bool]
    ) -> None:
        """Wait for the replicas a durable command must reach, on the connection that sent
        it (``send`` sends one command there and returns its reply): a blocking read that
        took entries on a connection of its own (``blocking.py``).

        Args:
            send: sends one command on that connection, returns its reply.
            what: the command, for the error message.
            on_primary: whether that connection is on the server the pool now takes for the
                primary (checked once the primary is no longer superseded).

        Raises:
            BrokerError: (transient, ``unavailable``) fewer acknowledged in time, the primary
                is superseded (:meth:`wanted`), or the command went to a server that is no
                longer the primary (a failover moved the pool meanwhile).
        """
        wanted = await self.wanted(self.wait_replicas or 1)
        if not on_primary():
            raise BrokerError(
                f"{what} went to a server that is no longer the primary (a failover): its "
                "effects may be lost with it",
                unavailable=True,
            )
        if wanted:
            acknowledged = await send("WAIT", wanted, int(self.wait_timeout * 1000))
            self.check_acknowledged(what, acknowledged, wanted)

    def check_acknowledged(self, what: str, acknowledged: Any, wanted: int) -> None:
        """Raise :class:`~blitzq.BrokerError` when ``acknowledged`` (``WAIT``'s reply) is
        under ``wanted``; the replicas are then read again at the next durable command."""
        check_acknowledged(self._watcher(), what, acknowledged, wanted, self.wait_timeout)


class _Plain:
    """``ROLE`` on a :class:`ReplicatedRedis` without its WAIT logic."""

    def __init__(self, client: ReplicatedRedis) -> None:
        self._client = client

    async def execute_command(self, *args: Any) -> Any:
        return await aioredis.Redis.execute_command(self._client, *args)  # type: ignore[no-untyped-call]


async def _no_cleanup(_error: BaseException) -> None:
    return None


def _not_pool_timeout(error: BaseException) -> bool:
    """False for the blocking pool's "no connection available" (all in use for ``timeout``
    seconds: waiting again would only double it)."""
    return not isinstance(error.__cause__, TimeoutError)


def make_sentinel_client(url: str) -> aioredis.Redis:
    """A ``redis.asyncio.Redis`` on the primary the sentinels of ``url`` name, on a bounded
    blocking pool with the defaults of ``client.py`` (see the module docstring).

    Raises:
        ValueError: a malformed URL, or a bad pool/connection option (as ``make_client``).
    """
    parsed = parse_sentinel_url(url)
    options = connection_options(parsed.server_url)
    options["retry"] = DeadlineRetry(FAILOVER_SECONDS)
    server = parse_url(parsed.server_url)
    server.pop("host", None)
    server.pop("port", None)
    options.update(server)
    sentinel_options: dict[str, Any] = {
        key: options[key]
        for key in ("socket_timeout", "socket_connect_timeout")
        if options.get(key) is not None
    }
    sentinel_options.update(parsed.sentinel_options)
    manager = SentinelDiscovery(parsed.sentinels, sentinel_options)
    options["connection_class"] = FailoverConnection
    client: ReplicatedRedis = manager.master_for(
        parsed.service,
        redis_class=ReplicatedRedis,
        connection_pool_class=BoundedSentinelPool,
        **options,
    )
    _check_pool(client.connection_pool)  # type: ignore[arg-type]
    timeout = options.get("socket_timeout")
    # Every URL waits (a worker's fetches and completions, and by default the enqueues).
    if timeout is not None and parsed.wait_timeout >= float(timeout):
        raise ValueError(
            f"wait_timeout={parsed.wait_timeout} must be under socket_timeout={timeout}"
        )
    client.wait_replicas, client.wait_timeout = parsed.wait_replicas, parsed.wait_timeout
    client.enqueue_wait_timeout = enqueue_wait_timeout(
        parsed.wait_timeout, None if timeout is None else float(timeout)
    )
    client.wait_enqueues = parsed.wait_enqueues
    return client


__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "DEFAULT_WAIT_TIMEOUT",
    "FAILOVER_SECONDS",
    "MASTER_CHECK_INTERVAL",
    "REPLICAS_CHECK",
    "SCHEME",
    "BoundedSentinelPool",
    "FailoverConnection",
    "ReplicatedRedis",
    "SentinelURL",
    "durable_writes",
    "durably",
    "enqueue_writes",
    "make_sentinel_client",
    "parse_sentinel_url",
]
