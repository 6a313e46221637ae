"""Redis Cluster: telling a cluster node from a single server, and the client made for it.

A broker URL names one server. :func:`wants_cluster` decides whether it is a node of a Redis
Cluster:

- ``redis+cluster://host:port/0`` (``rediss+cluster://`` with TLS) says so explicitly: no
  probe is made, and a cluster that is still down when the broker is made is reached once it
  answers.
- ``redis://`` and ``rediss://`` are probed once, when the broker is made: one short
  connection sends ``INFO cluster`` and reads ``cluster_enabled``. A server that does not
  answer the probe (down, refusing ``INFO``) is taken for a single server: the first command
  then fails as it would have, and a cluster node met that way answers ``MOVED`` (a
  :class:`~blitzq.BrokerError`). Name a cluster ``redis+cluster://`` when it may be down at
  start. The probe is made before any command, never on the command path.
- ``unix://`` is never a cluster (Redis Cluster has no Unix-socket mode).

On a cluster the broker's client is redis-py's :class:`redis.asyncio.cluster.RedisCluster`
(:func:`make_cluster_client`): it learns the slot map from the node named in the URL, sends
each command to the primary owning its key's slot, follows ``MOVED`` (updating its map) and
``ASK`` (during a slot migration) at most 16 times per command, waits and retries on
``TRYAGAIN`` and ``CLUSTERDOWN``, and gives up with an error after that, never looping. TLS
(``rediss``), the ACL user and password of the URL, and the connection options of the URL
(``socket_timeout``, ``socket_connect_timeout``, ``health_check_interval``,
...) apply to every node's connections as to a single server's; ``max_connections`` bounds
the commands of the client in flight and ``timeout`` how long a caller waits for a turn, as
the single server's pool does (:class:`BoundedCluster`).

Scripts (``EVALSHA``) go to the node of their first key, and never run across a migration of
their slot (``cluster_scripts.py``); a script's keys share one hash tag (the namespace's, or on
the spread layout one queue's: ``spread.py``), so they are in one slot. The layout is the URL's
``layout`` option (:func:`split_layout`), read by the broker factory. Pub/sub is the classic
kind (``PUBLISH``/``SUBSCRIBE``), which a cluster forwards to every node: a subscriber on any
node hears a publish made on any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any, cast
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import AskError, MovedError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry as SyncRetry

from .replicas import DEFAULT_WAIT_TIMEOUT, enqueue_wait_timeout, waited

#: URL schemes that name a Redis Cluster explicitly (no probe), and the scheme each becomes.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Seconds the cluster-mode probe waits to connect and for its reply.
PROBE_TIMEOUT = 2.0
#: Retries of a command on a cluster after a connection error, a timeout or CLUSTERDOWN.
CLUSTER_RETRIES = 3
#: Connections each node's pool holds beyond ``max_connections`` (pub/sub, pipelines).
NODE_HEADROOM = 8
#: Seconds between two trims of the nodes' free connections (:meth:`BoundedCluster._trim_due`).
TRIM_EVERY = 30.0
#: ``MOVED`` replies a durable command follows before raising (redis-py's bound).
DURABLE_MOVES = 16
#: URL options of the single-server pool that a cluster client has no use for.
_POOL_ONLY = frozenset({"timeout", "max_connections"})
#: URL options the cluster client reads itself (:func:`make_cluster_client`), no connection's.
_CLIENT_ONLY = frozenset({"wait_replicas"})


#: Key layouts of reliable mode (the URL option ``layout``): ``spread`` puts each queue in
#: a slot of its own (``spread.py``, the default on a cluster), ``slot`` the whole namespace
#: in one slot (one script per completion; the only layout of a single server by default).
LAYOUTS = ("spread", "slot")


def split_layout(url: str) -> tuple[str, str | None]:
    """``url`` without its ``layout`` option, and that option (``None`` when absent).

    Raises:
        ValueError: a ``layout`` other than those of :data:`LAYOUTS`.
    """
    if "layout=" not in url:
        return url, None
    split = urlsplit(url)
    query = parse_qsl(split.query, keep_blank_values=True)
    chosen = [value for name, value in query if name == "layout"]
    if not chosen:
        return url, None
    if chosen[-1] not in LAYOUTS:
        raise ValueError(f"layout={chosen[-1]!r} must be one of {', '.join(LAYOUTS)}")
    rest = urlencode([(name, value) for name, value in query if name != "layout"])
    # Not urlunsplit: it writes a URL with no host as "unix:/path", which redis-py refuses.
    base = url.partition("?")[0]
    return (f"{base}?{rest}" if rest else base), chosen[-1]


def plain_url(url: str) -> str:
    """``url`` with a ``redis+cluster``/``rediss+cluster`` scheme rewritten to
    ``redis``/``rediss`` (any other URL unchanged)."""
    scheme, sep, rest = url.partition("://")
    return CLUSTER_SCHEMES[scheme] + sep + rest if scheme in CLUSTER_SCHEMES else url


def wants_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster node (see the module docstring).

    Args:
        url: a ``redis://``, ``rediss://``, ``redis+cluster://``, ``rediss+cluster://`` or
            ``unix://`` URL.

    Returns:
        True for the ``+cluster`` schemes; for ``redis``/``rediss`` the answer of the
        server's ``INFO cluster`` (False when the probe fails); False otherwise.
    """
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return True
    if scheme not in ("redis", "rediss"):
        return False
    return probe(url)


def probe(url: str) -> bool:
    """True when the server of ``url`` reports ``cluster_enabled:1`` (one short connection).

    Only the URL's address, TLS and credential options are used (with
    :data:`PROBE_TIMEOUT`); any error reads as "not a cluster".
    """
    try:
        parsed = redis.ConnectionPool.from_url(url)
        kwargs = {
            k: v
            for k, v in parsed.connection_kwargs.items()
            if k not in _POOL_ONLY and k not in _CLIENT_ONLY
        }
        kwargs.update(
            db=0,  # a cluster node refuses SELECT: a database in the URL is refused later
            socket_connect_timeout=PROBE_TIMEOUT,
            socket_timeout=PROBE_TIMEOUT,
            retry=SyncRetry(NoBackoff(), 0),
        )
        connection = parsed.connection_class(**kwargs)
    except (TypeError, ValueError):
        return False
    try:
        connection.send_command("INFO", "cluster")
        info = connection.read_response()
    except (redis.RedisError, OSError):
        return False
    finally:
        connection.disconnect()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return "cluster_enabled:1" in text


class BoundedCluster(RedisCluster):
    """redis-py's cluster client with the single server's bounded wait for a connection.

    redis-py's cluster client fails a command at once (``MaxConnectionsError``) when the
    node's pool is full. Here at most ``commands`` commands (and script calls) of this client
    are in flight at once, over all nodes; a caller past that waits up to ``wait`` seconds
    for a turn, then gets ``redis.exceptions.ConnectionError`` (a transient
    :class:`~blitzq.BrokerError` once translated), as on a single server. Each node's pool
    holds :data:`NODE_HEADROOM` connections more than ``commands``, for the pub/sub
    connections and pipelines, which take theirs outside the gate.

    A durable command (a worker's fetch and completion, a producer's enqueue unless the URL
    says ``wait_replicas=0``: ``ShardReplicas.durable_now``) is followed by ``WAIT`` for its
    shard's replicas that exist, on the same connection (:attr:`replicas`,
    ``cluster_replicas.py``).

    Args:
        gate: most commands in flight (the URL's ``max_connections``).
        wait: seconds a caller waits for its turn (the URL's ``timeout``).
        enqueues: whether a producer's writes are durable (the URL's ``wait_replicas``).
        kwargs: passed to :class:`~redis.asyncio.cluster.RedisCluster`.
    """

    def __init__(
        self,
        *args: Any,
        gate: int = 50,
        wait: float = 20.0,
        enqueues: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = gate
        self._wait = wait
        self._gate = asyncio.Semaphore(gate)
        self._next_trim = 0.0
        self._trimming: set[asyncio.Task[None]] = set()
        #: The replicas each shard's durable commands wait for.
        from .cluster_replicas import ShardReplicas  # a cluster's only (issue 29: memory)

        self.replicas = ShardReplicas(
            self,
            {k: kwargs[k] for k in ("username", "password") if kwargs.get(k) is not None},
            enqueues=enqueues,
            enqueue_wait_timeout=enqueue_wait_timeout(
                DEFAULT_WAIT_TIMEOUT, kwargs.get("socket_timeout")
            ),
        )

    def _trim_due(self) -> None:
        """Every :data:`TRIM_EVERY` seconds, close each node's free connections but one
        (and all those of the start-up nodes' objects, which only loaded the slot map): a
        burst of commands in flight at once (a worker's start: every fetch loop's first
        read) opens several per node, which redis-py's cluster client keeps for good (an
        idle worker would hold them for nothing: issue 25). One in use is never touched;
        a later burst opens what it needs again."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < self._next_trim:
            return
        self._next_trim = now + TRIM_EVERY
        extra = []
        serving = list(self.nodes_manager.nodes_cache.values())
        # The nodes the client started from, when other objects than the slot map's: their
        # connections (CLUSTER SLOTS, COMMAND at start) serve nothing more.
        starting = getattr(self.nodes_manager, "startup_nodes", {}).values()
        kept = {id(node): 1 for node in serving}
        for node in [*serving, *(n for n in starting if id(n) not in kept)]:
            free, made = getattr(node, "_free", None), getattr(node, "_connections", None)
            if free is None or made is None:  # another redis-py: nothing to trim
                return
            while len(free) > kept.get(id(node), 0):
                connection = free.popleft()
                with contextlib.suppress(ValueError):
                    made.remove(connection)
                extra.append(connection)
        if extra:
            task = loop.create_task(_disconnect(extra))
            self._trimming.add(task)
            task.add_done_callback(self._trimming.discard)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the ``gate`` turns (waiting up to ``wait`` seconds for it).

        Raises:
            redis.exceptions.ConnectionError: no turn within ``wait`` seconds.
        """
        gate = self._gate
        if gate.locked():
            try:
                await asyncio.wait_for(gate.acquire(), self._wait)
            except TimeoutError:
                raise RedisConnectionError(
                    f"no connection available within {self._wait} s "
                    f"(max_connections={self.max_connections})"
                ) from None
        else:
            await gate.acquire()
        try:
            yield
        finally:
            gate.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`redis.asyncio.cluster.RedisCluster.execute_command`; waits for a turn
        first (:meth:`turn`)."""
        if self.replicas.durable_now() and "target_nodes" not in kwargs and waited(args):
            async with self.turn():
                reply = await self._durably(args, kwargs)
        else:
            async with self.turn():
                reply = await super().execute_command(*args, **kwargs)
        self._trim_due()
        return reply

    async def _durably(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a durable command on the primary of its key's slot, waited for by that
        shard's replicas (:class:`~.cluster_replicas.ShardReplicas`); follows ``MOVED`` and
        ``ASK`` (a slot being migrated: ``ASKING`` and the command on one connection of the
        importing node) at most :data:`DURABLE_MOVES` times; a connection error re-reads the
        slot map and is raised."""
        await self.initialize()  # a no-op once the slot map is loaded
        key = _first_key(args)
        moves = 0
        node, asking = self.get_node_from_key(key), False
        while True:
            try:
                return await self.replicas.run(node, args, asking=asking, **kwargs)
            except MovedError as exc:  # (a MovedError is an AskError: caught first)
                moves += 1
                if moves > DURABLE_MOVES:
                    raise
                await self.nodes_manager.move_slot(exc)
                node, asking = self.get_node_from_key(key), False
            except AskError as exc:
                moves += 1
                importing = self.get_node(*self.nodes_manager.remap_host_port(exc.host, exc.port))
                if moves > DURABLE_MOVES or importing is None:
                    raise
                node, asking = importing, True
            except (RedisConnectionError, OSError):
                with contextlib.suppress(RedisError, OSError):
                    await self.nodes_manager.initialize()
                raise


def _first_key(args: tuple[Any, ...]) -> Any:
    """The first key of a command of :func:`~.replicas.waited`: the first stream of an
    ``XREADGROUP``, the first key of a script call, else the first argument (an ``XADD``'s
    or ``RPUSH``'s messages are binary: read as text, never decoded strictly)."""
    words = [
        (a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a)).upper()
        for a in args[:12]
    ]
    if words[0] == "XREADGROUP":
        return args[words.index("STREAMS") + 1]
    if words[0] in ("EVALSHA", "EVAL"):
        return args[3]
    return args[1]


async def _disconnect(connections: list[Any]) -> None:
    """Close ``connections`` (taken out of their nodes' pools); a failure is no error."""
    for connection in connections:
        with contextlib.suppress(Exception):
            await connection.disconnect()


def make_cluster_client(url: str, options: dict[str, Any]) -> BoundedCluster:
    """A :class:`BoundedCluster` started from the node ``url`` names.

    Args:
        url: a cluster node's URL (any of the schemes of :func:`wants_cluster` but
            ``unix://``); database 0 only.
        options: blitzq's connection defaults (``client.connection_options``); the URL's
            query parameters are applied over them. ``max_connections`` and ``timeout``
            bound the commands in flight and the wait for a turn (:class:`BoundedCluster`);
            ``wait_replicas=0`` sends a producer's enqueues unwaited by the shards'
            replicas (``1``, the default: waited; ``cluster_replicas.py``); the single
            server's retry object is replaced by the cluster's own.

    Raises:
        ValueError: an unknown or invalid option (``wait_replicas`` other than 0 or 1), a
            database other than 0, a Unix socket.
    """
    split = urlsplit(plain_url(url))
    if split.scheme not in ("redis", "rediss"):
        raise ValueError("a Redis Cluster is reached over TCP: redis[s]+cluster:// or redis[s]://")
    database = split.path.strip("/") or "0"
    if database != "0":
        raise ValueError(f"a Redis Cluster has only database 0, not {database}")
    query = parse_qs(split.query)
    wait = float(query.pop("timeout", [options["timeout"]])[-1])
    gate = int(query.pop("max_connections", [options["max_connections"]])[-1])
    if not math.isfinite(wait) or wait <= 0:
        raise ValueError(f"timeout={wait!r} must be a finite number > 0")
    replicas = query.pop("wait_replicas", ["1"])[-1].strip()
    if replicas not in ("0", "1"):
        raise ValueError(
            f"wait_replicas={replicas!r}: a Redis Cluster waits for one replica of the shard "
            "(1, the default) or, for a producer's enqueues, none (0)"
        )
    rest = urlunsplit(split._replace(query=urlencode(query, doseq=True)))
    kwargs = {k: v for k, v in options.items() if k not in ("timeout", "retry", "max_connections")}
    kwargs["retry"] = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), CLUSTER_RETRIES)
    kwargs["max_connections"] = gate + NODE_HEADROOM
    try:
        client = BoundedCluster.from_url(
            rest, decode_responses=False, gate=gate, wait=wait, enqueues=replicas == "1", **kwargs
        )
    except (TypeError, redis.exceptions.RedisClusterException) as exc:
        raise ValueError(str(exc)) from None
    return cast(BoundedCluster, client)  # from_url makes an instance of the class called


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster client."""
    return isinstance(client, RedisCluster)


def node_of(client: RedisCluster, key: str) -> dict[str, Any]:
    """Keyword arguments sending a keyless command (``TIME``, ``INFO``) to the primary that
    owns ``key``'s slot now, so that it reads the clock or memory the scripts of that key
    see."""
    return {"target_nodes": client.get_node_from_key(key)}


async def ready(client: Any) -> None:
    """Load a cluster client's slot map if it has not been loaded (nothing for a single
    server's client)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
