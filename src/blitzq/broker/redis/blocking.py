"""The one blocking read of an idle worker, on a connection of its own that can be woken.

An idle worker blocks on all its queues and their priority levels in one command
(``XREADGROUP ... BLOCK`` over every stream, or ``BLMPOP`` over every list: see
:meth:`~blitzq.broker.transport.Transport.block_first`), instead of one blocked command per
queue. That command runs here, on one connection taken from the broker's pool and held for the
broker's life, whose server-side id (``CLIENT ID``) is known: :meth:`BlockingReads.unblock`
ends the read early with ``CLIENT UNBLOCK <id>`` (sent on another connection of the pool),
which the server answers as if the block had timed out: nothing is taken. The worker does so
when a queue that was busy falls idle while the read is blocked (so the next read covers it at
once, instead of after the block) and when it stops (a stop never waits out a block).

The id is read once per TCP connection: a reconnection (a dropped connection, a Sentinel
failover) clears it through redis-py's connect callback, and the next read asks again. A
wake-up that finds no known id does nothing; the read then ends at its timeout, as before
(so does every wake-up of a user whose ACL refuses ``CLIENT ID`` or ``CLIENT UNBLOCK``).

Replies are read as fast mode's pops are (:func:`~.popping.send_and_read`): a pause of the
process or a stall of the network longer than the socket timeout does not drop a reply the
server sent, so a ``BLMPOP``'s messages are never lost to a client-side timeout. On a Redis
Cluster (fast mode's lists and ``?layout=slot``'s streams are all in the namespace's slot)
the connection is taken from the node owning that slot (:class:`NodePool`), and given back
after any error so that the next read follows a failover or a moved slot; the spread
layout's streams are in a slot per queue, so its idle worker is woken by a doorbell instead
(``doorbell.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ResponseError

from .client import socket_timeout
from .popping import REPLY_WAIT, send_and_read


class BlockingReads:
    """Runs the idle worker's blocking command on a held, wakeable connection.

    Args:
        client: the broker's ``redis.asyncio.Redis`` (single server or Sentinel; not a
            cluster client): its pool lends the held connection, and ``CLIENT UNBLOCK`` goes
            through it.
    """

    def __init__(self, client: Any, pool: NodePool | None = None) -> None:
        self._client = client
        self._pool: Any = client.connection_pool if pool is None else pool
        #: On a cluster, the node's pool (the connection is given back after an error, and
        #: the next read takes one from whichever node owns the slot then).
        self._node_pool = pool
        self._timeout = socket_timeout(client) or 0.0
        self._conn: Any = None
        #: The held connection's ``CLIENT ID`` on the server; ``None`` after a reconnection.
        self._id: int | None = None
        #: Whether the server lets this user ask its connection's id (an ACL may not).
        self._ask_id = True
        #: Whether a blocking command is on the server now (what :meth:`unblock` wakes).
        self._blocked = False
        self._lock = asyncio.Lock()

    def _reconnected(self, _conn: Any) -> None:
        """redis-py's connect callback: a new TCP connection has a new id."""
        self._id = None

    async def _held(self) -> Any:
        if self._conn is None:
            self._conn = await self._pool.get_connection()
            self._conn.register_connect_callback(self._reconnected)
        elif not self.on_primary():
            # The pool follows the primary the sentinels name (sentinel.py); the held
            # connection is never given back to it, so it moves here: it reconnects (to the
            # new primary) at its next command.
            await self._conn.disconnect()
        return self._conn

    @property
    def node(self) -> Any:
        """On a cluster, the node the held connection was taken from (``None`` before the
        first read, and off a cluster)."""
        return None if self._node_pool is None else self._node_pool.node

    def on_primary(self) -> bool:
        """Whether the held connection is on the server its pool takes for the primary
        (always, off Sentinel, or while it is not connected)."""
        primary = getattr(self._pool, "master_address", None)
        conn = self._conn
        if primary is None or conn is None or not conn.is_connected:
            return True
        return (str(conn.host), int(conn.port)) == (str(primary[0]), int(primary[1]))

    async def run(self, *args: Any, block: float) -> Any:
        """Send the blocking command ``args`` and return its raw reply (no response
        callback); one at a time.

        Args:
            args: the command (``XREADGROUP ... BLOCK <ms> ...`` or ``BLMPOP <s> ...``).
            block: seconds the server may block on it.

        Raises:
            redis.exceptions.RedisError: the server refused it, the connection failed (after
                the pool's retries) or no reply came within the block plus the reply wait
                (the connection is then closed).
        """
        async with self._lock:
            conn = await self._held()
            budget = block + max(self._timeout, REPLY_WAIT)
            try:
                if self._id is None and self._ask_id:
                    try:
                        self._id = int(await send_and_read(conn, ("CLIENT", "ID"), budget))
                    except ResponseError:  # an ACL without CLIENT: never woken, reads go on
                        self._ask_id = False
                self._blocked = True
                return await conn.retry.call_with_retry(
                    lambda: send_and_read(conn, args, budget),
                    lambda _error: conn.disconnect(),
                )
            except BaseException:
                self._id = None
                if self._node_pool is not None:  # a failover or a move: ask the map again
                    self._conn = None
                    conn.deregister_connect_callback(self._reconnected)
                    await conn.disconnect(nowait=True)
                    await self._node_pool.release(conn)
                raise
            finally:
                self._blocked = False

    async def command(self, *args: Any) -> Any:
        """Send a non-blocking command on the held connection (after :meth:`run`: a ``WAIT``
        for the replicas, which counts the writes of this connection) and return its raw
        reply.

        Raises:
            redis.exceptions.RedisError: the server refused it, or the connection failed or
                did not answer within ``socket_timeout`` (the connection is then closed).
        """
        async with self._lock:
            conn = await self._held()
            try:
                return await send_and_read(conn, args, max(self._timeout, 1.0))
            except BaseException:
                self._id = None
                raise

    async def unblock(self) -> bool:
        """End the blocking command in flight early, as if its block had timed out (it takes
        nothing); ``False`` when none is in flight, its connection's id is not known, or the
        server had answered it already."""
        ident = self._id
        if not self._blocked or ident is None:
            return False
        target = {} if self._node_pool is None else self._node_pool.target()
        try:
            return bool(await self._client.execute_command("CLIENT", "UNBLOCK", ident, **target))
        except Exception:  # the read then ends at its timeout, as without the wake-up
            return False

    async def close(self) -> None:
        """Give the held connection back to the pool (the broker is closing)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.deregister_connect_callback(self._reconnected)
            await self._pool.release(conn)


class NodePool:
    """Where :class:`BlockingReads` takes its held connection on a Redis Cluster: from the
    primary owning ``key``'s slot when it is taken (a fast-mode namespace's lists share the
    namespace's slot, so one ``BLMPOP`` covers them all there too).

    Args:
        client: the broker's ``RedisCluster`` (its slot map loaded).
        key: a key of the slot the blocking reads name.
    """

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._key = key
        self._node: Any = None

    async def get_connection(self) -> Any:
        """A connection of the node that owns the slot now."""
        await self._client.initialize()  # nothing once the slot map is loaded
        self._node = self._client.get_node_from_key(self._key)
        return self._node.acquire_connection()

    async def release(self, conn: Any) -> None:
        """Give ``conn`` back to the node it came from."""
        if self._node is not None:
            self._node.release(conn)

    @property
    def node(self) -> Any:
        """The node the last connection was taken from (``None`` before the first)."""
        return self._node

    def target(self) -> dict[str, Any]:
        """Keyword arguments sending a command (``CLIENT UNBLOCK``) to that node."""
        return {} if self._node is None else {"target_nodes": self._node}
