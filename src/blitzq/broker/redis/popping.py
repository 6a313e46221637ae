"""Pops that a client-side timeout does not drop (fast mode's lists, at-most-once).

A pop (``LPOP``, ``BLMPOP``, the ``pop_levels`` script) takes its messages out of Redis the
moment the server runs it: the reply is then their only copy. redis-py ends a read that
takes longer than ``socket_timeout`` by closing the connection, and the reply with it, so a
reply late by more than that lost its messages. Two ways that happened (issue 28, item 5):

- the worker was paused (SIGSTOP, a stopped container, a VM migration) for longer than
  ``socket_timeout``: the reply arrived while it was stopped, and when it resumed the read's
  timer fired in the same turn of the event loop as the socket became readable, and won;
- the network stalled between the server's answer and the worker until the read's
  ``socket_timeout``, counted from the command, ran out (a 5.4 s stall in the soak).

:class:`Popper` runs these commands with a deadline of its own instead of redis-py's:

- it lasts the server's block plus :data:`REPLY_WAIT` (30 s, or ``socket_timeout`` when that
  is longer), so no client deadline is ever shorter than the server's block, and a stall
  of the network shorter than that costs time, not messages: only a connection that died
  ends it (TCP keepalive finds a peer gone silent in about 45 s anyway);
- it counts only the time the event loop ran: it is checked every :data:`TICK` seconds, and
  a check that comes late (the process was stopped, or the loop blocked) counts as one tick
  and never ends the read, so a reply that arrived meanwhile is read first;
- when it does end the read (no reply for that long while the worker ran), the connection
  is closed, never reused: a reply still on its way cannot be read as the answer to another
  command. Its messages are lost then, as on a connection that died after the server
  popped: the remaining windows of loss are listed in ``docs/guarantees.md``.

A connection error is retried as on every command (``client.py``). A Redis Cluster client
(no single pool) and a client without ``socket_timeout`` take redis-py's own path.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .client import socket_timeout

#: Seconds a pop waits for its reply beyond the server's block (``socket_timeout`` when
#: that is longer): a reply later than that is taken for a dead connection.
REPLY_WAIT = 30.0

#: Seconds between two checks of a pop's deadline (a check at least twice as late as asked
#: counts as one tick: the process was stopped or the event loop blocked).
TICK = 0.5


class _Deadline:
    """Ends ``scope`` (an ``asyncio.timeout``) once ``budget`` seconds of the event loop's
    running time have passed; see the module docstring."""

    __slots__ = ("_at", "_handle", "_left", "_loop", "_scope")

    def __init__(self, loop: asyncio.AbstractEventLoop, scope: asyncio.Timeout, budget: float):
        self._loop = loop
        self._scope = scope
        self._left = budget
        self._at = loop.time()
        self._handle = loop.call_at(self._at + min(TICK, budget), self._check)

    def _check(self) -> None:
        now = self._loop.time()
        ran, self._at = now - self._at, now
        late = ran > 2 * TICK
        self._left -= TICK if late else ran
        if self._left <= 0 and not late:
            self._scope.reschedule(now)  # ends the read now: asyncio.timeout raises
            return
        # After a late check, a whole tick: the reply that came meanwhile is read first.
        wait = TICK if late else min(TICK, max(self._left, 0.01))
        self._handle = self._loop.call_at(now + wait, self._check)

    def cancel(self) -> None:
        """Stop checking (the read ended)."""
        self._handle.cancel()


class Popper:
    """Runs popping commands on ``client``'s pool with a deadline a pause cannot trip.

    It has the two methods :class:`~.scripts.Scripts` needs of a client (``execute_command``
    and ``script_load``), so the ``pop_levels`` script runs through it too.

    Args:
        client: the broker's ``redis.asyncio.Redis`` (its pool, ``socket_timeout`` and
            connection-error retries are used).
    """

    __slots__ = ("_client", "_pool", "_timeout")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool = getattr(client, "connection_pool", None)
        self._timeout = socket_timeout(client)

    async def execute_command(self, *args: Any, block: float = 0.0) -> Any:
        """Send one command and return its raw reply (no response callback).

        Args:
            args: the command and its arguments.
            block: seconds the server may block on it (``BLMPOP``'s timeout), 0 for none.

        Raises:
            redis.exceptions.TimeoutError: no reply within ``block`` plus :data:`REPLY_WAIT`
                (or ``socket_timeout``, the longer) seconds of the event loop's running time;
                the connection is closed.
            redis.exceptions.RedisError: the server refused the command, or the connection
                failed (after the client's retries).
        """
        pool, timeout = self._pool, self._timeout
        if pool is None or timeout is None:
            return await self._client.execute_command(*args)
        conn = await pool.get_connection()
        try:
            return await conn.retry.call_with_retry(
                lambda: send_and_read(conn, args, block + max(timeout, REPLY_WAIT)),
                lambda _error: conn.disconnect(),
            )
        finally:
            await pool.release(conn)

    @property
    def direct(self) -> bool:
        """Whether this popper runs its commands with its own deadline (one pool and a
        ``socket_timeout``: not a Cluster client); :meth:`execute_many` needs it."""
        return self._pool is not None and self._timeout is not None

    async def execute_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` in one write on one connection and read their raw replies, in
        order, within one deadline (as :meth:`execute_command`'s; none may block).

        An error reply is returned in its place (a ``redis.exceptions.ResponseError``
        instance), never raised: the other commands ran.

        Raises:
            RuntimeError: the popper is not :attr:`direct`.
            redis.exceptions.TimeoutError: no reply within :data:`REPLY_WAIT` (or
                ``socket_timeout``, the longer) seconds of the event loop's running time;
                the connection is closed.
            redis.exceptions.RedisError: the connection failed (after the client's
                retries: each try sends every command again).
        """
        pool, timeout = self._pool, self._timeout
        if pool is None or timeout is None:
            raise RuntimeError("execute_many needs a single pool and a socket_timeout")
        conn = await pool.get_connection()
        try:
            replies: list[Any] = await conn.retry.call_with_retry(
                lambda: send_and_read_all(conn, commands, max(timeout, REPLY_WAIT)),
                lambda _error: conn.disconnect(),
            )
            return replies
        finally:
            await pool.release(conn)

    async def script_load(self, source: str) -> Any:
        """``SCRIPT LOAD source`` on the client (nothing is popped)."""
        return await self._client.script_load(source)


async def send_and_read(conn: Any, args: tuple[Any, ...], budget: float) -> Any:
    """Send ``args`` on connection ``conn`` and read its raw reply, within ``budget`` seconds
    of the event loop's running time (see :class:`_Deadline`); past it the connection is
    closed and :class:`redis.exceptions.TimeoutError` raised."""
    await conn.send_command(*args)
    return (await _read(conn, (args,), budget))[0]


async def send_and_read_all(
    conn: Any, commands: tuple[tuple[Any, ...], ...], budget: float
) -> list[Any]:
    """Send ``commands`` on ``conn`` in one write and read their raw replies, all within one
    ``budget`` (see :func:`send_and_read`); error replies are returned in their place."""
    await conn.send_packed_command(conn.pack_commands(commands))
    return await _read(conn, commands, budget, errors=True)


async def _read(
    conn: Any, commands: tuple[tuple[Any, ...], ...], budget: float, errors: bool = False
) -> list[Any]:
    """Read one raw reply per command of ``commands`` on ``conn`` within ``budget`` (see
    :func:`send_and_read`); ``errors``: an error reply is returned in its place, else
    raised."""
    loop = asyncio.get_running_loop()
    replies: list[Any] = []
    try:
        async with asyncio.timeout(None) as scope:
            deadline = _Deadline(loop, scope, budget)
            try:
                for _ in commands:
                    # math.inf: no read timeout of redis-py's own (redis-py closes the
                    # connection on the cancellation of this read).
                    try:
                        replies.append(await conn.read_response(timeout=math.inf))
                    except ResponseError as error:
                        if not errors:
                            raise
                        replies.append(error)
            finally:
                deadline.cancel()
    except TimeoutError:
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError(
            f"no reply to {commands[len(replies)][0]} within {budget:g} s while this process "
            "ran; connection closed"
        ) from None
    return replies
