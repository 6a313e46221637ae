"""A producer's own RabbitMQ connection, injected: ``Queue(amqp_connection=conn_or_pool)``.

An application that already holds an aio-pika connection (``aio_pika.connect`` or, better,
``connect_robust``) or an ``aio_pika.pool.Pool`` of them hands it to a Queue instead of an
``amqp_url``, so enqueues share it. :class:`Borrowed` is what the link
(:class:`~.channels.AmqpLink`) uses in place of the connection it would make: the
connection itself, or one taken from the pool for the life of the link and put back when
the link closes. blitzq opens its own publishing channel on it and closes that channel, never
the connection or the pool (they are the application's). Such a Queue is for producers: a
worker needs connections of its own (consumers, reconnects after a server restart), and
refuses one.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aio_pika.abc import AbstractConnection
from aio_pika.pool import Pool

from ...exceptions import BrokerError, ConfigurationError
from .closing import FAILURES, describe

__all__ = ["Borrowed", "check_amqp_connection", "describe_amqp_connection"]


def check_amqp_connection(connection: Any) -> None:
    """Refuse what ``amqp_connection=`` cannot take.

    Args:
        connection: an ``aio_pika.abc.AbstractConnection`` or an ``aio_pika.pool.Pool``.

    Raises:
        ConfigurationError: anything else (a URL string: give it as ``amqp_url=``).
    """
    if isinstance(connection, AbstractConnection | Pool):
        return
    hint = " (a URL goes in amqp_url=)" if isinstance(connection, str) else ""
    raise ConfigurationError(
        "amqp_connection= takes an aio-pika connection (aio_pika.connect_robust(...)) or an "
        f"aio_pika.pool.Pool of them, got {type(connection).__module__}."
        f"{type(connection).__qualname__}{hint}"
    )


def describe_amqp_connection(connection: Any) -> str:
    """Where ``connection`` goes, without credentials (``amqp://host:port/vhost``), or
    ``amqp://(pool)`` for a pool (which connects on demand).

    Raises:
        ConfigurationError: as :func:`check_amqp_connection`.
    """
    check_amqp_connection(connection)
    url = getattr(connection, "url", None)
    if url is None:
        return "amqp://(pool)"
    scheme = getattr(url, "scheme", "amqp")
    host, port = getattr(url, "host", "?"), getattr(url, "port", None)
    path = getattr(url, "raw_path", "/") or "/"
    return f"{scheme}://{host}{f':{port}' if port else ''}{path}"


class Borrowed:
    """The application's connection (or one of its pool's) as the link uses it.

    Args:
        connection: what ``amqp_connection=`` was given (checked).
    """

    def __init__(self, connection: Any) -> None:
        check_amqp_connection(connection)
        self.source = connection
        self._lease: contextlib.AsyncExitStack | None = None
        self._conn: AbstractConnection | None = None

    async def get(self) -> AbstractConnection:
        """The connection to open channels on: the one given, or one taken from the pool
        (once; kept until :meth:`release`).

        Raises:
            BrokerError: the pool is closed or its factory failed, or the connection is
                closed (blitzq does not reopen a connection it does not own; a robust one
                reconnects by itself).
        """
        if isinstance(self.source, Pool):
            if self._conn is None or self._conn.is_closed:
                await self.release()
                if self.source.is_closed:
                    raise BrokerError("the injected aio-pika pool (amqp_connection=) is closed")
                stack = contextlib.AsyncExitStack()
                try:
                    taken: AbstractConnection = await stack.enter_async_context(
                        self.source.acquire()
                    )
                except FAILURES as exc:  # the pool's factory failed, or the pool closed
                    if isinstance(exc, BrokerError):
                        raise
                    raise BrokerError(
                        f"the injected aio-pika pool (amqp_connection=) gave no connection: "
                        f"{describe(exc)}"
                    ) from None
                self._conn, self._lease = taken, stack
            conn: AbstractConnection = self._conn
        else:
            conn = self.source
        if conn.is_closed or not conn.connected.is_set():
            raise BrokerError(
                "the injected AMQP connection (amqp_connection=) is closed or reconnecting; "
                "blitzq does not reopen a connection it does not own (use connect_robust)"
            )
        return conn

    async def release(self) -> None:
        """Put a connection taken from the pool back (nothing to do for a connection)."""
        lease, self._lease, self._conn = self._lease, None, None
        if lease is not None:
            await lease.aclose()
