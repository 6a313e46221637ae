"""The bounded pool of the Redis brokers: redis-py's blocking pool, with a fast path.

:class:`BoundedPool` is what :func:`~blitzq.broker.redis.client.make_client` puts under every
``redis.asyncio.Redis`` it makes (and, mixed with redis-py's sentinel pool, ``sentinel.py``'s).
Its connections pack each command with hiredis and write it straight to the socket
(:class:`_DirectWrite`). The fast paths were measured with redis-py 8.1 on Python 3.11
(``bench/README.md``, "Round 4" and "Round 6").

Both fast paths read redis-py internals (private attributes of its pool and connection
classes, listed in :data:`POOL_INTERNALS` and :data:`CONNECTION_INTERNALS`); ``pyproject.toml``
bounds redis-py to the releases they were checked with. :func:`missing_internals` names any
that the installed redis-py lacks, and then the pool and its connections take redis-py's own
public path (slower, never wrong); ``tests/unit/test_dependency_internals.py`` fails with
those names, so a new redis-py release that moves them is seen by ``make test-latest``.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from typing import Any

import redis.asyncio as aioredis
from hiredis import pack_command as _hiredis_pack  # a dependency (>= 2.3)
from redis.exceptions import ConnectionError as RedisConnectionError

POOL_INTERNALS = ("_available_connections", "_in_use_connections", "_condition")
"""Attributes of a ``redis.asyncio.BlockingConnectionPool`` the fast path reads (and
``_condition._waiters``, asyncio's, checked with them)."""
CONNECTION_INTERNALS = ("_writer", "encoder", "connect", "check_health", "can_read_destructive")
"""Attributes of a ``redis.asyncio.Connection`` the direct write and the fast path use
(``can_read`` from redis-py 8 on, ``can_read_destructive`` before it)."""


def missing_internals(
    pool_class: type = aioredis.BlockingConnectionPool, connection_class: type = aioredis.Connection
) -> list[str]:
    """The redis-py internals that blitzq's pool uses and the installed redis-py lacks.

    Args:
        pool_class, connection_class: the classes to look at (redis-py's by default); one of
            each is made, without any I/O.

    Returns a list of ``"Class.attribute"`` strings, empty when every one is there (the fast
    paths are on).
    """
    pool = pool_class()
    connection = connection_class()
    missing = [
        f"BlockingConnectionPool.{name}" for name in POOL_INTERNALS if not hasattr(pool, name)
    ]
    condition = getattr(pool, "_condition", None)
    if condition is not None and not hasattr(condition, "_waiters"):
        missing.append("BlockingConnectionPool._condition._waiters")
    missing += [
        f"Connection.{name}" for name in CONNECTION_INTERNALS if not hasattr(connection, name)
    ]
    return missing


_INTERNALS_OK = not missing_internals()

#: Seconds a pooled connection may sit unused, beyond the one most recently used, before the
#: pool closes it: a burst of concurrent commands (a busy spell, a worker's start) opens
#: connections an idle process then holds for nothing (issue 25: an idle worker holds its
#: blocking read's, its pub/sub listener's and one more). ``health_check_interval`` would
#: PING such a connection before reusing it anyway.
IDLE_CLOSE = 30.0


class BoundedPool(aioredis.BlockingConnectionPool):
    """redis-py's blocking pool with a fast path when nobody waits.

    The blocking pool takes an ``asyncio.Condition`` and arms a timeout for every command
    (about 40 µs here, most of a producer's per-``enqueue`` overhead). While a connection is
    free and no caller is queued, taking and returning one needs neither: the plain pool's
    path is used. Queued callers keep their turn: the fast path is off while any waits.

    On that path a connection that is already open and has nothing unread is taken and
    returned without the plain pool's lock, its connect-with-retry call and its per-call
    observability records and release event (11 µs of CPU a command against 0.4 µs,
    measured with redis-py 8.1; ``bench/README.md``). A connection holding unread bytes (a
    reply left behind) is closed and opened again, never handed on. Anything else (a
    closed connection, a credential provider that re-authenticates connections on release,
    redis-py's own OpenTelemetry metrics enabled when the pool was made) takes redis-py's
    full path.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean = _lean_path_allowed(self.connection_kwargs)
        self._fast = _INTERNALS_OK
        self.connection_class = direct_write(self.connection_class)
        #: When each available connection was last given back (``time.monotonic()``), by id.
        self._idle_since: dict[int, float] = {}
        self._closing: set[asyncio.Task[Any]] = set()

    def _nobody_waits(self) -> bool:
        if not self._fast:
            return False
        waiters = getattr(self._condition, "_waiters", None)
        return waiters is not None and not waiters and not getattr(self, "_in_maintenance", True)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection; waits up to ``timeout`` seconds when all are in use."""
        if self._available_connections and self._nobody_waits():
            if self._lean:
                connection = self._available_connections.pop()
                if connection.is_connected:
                    if not await _has_unread(connection):
                        self._in_use_connections.add(connection)
                        return connection
                    # A reply nobody read (redis-py's full path would hand the connection
                    # on as it is while its maintenance notifications are on): reopen it.
                    await connection.disconnect(nowait=True)
                self._available_connections.append(connection)  # taken again just below
            return await aioredis.ConnectionPool.get_connection(self)  # type: ignore[no-untyped-call]
        return await super().get_connection()  # type: ignore[no-untyped-call]

    async def release(self, connection: Any) -> None:
        """Return ``connection``; wake a queued caller if there is one. Closes the least
        recently used available connection once it sat unused :data:`IDLE_CLOSE` seconds
        (the most recently used one always stays)."""
        if self._fast:
            self._idle_since[id(connection)] = time.monotonic()
            self._close_idle()
        if self._nobody_waits():
            if self._lean and not _reconnect_due(connection):
                self._in_use_connections.remove(connection)
                self._available_connections.append(connection)
                return
            await aioredis.ConnectionPool.release(self, connection)
        else:
            await super().release(connection)

    def _closed(self, task: asyncio.Task[Any]) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed close of an unused connection is no error

    def _close_idle(self) -> None:
        """Close the available connection unused longest if it sat :data:`IDLE_CLOSE` s
        (connections are taken last in, first out: that one is the bottom of the list)."""
        available = self._available_connections
        if not available:
            return
        oldest = available[0]
        since = self._idle_since.get(id(oldest))
        if since is None or time.monotonic() - since < IDLE_CLOSE:
            return
        available.pop(0)
        del self._idle_since[id(oldest)]
        task = asyncio.get_running_loop().create_task(oldest.disconnect())
        self._closing.add(task)
        task.add_done_callback(self._closed)


class _DirectWrite:
    """Mixin of a redis-py connection class: a command is packed by hiredis (in C) and
    written to the socket directly, and only a write the kernel did not take at once is
    waited for (under ``socket_timeout``, by redis-py's own path).

    redis-py's asyncio connections pack commands in Python: 11 us for a completion's
    ``EVALSHA`` of 13 arguments here, against 1.6 us for ``hiredis.pack_command`` (the same
    bytes; redis-py's sync client uses it too). Arguments hiredis does not take (a
    ``memoryview``, a ``bool``, ``None``), a command name with a space (``"CLIENT SETNAME"``)
    and an encoding other than strict UTF-8 go through redis-py's own packing, whose errors
    (``DataError``) are unchanged.

    redis-py wraps every write in ``asyncio.wait_for``, which on Python 3.11 makes a task and
    costs a turn of the event loop per command (10-20 µs of CPU here, ``bench/README.md``);
    the write itself almost never waits. That task also runs a turn later, when another task
    sharing the connection (a pub/sub reader) may have reset it: redis-py then raised
    ``AttributeError`` (no writer). Here a closed connection is opened first (as redis-py's
    own write path opens it), a lost one is closed and opened again (a write to it would
    be dropped), and one reset while this write waited to start raises the connection error
    that redis-py retries.
    """

    _writer: Any
    _packs_utf8: bool | None = None  # the encoder is strict UTF-8 (hiredis's): set at first use

    def pack_command(self, *args: Any) -> list[bytes]:
        """The RESP bytes of one command (a list of one ``bytes``); see the class docstring.

        Raises:
            redis.exceptions.DataError: an argument redis-py cannot encode either.
        """
        name = args[0]
        one_word = (
            (" " not in name) if type(name) is str else (type(name) is bytes and b" " not in name)
        )
        if one_word:
            utf8 = self._packs_utf8
            if utf8 is None:
                utf8 = self._packs_utf8 = _strict_utf8(self.encoder)  # type: ignore[attr-defined]
            if utf8:
                try:
                    return [_hiredis_pack(args)]
                except TypeError:
                    pass  # redis-py packs what hiredis refuses, or raises its DataError
        packed: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
        return packed

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Write ``command`` (bytes or a list of bytes); see the class docstring.

        Raises:
            redis.exceptions.ConnectionError: the connection could not be opened, or was
                reset by another task meanwhile; ``TimeoutError``: a write that had to wait
                did not finish within ``socket_timeout``.
        """
        if isinstance(command, str):
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        writer = self._writer
        if writer is not None and writer.transport.is_closing():
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            writer = None
        if writer is None:  # opened as redis-py's own write path opens it
            opening = getattr(self, "connect_check_health", None)
            await (opening(check_health=False) if opening else self.connect())  # type: ignore[attr-defined]
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        writer = self._writer
        if writer is None or writer.transport.is_closing():
            raise RedisConnectionError("the connection was reset while a command was sent")
        writer.writelines([command] if isinstance(command, bytes) else command)
        if writer.transport.get_write_buffer_size():
            try:
                await super().send_packed_command([], False)  # type: ignore[misc]
            except AttributeError as exc:  # its write task met a reset by another task
                raise RedisConnectionError("the connection was reset during a write") from exc


def _strict_utf8(encoder: Any) -> bool:
    """Whether redis-py's ``encoder`` encodes text as hiredis does (strict UTF-8); an unknown
    encoding counts as not (redis-py's own packing then reports it)."""
    try:
        return bool(
            codecs.lookup(encoder.encoding).name == "utf-8" and encoder.encoding_errors == "strict"
        )
    except LookupError:
        return False


_DIRECT: dict[type, type] = {}


def direct_write(connection_class: type) -> type:
    """``connection_class`` with :class:`_DirectWrite` mixed in (made once per class), or
    ``connection_class`` itself when the installed redis-py lacks what it uses
    (:func:`missing_internals`)."""
    if not _INTERNALS_OK or issubclass(connection_class, _DirectWrite):
        return connection_class
    made = _DIRECT.get(connection_class)
    if made is None:
        made = _DIRECT[connection_class] = type(
            connection_class.__name__, (_DirectWrite, connection_class), {}
        )
    return made


def _lean_path_allowed(connection_kwargs: dict[str, Any]) -> bool:
    """Whether :class:`BoundedPool` may skip redis-py's per-call pool bookkeeping: no
    credential provider (a streaming one re-authenticates connections as they are released)
    and redis-py's own metrics not enabled."""
    if connection_kwargs.get("credential_provider") is not None:
        return False
    try:
        from redis.asyncio.observability.recorder import _get_or_create_collector
    except ImportError:  # a redis-py without observability: nothing is recorded anyway
        return True
    try:
        return _get_or_create_collector() is None
    except Exception:  # an observability set-up that fails here would fail on every call
        return False


def _reconnect_due(connection: Any) -> bool:
    """Whether redis-py marked ``connection`` to be reopened on release (maintenance
    notifications; redis-py < 6 has no such mark)."""
    due = getattr(connection, "should_reconnect", None)
    return bool(due()) if due is not None else False


async def _has_unread(connection: Any) -> bool:
    """Whether an open pooled connection holds unread bytes (a reply left by a cancelled
    call) or is at EOF; an error reading that counts as unread (the full path reconnects).
    redis-py < 8 has only ``can_read_destructive``, which may read what is there into the
    parser: a connection it finds anything on is closed, so nothing read is lost."""
    can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
    try:
        return bool(await can_read())
    except Exception:
        return True


#: redis-py's own ``Redis.execute_command`` (as imported: an instrumentation that wrapped it
#: first is seen by :func:`plain_execute` through its ``__wrapped__``).
_REDIS_EXECUTE = aioredis.Redis.execute_command


def plain_execute(client: Any) -> bool:
    """Whether ``client``'s ``execute_command`` is redis-py's own, neither replaced on the
    instance (an application's hook, a test's fault) nor wrapped on the class (tracing
    instrumentation, e.g. OpenTelemetry's for redis-py): only then may a command skip it
    (:func:`run_direct`), so that a wrapper still sees every command."""
    method = getattr(client.execute_command, "__func__", None)
    return method is _REDIS_EXECUTE and not hasattr(method, "__wrapped__")


def direct_pool(client: Any, command: str) -> BoundedPool | None:
    """The pool on which :func:`run_direct` may run ``command`` for ``client``, or ``None``.

    Only a plain ``redis.asyncio.Redis`` (not a subclass: Sentinel's client adds ``WAIT``
    to its commands) with no single connection of its own, on a :class:`BoundedPool` (not a
    subclass) whose lean path is on (:func:`_lean_path_allowed`: no credential provider, no
    redis-py metrics) and with the fast paths' internals present, and only a command that
    has no response callback on it (its reply is used raw either way).

    Args:
        client: any client object.
        command: the command name, as redis-py's ``response_callbacks`` spell it.
    """
    pool = getattr(client, "connection_pool", None)
    if (
        type(client) is aioredis.Redis
        and type(pool) is BoundedPool
        and pool._lean
        and pool._fast
        and not client.single_connection_client
        and command not in client.response_callbacks
    ):
        return pool
    return None


async def run_direct(pool: BoundedPool, args: tuple[Any, ...]) -> Any:
    """Run the command ``args`` on a connection of ``pool`` and return its raw reply.

    What redis-py's ``Redis.execute_command`` does for a command with no response callback
    on a client :func:`direct_pool` accepts, without its layers (a closure, its retry's
    wrapper call, a per-command check for ``HIMPORT``, its observability records and the
    pool's own bookkeeping): the connection is taken and given back through the pool (its
    fast path), the command packed and written as every command is
    (:class:`_DirectWrite`), the reply read under ``socket_timeout``, and a connection
    error retried as redis-py retries it (the connection's ``retry``, the connection
    closed before each new try).

    Raises:
        redis.exceptions.RedisError: the server's error reply (``ResponseError`` and its
            kinds, ``NoScriptError`` among them), a read timeout (``TimeoutError``, not
            retried), a connection error after the retries.
    """
    conn = await pool.get_connection()
    try:
        return await conn.retry.call_with_retry(
            lambda: _send_and_read(conn, args),
            lambda error, failures: conn.disconnect(error=error, failure_count=failures),
            with_failure_count=True,
        )
    finally:
        await pool.release(conn)


async def _send_and_read(conn: Any, args: tuple[Any, ...]) -> Any:
    """One try of :func:`run_direct` on ``conn``."""
    await conn.send_packed_command(conn.pack_command(*args))
    return await conn.read_response()
