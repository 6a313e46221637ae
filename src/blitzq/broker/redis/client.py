"""How the Redis brokers talk to the server: the connection pool and the one error translation.

Every Redis call of the brokers goes through a client made by :func:`make_client`, and every
redis-py error it raises becomes a :class:`~blitzq.BrokerError` through :func:`broker_error`
(as the decorator :func:`translate_errors` on a coroutine method, or called in an ``except``
clause of an async generator). Lua scripts are loaded and run by ``scripts.py``.

Pool and connections
--------------------
One bounded, blocking pool per broker, with timeouts. Every default below can be overridden by
a query parameter of the broker URL (redis-py's names), e.g.
``redis://host:6379/0?max_connections=200&timeout=5&socket_timeout=10``; a parameter in the URL
always wins over the default. ``docs/configuration.md`` lists them.

- The pool is a :class:`redis.asyncio.BlockingConnectionPool` (:class:`BoundedPool` of
  ``pool.py``, with a fast path while nobody waits): when all ``max_connections``
  are in use, a caller waits up to ``timeout`` seconds for one to be released instead of
  failing at once (redis-py's plain pool raises "Too many connections"). Waiting that long
  without a free connection raises :class:`~blitzq.BrokerError` (transient).
- ``socket_connect_timeout`` bounds opening a TCP connection; ``socket_timeout`` bounds every
  read of a reply (the connection handshake's included). Blocking
  reads of the product (XREADGROUP BLOCK, BLMPOP) are cut to :func:`max_block` seconds, below
  the socket timeout, so a legitimately idle wait never looks like a dead server; pub/sub reads
  pass their own read timeout. Fast mode's pops wait longer for their reply, the popped
  messages' only copy (``popping.py``).
- TCP keepalive (redis-py's probe settings: idle 30 s, interval 5 s, 3 probes) finds a peer
  that vanished without a FIN; ``health_check_interval`` PINGs a connection idle that long
  before reusing it.
- A command is retried (3 times, jittered backoff 50 ms to 0.5 s) only on a connection error
  (refused, reset: the command did not reach the server, or the connection broke), never on a
  read timeout: a timed-out write may have been applied, and retrying it with the connect
  retry inside would multiply the wait (4 x 4 x the timeout).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._checks import repeated_option
from ...exceptions import BrokerError, BrokerRefusedSettings, ConfigurationError
from ...redaction import mask_url, redact
from .cluster import make_cluster_client, plain_url, split_layout, wants_cluster
from .pool import BoundedPool

P = ParamSpec("P")
R = TypeVar("R")

#: Connections one broker (one Queue in one event loop) opens at most (URL ``max_connections``).
DEFAULT_MAX_CONNECTIONS = 50
#: Seconds a caller waits for a free connection when all are in use (URL ``timeout``).
DEFAULT_POOL_TIMEOUT = 20.0
#: Seconds to open a TCP connection (URL ``socket_connect_timeout``).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for any reply (URL ``socket_timeout``).
DEFAULT_SOCKET_TIMEOUT = 5.0
#: TCP keepalive on TCP connections (URL ``socket_keepalive``; Unix sockets have none).
DEFAULT_KEEPALIVE = True
#: Seconds a connection may sit idle before it is PINGed on reuse (URL ``health_check_interval``).
DEFAULT_HEALTH_CHECK_INTERVAL = 30
#: Retries of a command that met a connection error (not a timeout).
DEFAULT_RETRIES = 3


def connection_options(url: str) -> dict[str, Any]:
    """The pool and connection keyword arguments blitzq adds to ``url``'s own parameters.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.

    Returns:
        Keyword arguments for :meth:`redis.asyncio.BlockingConnectionPool.from_url`; the
        URL's query parameters are applied over them by redis-py.
    """
    options: dict[str, Any] = {
        "max_connections": DEFAULT_MAX_CONNECTIONS,
        "timeout": DEFAULT_POOL_TIMEOUT,
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "health_check_interval": DEFAULT_HEALTH_CHECK_INTERVAL,
        "retry": Retry(
            ExponentialWithJitterBackoff(base=0.05, cap=0.5),
            DEFAULT_RETRIES,
            supported_errors=(RedisConnectionError,),
        ),
    }
    if urlsplit(url).scheme in ("redis", "rediss"):
        options["socket_keepalive"] = DEFAULT_KEEPALIVE
    return options


def make_client(url: str) -> Any:
    """A ``redis.asyncio.Redis`` on a bounded blocking pool with blitzq's defaults, or on a
    Redis Cluster node a ``redis.asyncio.cluster.RedisCluster`` (see ``cluster.py``).

    Args:
        url: a ``redis://``, ``rediss://``, ``redis+cluster://``, ``rediss+cluster://``,
            ``unix://`` or ``redis+sentinel://`` URL (``sentinel.py``); query parameters
            override the defaults (see the module
            docstring).

    Raises:
        ValueError: a query parameter is unknown (a typo) or has an invalid or out-of-range
            value: ``max_connections < 1``; ``timeout``, ``socket_timeout`` or
            ``socket_connect_timeout`` not a finite number ``> 0``; a negative
            ``health_check_interval``; a boolean option (``socket_keepalive`` ...) not one of
            true/false, yes/no, 1/0; on a cluster a database other than 0; an option given
            more than once (:func:`~blitzq._checks.repeated_option`).
    """
    found = repeated_option(url)
    if found is not None:  # redis-py would read the first, the cluster and sentinel the last
        raise ValueError(f"the option {found[0]!r} is given {found[1]} times; give it once")
    url = split_layout(url)[0]  # the broker's choice (``factory.py``), not the client's
    if urlsplit(url).scheme == "redis+sentinel":  # the primary a set of sentinels names
        from .sentinel import make_sentinel_client

        return make_sentinel_client(url)
    query = parse_qs(urlsplit(url).query)
    if "socket_keepalive" in query and urlsplit(url).scheme == "unix":
        raise ValueError("socket_keepalive applies to TCP connections, not unix:// sockets")
    for name in _BOOLEAN_OPTIONS & query.keys():
        for text in query[name]:
            if text.strip().lower() not in _BOOLEAN_TEXTS:
                raise ValueError(f"{name}={text!r} is not a boolean (true/false, yes/no, 1/0)")
    for text in query.get("max_connections", []):
        # redis-py reads 0 as "no limit" (2**31 connections): refused like a negative one.
        if text.strip().lstrip("+-").isdigit() and int(text) < 1:
            raise ValueError(f"max_connections={text!r} must be at least 1")
    if wants_cluster(url):
        return make_cluster_client(url, connection_options(plain_url(url)))
    pool = BoundedPool.from_url(url, decode_responses=False, **connection_options(url))
    _check_pool(pool)
    return aioredis.Redis.from_pool(pool)


def bad_url(url: str, exc: Exception) -> ConfigurationError:
    """The error for a broker URL :func:`make_client` refused with ``exc``: the URL and the
    reason, its passwords masked (``redaction.py``), also where the reason quotes a piece
    of a malformed URL."""
    return ConfigurationError(f"bad broker URL {mask_url(url)!r}: {redact(str(exc), url)}")


def subscriber(client: Any, **kwargs: Any) -> Any:
    """A ``PubSub`` of ``client`` whose connection is its own, outside the command pool.

    A subscriber holds its connection for as long as it listens, and its SUBSCRIBE must go
    out even while every connection of the bounded pool is busy with commands (hundreds of
    result waits polling): taken from that pool, it would hold one of its slots for good and
    wait up to the pool ``timeout`` behind the commands, so that no push arrives and every
    wait falls back to re-reading. Its connection is therefore made from the same connection
    class and arguments (URL, timeouts, credentials, TLS) in a pool of its own; through
    Sentinel, a Sentinel pool of its own on the same service and sentinels (it follows a
    failover as the commands do). A cluster client keeps redis-py's own ``client.pubsub()``.

    Args:
        client: a client from :func:`make_client`.
        **kwargs: ``PubSub`` options (``ignore_subscribe_messages=True`` ...).

    Returns:
        A ``redis.asyncio.client.PubSub``; its ``aclose()`` closes the connection.
    """
    from redis.asyncio.sentinel import SentinelConnectionPool

    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        options = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
        own: Any = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name,
            pool.sentinel_manager,
            connection_class=pool.connection_class,
            is_master=pool.is_master,
            check_connection=pool.check_connection,
            **options,
        )
    elif isinstance(pool, BoundedPool):
        own = aioredis.ConnectionPool(
            connection_class=pool.connection_class, **pool.connection_kwargs
        )
    else:
        return client.pubsub(**kwargs)
    return PubSub(own, **kwargs)


#: URL options redis-py reads as booleans (anything not "false"-like is true to it).
_BOOLEAN_OPTIONS = frozenset(
    {"socket_keepalive", "retry_on_timeout", "ssl_check_hostname", "legacy_responses"}
)
_BOOLEAN_TEXTS = frozenset({"1", "0", "t", "f", "true", "false", "y", "n", "yes", "no"})


def _positive(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is ``None`` or a finite number ``> 0``
    (``>= 0`` with ``allow_zero``)."""
    if value is None:
        return
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} must be a finite number {bound}")


def _check_pool(pool: aioredis.BlockingConnectionPool) -> None:
    """Refuse a pool whose options would fail on first use or on every command.

    Unknown option names (a typo such as ``max_connection``) are found by building one
    connection object from the pool's connection arguments, without connecting (redis-py
    raises ``TypeError`` for an unknown keyword argument only then).

    Raises:
        ValueError: an unknown option, ``max_connections < 1``, a pool ``timeout`` or a socket
            timeout that is not a finite number ``> 0``, a negative ``health_check_interval``.
    """
    try:
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        raise ValueError(f"unknown or invalid option: {exc}") from None
    if not isinstance(pool.max_connections, int) or pool.max_connections < 1:
        raise ValueError(f"max_connections={pool.max_connections!r} must be at least 1")
    _positive("timeout", pool.timeout)
    kwargs = pool.connection_kwargs
    _positive("socket_timeout", kwargs.get("socket_timeout"))
    _positive("socket_connect_timeout", kwargs.get("socket_connect_timeout"))
    _positive("health_check_interval", kwargs.get("health_check_interval"), allow_zero=True)


def socket_timeout(client: Any) -> float | None:
    """The read timeout (seconds) of ``client``'s connections, ``None`` for none."""
    pool = getattr(client, "connection_pool", client)  # a RedisCluster: its own kwargs
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value is not None else None


def max_block(client: Any) -> float | None:
    """Longest block (seconds) a blocking command may ask for on ``client``, or ``None``.

    One second under the socket timeout (half of it when that is under 2 s), so the reply
    to a block that timed out server-side always arrives before the socket read gives up.
    """
    timeout = socket_timeout(client)
    if timeout is None:
        return None
    return timeout - 1.0 if timeout >= 2.0 else timeout / 2


def pool_size(client: Any) -> int | None:
    """``max_connections`` of ``client``'s pool (on a cluster: of the commands in flight),
    or ``None`` when unknown."""
    pool = getattr(client, "connection_pool", None)
    size = getattr(pool, "max_connections", None)
    if pool is None:  # a cluster client: commands in flight (cluster.BoundedCluster)
        size = getattr(client, "max_connections", None)
    return int(size) if isinstance(size, int) else None


# ------------------------------------------------------------------ errors
#: What a Redis call may raise that :func:`broker_error` translates (``BrokerError`` itself is
#: an ``OSError``: it passes through unchanged).
REDIS_ERRORS = (RedisError, OSError, RedisClusterException)
#: Cluster errors that trying again may cure: a slot moving or a cluster failing over.
_CLUSTER = (ClusterError, AskError, TryAgainError, SlotNotCoveredError)
#: Error replies of a server that is switching roles or starting (``BrokerError.unavailable``),
#: or of a cluster node whose slot migrates (a script's refused access to a key moved away,
#: ``cluster_scripts.py``): the same command succeeds, unchanged, once it is over.
_SWITCHING = (
    "READONLY",
    "LOADING",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "BUSY ",
    "MOVED",
    "Script attempted to access a non local key",
)
#: Error replies that refuse the connection's settings (a wrong password or user, none given,
#: a database number the server does not have): no retry can cure them.
_REFUSED_SETTINGS = ("NOAUTH", "WRONGPASS", "invalid password", "invalid DB index", "DB index is")


def refused_settings(exc: BaseException) -> BrokerRefusedSettings | None:
    """The :class:`~blitzq.exceptions.BrokerRefusedSettings` (a configuration error) for an
    error that says the server refused the connection's credentials or database number, with
    a message naming the cause and the fix; ``None`` for any other error."""
    text = str(exc)
    if "HELLO must be called with the client already authenticated" in text or text.startswith(
        "NOAUTH"
    ):
        return BrokerRefusedSettings(
            "the Redis server requires a password (NOAUTH) and the broker URL gives none: "
            "give it as the password of the broker URL (its user-information part, before the host)"
        )
    if "DB index" in text:
        return BrokerRefusedSettings(
            f"the Redis server refused the database number of the broker URL ({text}): use "
            "one it has (0 to its `databases` setting minus 1; the path of redis://host:port/DB)"
        )
    if isinstance(exc, AuthenticationError) or text.startswith(_REFUSED_SETTINGS):
        return BrokerRefusedSettings(
            f"the Redis server refused the broker URL's credentials ({type(exc).__name__}: "
            f"{text}): check the user name and password in the URL"
        )
    return None


async def pubsub_send(command: Awaitable[Any]) -> Any:
    """Await ``command`` (a SUBSCRIBE or PSUBSCRIBE) on a pub/sub connection that another task
    reads; the ``AttributeError`` or ``RuntimeError`` redis-py raises when that task reset
    or reconnected the connection meanwhile is raised as the connection error it is.

    Raises:
        redis.exceptions.ConnectionError: the connection was reset meanwhile; any error of
            ``command`` otherwise.
    """
    try:
        return await command
    except (AttributeError, RuntimeError) as exc:
        raise RedisConnectionError(f"the pub/sub connection was reset: {exc}") from exc


def broker_error(exc: BaseException) -> BrokerError:
    """The :class:`~blitzq.BrokerError` for an error a Redis call raised.

    Args:
        exc: a redis-py error (``RedisError``) or an ``OSError`` from the socket; a
            ``BrokerError`` is returned as it is.

    Returns:
        A ``BrokerError`` whose message names the original type, ``transient`` when trying
        again may succeed (a connection error, a timeout, an ``OSError``, a cluster's
        ``MOVED``/``ASK`` past the redirect limit, ``TRYAGAIN``, ``CLUSTERDOWN``) and not when the
        server refused the command (a ``ResponseError``: a script error, ``OOM``, ``NOPERM``...),
        ``out_of_memory`` for ``OOM`` (the same write succeeds once memory is freed),
        ``unavailable`` (and transient) for a server or cluster failing over or starting
        (``READONLY``, ``LOADING``, ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``BUSY``, a
        slot moving: ``ASK``, or a script refused a key of a migrating slot). For a refused
        password, user or database number the error is a
        :class:`~blitzq.exceptions.BrokerRefusedSettings` (also a ``ConfigurationError``;
        never transient: see :func:`refused_settings`). Raise it ``from exc``.
    """
    if isinstance(exc, BrokerError):
        return exc
    if (refused := refused_settings(exc)) is not None:
        return refused
    transient = isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, *_CLUSTER))
    oom = isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM ")
    unavailable = isinstance(exc, (_CLUSTER, BusyLoadingError, ReadOnlyError)) or str(
        exc
    ).startswith(_SWITCHING)
    return BrokerError(
        f"{type(exc).__name__}: {exc}", transient, out_of_memory=oom, unavailable=unavailable
    )


async def wrong_type(client: Any, key: str, want: str, queue: str) -> BrokerError:
    """The :class:`~blitzq.BrokerError` (not transient) for a queue's key that holds another
    type than ``want``.

    Args:
        client: the redis-py client (asyncio) the key is read with (one ``TYPE``).
        key: the key's full name.
        want: the type blitzq keeps there (``"stream"``, ``"list"``).
        queue: the physical queue the key belongs to.
    """
    kind = await client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    return BrokerError(
        f"key {key!r} holds a {kind}, not the {want} of queue {queue!r} (WRONGTYPE): delete "
        f"or rename it "
        f"(redis-cli DEL {key}) if nothing else uses it, or use another namespace",
        transient=False,
    )


def translate_errors(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate a coroutine function so that the Redis errors it raises become
    :class:`~blitzq.BrokerError` (see :func:`broker_error`); a ``BrokerError`` passes through.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except BrokerError:
            raise
        except REDIS_ERRORS as exc:
            raise broker_error(exc) from exc

    return wrapper
