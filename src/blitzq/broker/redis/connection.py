"""The connection a Redis transport and the Redis state store share (client, keys, scripts).

:class:`RedisConnection` is made once per broker and handed to both halves: the transport
(``streams.py`` or ``lists.py``) and the state store (``store.py``, composed of role objects:
``records.py``, ``schedule.py``, ``dead_letters.py``, ``control_state.py``, ``registry.py``,
``operator_state.py``). The transport and each role object derive from :class:`RedisPart`,
which reads the connection's client, key table, scripts and listener as its own attributes.
Every Redis command blitzq sends lives under this package.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from ...exceptions import ConfigurationError
from ...limits import DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from .blocking import BlockingReads, NodePool
from .client import bad_url, make_client, max_block, pool_size, translate_errors
from .cluster import is_cluster, node_of
from .doorbell import Doorbell
from .keys import Keys
from .result_listener import ResultListener
from .scripts import Scripts

#: Dead letters kept per namespace before the oldest are dropped.
DEFAULT_DEAD_LETTER_CAP = 100_000


def _raw(response: Any, **_: Any) -> Any:
    return response


@dataclass(slots=True)
class LeaseIdentity:
    """Who holds a streams transport's leases: this process's consumer name in the groups.

    A :class:`~.streams.StreamsTransport` makes one (its ``lease``) and names it in
    ``prepare_consumer``; a :class:`~.store.RedisStateStore` that acks that transport's
    deliveries is given the same object when it is made (``RedisStateStore(conn,
    lease=transport.lease)``) and fences its completions and progress on it. Nothing else
    writes it, and a store given none fences nothing.

    Attributes:
        consumer: the consumer name (``"unnamed"`` until ``prepare_consumer``).
    """

    consumer: str = "unnamed"


class RedisConnection:
    """What every part of a Redis broker builds on: the client, the key table, the scripts
    and the shared pub/sub listener, with the settings of dead letters.

    Args:
        url: a ``redis://``, ``rediss://``, ``unix://`` URL, or a Redis Cluster node's
            (``redis+cluster://``, or a ``redis://`` that answers ``cluster_enabled:1``:
            ``cluster.py``).
        namespace: key namespace; every key is prefixed ``{namespace}:``.
        dead_letter_cap: dead letters kept before the oldest are dropped.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept before the oldest are
            dropped.
        client: an existing ``redis.asyncio.Redis`` or ``RedisCluster`` to use instead of
            ``url`` (not closed by the broker).
        kind: ``"s"`` (streams) or ``"l"`` (lists): where the transport on this connection
            keeps a queue's messages. The state store's scripts write there too (a
            promotion, a ``publish`` effect, a requeue) unless it was made with an outbox.
        listener_client: a client for the result listener alone (its pub/sub connection and
            the record reads of result waits), closed with this connection: an
            application's injected ``client`` then carries plain commands only
            (:mod:`.injected`).

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
        client: aioredis.Redis | None = None,
        dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
        kind: str = "s",
        listener_client: aioredis.Redis | None = None,
    ) -> None:
        if kind not in ("s", "l"):
            raise ConfigurationError(f"kind must be 's' (streams) or 'l' (lists), not {kind!r}")
        self.url = url
        self.kind = kind
        self.keys = Keys(namespace)
        self.dead_letter_cap = dead_letter_cap
        self.dead_letter_ttl = int(dead_letter_ttl)
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self.owns_client = client is None
        """Whether :meth:`close` closes the client (the broker made it)."""
        # Typed as Any: redis-py's stubs type replies as bytes | str whatever decode_responses is.
        if client is None:
            try:  # a bounded blocking pool with timeouts: see client.py
                client = make_client(url)
            except ValueError as exc:
                raise bad_url(url, exc) from None
        self.client: Any = client
        #: Whether the client is a Redis Cluster client (keyless commands go to the
        #: namespace's node: :meth:`node_kwargs`).
        self.cluster = is_cluster(client)
        #: Longest BLOCK a blocking read may ask for: under the socket timeout (None: any).
        self.max_block = max_block(client)
        #: The idle worker's one blocking read, on a held connection it can wake
        #: (``blocking.py``); ``None`` on a cluster (one pool per node: a block per queue).
        #: On a cluster every key of this connection's table is in the namespace's slot
        #: (fast mode's lists, ``?layout=slot``'s streams): one read covers them there too,
        #: on a connection of the node owning that slot.
        self.blocking: BlockingReads | None = (
            BlockingReads(client, NodePool(client, self.keys.prefix))
            if self.cluster
            else BlockingReads(client)
        )
        #: The spread layout's transport (each queue in a slot of its own, so no one read
        #: covers them) wakes its idle worker's looks with a doorbell instead
        #: (``doorbell.py``, set by ``spread.spread_broker``; its ``blocking`` is then None).
        self.doorbell: Doorbell | None = None
        for command in ("XREADGROUP", "XAUTOCLAIM", "BLMPOP", "LPOP"):
            self.client.set_response_callback(command, _raw)
        #: Runs the Lua scripts (EVALSHA, reloaded on NOSCRIPT): see scripts.py; on a
        #: cluster node by node, never across a slot migration (cluster_scripts.py).
        self.scripts = Scripts(self.client)
        if self.cluster:
            from .cluster_scripts import ClusterScripts  # a cluster's only (issue 29: memory)

            self.scripts = ClusterScripts(self.client)
        # One completion pattern per process on a single server (see result_listener.py); a cluster
        # client subscribes channel by channel.
        done = None if self.cluster else self.keys.done_channel("")
        #: A client of the result listener's own, closed with this connection (``None``:
        #: the listener shares :attr:`client`).
        self.listener_client: Any = listener_client
        self._results = ResultListener(listener_client or self.client, done)

    def with_kind(self, kind: str) -> RedisConnection:
        """A view of this connection for a transport of another ``kind`` (``"l"``: the fast
        lane of a reliable broker): the same client, scripts, keys and result listener.
        Never close the view: this connection closes what they share."""
        if kind not in ("s", "l"):
            raise ConfigurationError(f"kind must be 's' (streams) or 'l' (lists), not {kind!r}")
        view = copy.copy(self)
        view.kind = kind
        view.owns_client = False
        view.listener_client = None
        return view

    def queue_key(self, queue: str) -> str:
        """Key where ``queue``'s messages wait: its stream (kind ``"s"``) or list (``"l"``)."""
        return self.keys.stream(queue) if self.kind == "s" else self.keys.list(queue)

    def node_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a keyless command (``TIME``, ``INFO``): on a cluster, the
        primary owning the namespace's slot; nothing on a single server."""
        return node_of(self.client, self.keys.prefix) if self.cluster else {}

    def block_for(self, timeout: float) -> float:
        """``timeout`` (seconds) cut to :attr:`max_block`, for a blocking command.

        A block longer than the socket timeout would end in a read timeout; the fetch loop
        simply fetches again after a shorter one.
        """
        limit = self.max_block
        return timeout if limit is None or timeout <= limit else limit

    @translate_errors
    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.client.ping()

    @property
    def pool_size(self) -> int | None:
        """Most connections this broker opens (``max_connections``), ``None`` when unknown."""
        return pool_size(self.client)

    async def close(self) -> None:
        """Close the result listener and, when the broker made it, the client.

        Both halves of a broker close their shared connection: a second call is harmless
        (and the connection reconnects on its next command).
        """
        await self._results.close()
        if self.blocking is not None:
            await self.blocking.close()
        if self.listener_client is not None:
            await self.listener_client.aclose()
        if self.owns_client:
            await self.client.aclose()


class RedisPart:
    """Base of the parts of a Redis broker: a transport, or one role object of the state
    store (``store.py``), on a shared :class:`RedisConnection` whose client, keys, scripts
    and listener it reads as its own attributes.

    Args:
        conn: the connection shared with the other parts.
        kind: where this part's scripts write messages into queues: ``"s"`` (streams),
            ``"l"`` (lists) or ``"o"`` (the queue's outbox, a state store in outbox mode);
            ``None`` (the default): the connection's kind.
    """

    def __init__(self, conn: RedisConnection, kind: str | None = None) -> None:
        self.conn = conn
        self.url = conn.url
        self.keys = conn.keys
        self.client: Any = conn.client
        self.scripts = conn.scripts
        self.kind = conn.kind if kind is None else kind
        self._results = conn._results

    @property
    def pool_size(self) -> int | None:
        """Most connections the shared client opens (``max_connections``), ``None`` when
        unknown."""
        return self.conn.pool_size

    @property
    def dead_letter_cap(self) -> int:
        """Dead letters kept before the oldest are dropped (the connection's setting)."""
        return self.conn.dead_letter_cap

    @property
    def dead_letter_ttl(self) -> int:
        """Seconds a dead letter is kept (the connection's setting)."""
        return self.conn.dead_letter_ttl

    @property
    def dead_letter_max_bytes(self) -> int:
        """Total bytes of dead letters kept (the connection's setting)."""
        return self.conn.dead_letter_max_bytes

    def queue_key(self, queue: str) -> str:
        """See :meth:`RedisConnection.queue_key`; a state store in outbox mode (kind
        ``"o"``, see ``outbox.py``) writes to the queue's outbox instead."""
        return self.keys.outbox(queue) if self.kind == "o" else self.conn.queue_key(queue)

    async def wrong_types(self, wanted: dict[str, str]) -> dict[str, str]:
        """Of ``wanted`` (key -> the type blitzq keeps there: ``"stream"``, ``"zset"``, …),
        the keys that exist with another type: key -> ``"holds a <type>, not a <wanted>"``.
        One pipeline of ``TYPE`` (a missing key is ``none``: fine)."""
        if not wanted:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for key in wanted:
                pipe.type(key)
            kinds = await pipe.execute()
        out: dict[str, str] = {}
        for (key, want), kind in zip(wanted.items(), kinds, strict=True):
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind not in ("none", want):
                out[key] = f"holds a {kind}, not a {want}"
        return out

    def namespace_types(self) -> dict[str, str]:
        """The namespace's keys a worker reads whatever its queues, with their types: the
        schedule (zset), its messages (hash), the dead-letter index (zset)."""
        keys = self.keys
        return {keys.schedule: "zset", keys.schedule_data: "hash", keys.dead_letters: "zset"}

    def block_for(self, timeout: float) -> float:
        """See :meth:`RedisConnection.block_for`."""
        return self.conn.block_for(timeout)

    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.conn.ping()

    async def close(self) -> None:
        """Close the shared connection (see :meth:`RedisConnection.close`)."""
        await self.conn.close()


class RedisDeadLetterLimits:
    """The dead-letter bounds of a Redis state store, read and set on its connection: the
    :class:`~blitzq.broker.state.DeadLetterLimits` role of a broker
    (``Broker.dead_letter_limits``; the contract suite sets them there).

    Args:
        conn: the state store's connection.
    """

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    @property
    def cap(self) -> int:
        """Dead letters kept before the oldest are dropped (settable)."""
        return self.conn.dead_letter_cap

    @cap.setter
    def cap(self, value: int) -> None:
        self.conn.dead_letter_cap = value

    @property
    def ttl(self) -> int:
        """Seconds a dead letter is kept (settable)."""
        return self.conn.dead_letter_ttl

    @ttl.setter
    def ttl(self, value: int) -> None:
        self.conn.dead_letter_ttl = int(value)

    @property
    def max_bytes(self) -> int:
        """Total bytes of dead letters kept before the oldest are dropped (settable)."""
        return self.conn.dead_letter_max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self.conn.dead_letter_max_bytes = value
