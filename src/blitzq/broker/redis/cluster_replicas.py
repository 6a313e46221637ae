"""Durable writes on a Redis Cluster with replicas: ``WAIT`` on the shard that took the write.

A cluster's primaries replicate asynchronously, as a Sentinel primary does: a worker that
fetches a task on a shard, runs it and records it there may see its record go with that
shard's primary when a replica that had not heard of it is promoted. So, as on
``redis+sentinel://`` (``sentinel.py``), a worker's fetches and completions (the commands run
under :data:`~.replicas.durable_writes`: a script call, ``XREADGROUP``) are followed, **on the
same connection to the same node** (``WAIT`` counts the writes of its own connection), by
``WAIT <n> <timeout>``, ``n`` the replicas that exist for that shard (at most one is asked for):
the primary's connected replicas, read with ``ROLE`` at most every
:data:`~.replicas.REPLICAS_CHECK` seconds by a :class:`~.replicas.ReplicaWatch` per node (the
logic Sentinel's client uses: a replica gone from the list that answers as promoted marks the
node **superseded**, and it gets no durable command until the slot map names another).

- A producer's writes of messages (:data:`~.replicas.enqueue_writes`: an enqueue, a
  schedule, a unique enqueue, a dead-letter replay) are durable the same way, unless the URL
  says ``wait_replicas=0`` (:attr:`ShardReplicas.enqueues`); a lease renewal never is.
- A shard without a replica (a cluster without replicas, or a promoted replica before the
  old primary rejoins) sends the command alone: it pays one ``ROLE`` a second per node.
- A ``WAIT`` that falls short raises :class:`~blitzq.BrokerError` (transient,
  ``unavailable``, ``unreplicated``; from an enqueue, :class:`~blitzq.OutcomeUnknown`): a
  fetch starts nothing (its entries stay leased and are recovered after the visibility
  timeout), a completion is kept and retried (its delivery is not acknowledged before its
  record is on a replica).
- A superseded node raises the same error without sending the command, and the slot map is
  read again (the next command goes to the promoted replica once the cluster names it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from ...exceptions import BrokerError
from .replicas import (
    DEFAULT_WAIT_TIMEOUT,
    ReplicaWatch,
    check_acknowledged,
    durable_writes,
    enqueue_writes,
)


class ShardReplicas:
    """The replicas each shard's durable commands wait for on one cluster client.

    Args:
        client: the ``redis.asyncio.cluster.RedisCluster`` whose nodes are watched (its slot
            map is read again when a node is found superseded).
        credentials: ``username``/``password`` of the nodes (a replica gone from a primary's
            list is asked its ``ROLE`` with them).
        wait_timeout: seconds a ``WAIT`` lasts at most.
        enqueues: whether a producer's writes are durable (the URL's ``wait_replicas=0``:
            ``False``).
        enqueue_wait_timeout: seconds the ``WAIT`` of a producer's write lasts at most
            (:func:`~.replicas.enqueue_wait_timeout`; default: ``wait_timeout``).

    Attributes:
        wait_timeout: as given.
        enqueues: as given.
        enqueue_wait_timeout: as given.
    """

    def __init__(
        self,
        client: Any,
        credentials: dict[str, Any],
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        enqueues: bool = True,
        enqueue_wait_timeout: float | None = None,
    ) -> None:
        self._client = client
        self._credentials = credentials
        self.wait_timeout = wait_timeout
        self.enqueues = enqueues
        self.enqueue_wait_timeout = (
            wait_timeout if enqueue_wait_timeout is None else enqueue_wait_timeout
        )
        self._watches: dict[tuple[str, int], ReplicaWatch] = {}

    def durable_now(self) -> bool:
        """Whether the commands run now are durable: a worker's fetch or completion
        (:data:`~.replicas.durable_writes`), or a producer's write of messages
        (:data:`~.replicas.enqueue_writes`) unless :attr:`enqueues` is off."""
        return durable_writes.get() or (self.enqueues and enqueue_writes.get())

    def _watch(self, primary: tuple[str, int]) -> ReplicaWatch:
        watch = self._watches.get(primary)
        if watch is None:
            watch = self._watches[primary] = ReplicaWatch(self._credentials)
        return watch

    async def wanted(self, node: Any) -> int:
        """Replicas (0 or 1) a durable command on ``node`` must reach now; 0: send it
        unwaited.

        Raises:
            BrokerError: (transient, ``unavailable``) one of the node's replicas answers as
                promoted (a failover of that shard is under way): the slot map is read again.
            redis.exceptions.RedisError: ``ROLE`` failed.
        """
        primary = (str(node.host), int(node.port))
        watch = self._watch(primary)
        count = await watch.count(node, primary)
        if watch.superseded is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._client.nodes_manager.initialize()
            raise BrokerError(
                f"the cluster node {primary[0]}:{primary[1]} may be being replaced (one of "
                "its replicas was promoted, or left it and does not answer): the command was "
                "not sent",
                unavailable=True,
            )
        return min(1, count)

    async def run(
        self, node: Any, args: Sequence[Any], *, asking: bool = False, **options: Any
    ) -> Any:
        """Run the durable command ``args`` on ``node``, followed by ``WAIT`` on the same
        connection when the node has replicas (:meth:`wanted`); its reply. With ``asking``
        (an ``ASK`` redirection to ``node``: its slot is being imported) the command is
        preceded by ``ASKING`` on that connection.

        Raises:
            BrokerError: (transient, ``unavailable``) fewer replicas acknowledged it within
                :attr:`wait_timeout` (it was applied by the primary), or the node is
                superseded (it was not sent).
            redis.exceptions.RedisError: the node refused the command (``MOVED``...), or the
                connection failed.
        """
        wanted = await self.wanted(node)
        if not wanted and not asking:
            return await node.execute_command(*args, **options)
        producing = not durable_writes.get() and enqueue_writes.get()
        timeout = self.enqueue_wait_timeout if producing else self.wait_timeout
        reply, acknowledged = await _with_wait(node, args, wanted, timeout, options, asking)
        if not wanted:
            return reply
        check_acknowledged(
            self._watch((str(node.host), int(node.port))),
            str(args[0]),
            acknowledged,
            wanted,
            timeout,
        )
        return reply

    async def settle(self, node: Any, send: Any, what: str) -> None:
        """Wait for ``node``'s replicas on the connection that ran a durable command (``send``
        sends one command there and returns its reply): the ``?layout=slot`` blocking read,
        which took entries on a held connection (``blocking.py``).

        Raises:
            BrokerError: as :meth:`run`.
        """
        wanted = await self.wanted(node)
        if wanted:
            acknowledged = await send("WAIT", wanted, int(self.wait_timeout * 1000))
            watch = self._watch((str(node.host), int(node.port)))
            check_acknowledged(watch, what, acknowledged, wanted, self.wait_timeout)


async def _with_wait(
    node: Any,
    args: Sequence[Any],
    wanted: int,
    timeout: float,
    options: dict[str, Any],
    asking: bool = False,
) -> tuple[Any, Any]:
    """``args`` then ``WAIT wanted <timeout>`` (none when ``wanted`` is 0) in one round trip
    on one connection of ``node``, after ``ASKING`` when ``asking``: the command's reply (an
    error reply raised) and ``WAIT``'s (``None`` without it)."""
    commands: list[tuple[Any, ...]] = [("ASKING",)] if asking else []
    commands.append(tuple(args))
    if wanted:
        commands.append(("WAIT", wanted, int(timeout * 1000)))
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_packed_command(connection.pack_commands(commands))
        if asking:
            await node.parse_response(connection, "ASKING")
        try:
            reply: Any = await node.parse_response(connection, args[0], **options)
        except RedisError as exc:
            reply = exc
        acknowledged = await node.parse_response(connection, "WAIT") if wanted else None
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        node.release(connection)
    if isinstance(reply, RedisError):
        raise reply
    return reply, acknowledged


__all__ = ["ShardReplicas"]
