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
- it counts only the time the event loop ran: it is checked every :data:`TICK` seconds (one
  timer per event loop checks every read in flight, :class:`_Watch`, not one timer per
  pop), and a check that comes late (the process was stopped, or the loop blocked) counts as
  one tick and never ends the read, so a reply that arrived meanwhile is read first;
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
import weakref
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


class _Watch:
    """The deadlines of every read in flight on one event loop, checked together every
    :data:`TICK` seconds by one timer (see the module docstring).

    A read registers its ``asyncio.timeout`` scope and budget (:meth:`add`) and removes them
    when it ends (:meth:`discard`): no timer of its own is made and cancelled per read (a
    drain pops thousands of times a second, each pop's timer a heap entry). Each check
    charges every read the loop's running time since it was last charged; a check at least
    twice as late as asked (the process was stopped, or the loop blocked) charges each one
    :data:`TICK` and ends none, so a reply that came meanwhile is read first. A read whose
    budget is spent at a check on time is ended (``scope.reschedule``: ``asyncio.timeout``
    raises in it). The timer is armed while any read is in flight.
    """

    __slots__ = ("_armed", "_at", "_reads")

    def __init__(self) -> None:
        #: Each read's scope -> [seconds of its budget left, when it was last charged].
        self._reads: dict[asyncio.Timeout, list[float]] = {}
        self._armed = False
        self._at = 0.0  # when the timer was armed (a check later than 2 TICK is late)

    def add(self, loop: asyncio.AbstractEventLoop, scope: asyncio.Timeout, budget: float) -> None:
        """Watch the read of ``scope`` for ``budget`` seconds of ``loop``'s running time."""
        now = loop.time()
        self._reads[scope] = [budget, now]
        if not self._armed:
            self._armed = True
            self._at = now
            loop.call_at(now + min(TICK, budget), self._check, loop)

    def discard(self, scope: asyncio.Timeout) -> None:
        """Stop watching the read of ``scope`` (it ended, or was ended)."""
        self._reads.pop(scope, None)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        late = now - self._at > 2 * TICK
        wait = TICK
        for scope, left in list(self._reads.items()):
            left[0] -= TICK if late else now - left[1]
            left[1] = now
            if late:
                continue  # a whole tick: the reply that came meanwhile is read first
            if left[0] <= 0:
                del self._reads[scope]
                scope.reschedule(now)  # ends the read now: asyncio.timeout raises
            else:
                wait = min(wait, max(left[0], 0.01))
        self._armed = bool(self._reads)
        if self._armed:
            self._at = now
            loop.call_at(now + wait, self._check, loop)


#: The :class:`_Watch` of each event loop (a loop's watch holds no reference to it).
_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = weakref.WeakKeyDictionary()
#: The loop last asked for and its watch (most processes run one loop: no weak lookup).
_last: tuple[weakref.ReferenceType[asyncio.AbstractEventLoop], _Watch] | None = None


def _watch(loop: asyncio.AbstractEventLoop) -> _Watch:
    """``loop``'s :class:`_Watch` (made on first use); a loop that takes no weak reference
    gets a watch of its own per read (one timer per read, as a watch of one read is)."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    try:
        watch = _watches.get(loop)
        if watch is None:
            watch = _watches[loop] = _Watch()
        _last = (weakref.ref(loop), watch)
    except TypeError:  # no weak reference to this loop's class
        return _Watch()
    return watch


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
    of the event loop's running time (see :class:`_Watch`); past it the connection is
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
    watch = _watch(loop)
    replies: list[Any] = []
    try:
        async with asyncio.timeout(None) as scope:
            watch.add(loop, scope, budget)
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
                watch.discard(scope)
    except TimeoutError:
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError(
            f"no reply to {commands[len(replies)][0]} within {budget:g} s while this process "
            "ran; connection closed"
        ) from None
    return replies
