"""A producer's own Redis connection, injected: ``Queue(redis=client_or_pool)``.

An application that already holds a ``redis.asyncio.Redis`` (or its ``ConnectionPool``) can
hand it to a Queue instead of a URL, so enqueues and result reads share its connections.
blitzq makes a client of its own over that pool (:func:`injected_client`): the application's
client keeps its response callbacks, and closing the Queue closes neither the client nor the
pool (they are the application's). Such a Queue is for producers: a worker needs connections
of its own (blocking reads, a pub/sub listener, leases), and refuses one.

The result listener (its pub/sub connection and the record reads of result waits, which it
cancels when the Queue closes) keeps to a small pool of blitzq's own with the same connection
settings (:func:`listener_client`): a command cancelled in the middle of its reply is never
handed back to the application's pool.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from ...exceptions import ConfigurationError

__all__ = ["describe_injected", "injected_client", "injected_pool", "listener_client"]

#: Connections of the result listener's own pool (its pub/sub connection and record reads).
LISTENER_CONNECTIONS = 8


def injected_pool(connection: Any) -> aioredis.ConnectionPool:
    """The connection pool of ``connection``, checked.

    Args:
        connection: a ``redis.asyncio.Redis`` or a ``redis.asyncio.ConnectionPool``.

    Raises:
        ConfigurationError: anything else (a sync ``redis.Redis``, a ``RedisCluster``: give
            its URL instead), or a pool that decodes replies (``decode_responses=True``:
            blitzq reads bytes).
    """
    from redis.asyncio.cluster import RedisCluster

    if isinstance(connection, RedisCluster):
        raise ConfigurationError(
            "redis= takes a redis.asyncio.Redis or ConnectionPool; for a Redis Cluster give "
            "its URL (redis_url='redis+cluster://host:port')"
        )
    if isinstance(connection, aioredis.Redis):
        pool = connection.connection_pool
    elif isinstance(connection, aioredis.ConnectionPool):
        pool = connection
    else:
        raise ConfigurationError(
            "redis= takes a redis.asyncio.Redis or redis.asyncio.ConnectionPool (the asyncio "
            f"client), got {type(connection).__module__}.{type(connection).__qualname__}"
        )
    if pool.connection_kwargs.get("decode_responses"):
        raise ConfigurationError(
            "redis=: the connection decodes replies (decode_responses=True); blitzq reads "
            "bytes: pass a client or pool made with decode_responses=False (the default)"
        )
    return pool


def injected_client(connection: Any) -> aioredis.Redis:
    """A client of blitzq's own over ``connection``'s pool (see the module docstring).

    Raises:
        ConfigurationError: as :func:`injected_pool`.
    """
    return aioredis.Redis(connection_pool=injected_pool(connection))


def listener_client(connection: Any) -> aioredis.Redis:
    """A client of blitzq's own, with ``connection``'s settings (server, credentials, TLS,
    timeouts) on a bounded pool of :data:`LISTENER_CONNECTIONS`, for the result listener;
    closing the client closes its pool.

    Raises:
        ConfigurationError: as :func:`injected_pool`.
    """
    from .pool import BoundedPool

    pool = injected_pool(connection)
    own = BoundedPool(
        connection_class=pool.connection_class,
        max_connections=LISTENER_CONNECTIONS,
        **pool.connection_kwargs,
    )
    return aioredis.Redis.from_pool(own)


def describe_injected(connection: Any) -> str:
    """A URL naming where ``connection`` goes, without its credentials
    (``redis://host:port/db`` or ``unix:///path?db=n``), for messages and ``Queue.url``.

    Raises:
        ConfigurationError: as :func:`injected_pool`.
    """
    pool = injected_pool(connection)
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    tls = issubclass(pool.connection_class, aioredis.SSLConnection)
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"
