"""Which replicas a write must reach before the broker reports it done (Sentinel, Cluster).

Used by ``sentinel.py``'s :class:`~.sentinel.ReplicatedRedis` (one primary) and
``cluster_replicas.py``'s :class:`~.cluster_replicas.ShardReplicas` (one watch per shard's
primary on a Redis Cluster). A durable write (a worker's fetch and completion; a producer's
enqueue, unless the URL says ``wait_replicas=0``; every write with ``wait_replicas`` >= 1 on
Sentinel) is followed by ``WAIT`` for the replicas that exist: the primary's connected
replicas, read with ``ROLE`` at most every :data:`REPLICAS_CHECK` seconds. A new primary has
none until Sentinel turns the old one into its replica (about 10 s), and its writes then go
unwaited rather than each failing: no lease lapses because a ``WAIT`` blocked (no recovery
storm).

A replica that disappears from the list is not forgotten at once, because the list shrinks
in two very different cases:

- the replica crashed, restarted or lost its link: the primary is still *the* primary, and
  writes go on unwaited by it (they are durable on every replica there is);
- the replica was **promoted** (``SENTINEL FAILOVER``, or a failover on the other side of a
  partition): this primary is about to be demoted and its data thrown away, and a write it
  acknowledges now is lost. Redis replicates asynchronously, and this is the window where a
  worker would otherwise fetch a task, run it and record it on the old primary alone.

So a replica gone from the list is asked its own ``ROLE`` (a connection of its own, cut at
:data:`PROBE_TIMEOUT`): one that answers as a primary, or as the replica of another server,
marks this primary **superseded**. A superseded primary gets no durable write at all (they
raise :class:`~blitzq.BrokerError`, transient and ``unavailable``, without being sent, so a
worker keeps its completion and fetches nothing there) until the client's connections move
to the server the sentinels name (the pool is asked to look at once).

A replica whose probe fails tells one of two things:

- it refuses the connection (or any error but a timeout): the process is gone, taken as
  crashed, and writes go on unwaited by it;
- it does not answer in time: it may be a replica being promoted on a loaded machine (a
  ``CONFIG REWRITE``, a starved CPU). The primary is then **in doubt**, held as a superseded
  one, and the replica asked again at each look, for at most :data:`DOUBT_SECONDS` (then it
  is taken as crashed). Forgetting it at the first silent probe let a worker fetch, run and
  record tasks on the old primary alone until the pool moved: tasks that ran, whose records
  went with its data.

A replica promoted behind a partition that cuts it from the clients for longer than that is
not detected (``min-replicas-to-write`` on the servers covers that).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...exceptions import BrokerError

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("blitzq.broker")

#: Seconds between two reads of the primary's connected replicas.
REPLICAS_CHECK = 1.0
#: Seconds to open a connection to a replica gone from the list, and for its ``ROLE`` reply.
PROBE_TIMEOUT = 0.5
#: Seconds a replica gone from the primary's list that does not answer its probe keeps the
#: primary in doubt (durable writes held), before it is taken as crashed.
DOUBT_SECONDS = 10.0
#: Seconds ``WAIT`` waits for the replicas by default.
DEFAULT_WAIT_TIMEOUT = 0.5
#: Seconds a producer's write of messages waits for its replica at most, by default (capped
#: at half the client's ``socket_timeout``, never under the ``wait_timeout``): longer than a
#: worker's, whose short ``WAIT`` only delays a completion it retries, where a producer's
#: raises :class:`~blitzq.OutcomeUnknown` to its caller; a replica slowed by a busy host
#: (it answers within a second or two) must not fail enqueues. A healthy replica answers in
#: a round trip; only a replica that is gone makes an enqueue wait the whole bound.
DEFAULT_ENQUEUE_WAIT_TIMEOUT = 2.0
#: Commands followed by ``WAIT`` when they are durable: the single writes of enqueues and
#: completions (a script call, ``XADD``, ``RPUSH``/``LPUSH``; blocking reads and pipelines
#: are not).
WAITED = frozenset({"EVALSHA", "EVAL", "XADD", "RPUSH", "LPUSH"})
#: Reads that take leases, waited for under :data:`durable_writes` only (a worker's fetch).
WAITED_READS = frozenset({"XREADGROUP"})


def enqueue_wait_timeout(wait_timeout: float, socket_timeout: float | None) -> float:
    """Seconds a producer's ``WAIT`` lasts at most (:data:`DEFAULT_ENQUEUE_WAIT_TIMEOUT`).

    Args:
        wait_timeout: the ``WAIT`` bound of the worker's durable commands (seconds).
        socket_timeout: the client's reply timeout (seconds), or ``None`` for none.

    Returns:
        ``max(wait_timeout, min(DEFAULT_ENQUEUE_WAIT_TIMEOUT, socket_timeout / 2))``, so it
        stays under ``socket_timeout`` whenever ``wait_timeout`` does.
    """
    bound = DEFAULT_ENQUEUE_WAIT_TIMEOUT
    if socket_timeout is not None:
        bound = min(bound, socket_timeout / 2)
    return max(wait_timeout, bound)


#: Set while a producer writes messages (:func:`enqueuing`: an enqueue of any kind, a
#: schedule, a unique enqueue, a dead-letter replay): its single writes (:data:`WAITED`) are
#: waited for by the replicas that exist, as a worker's are, unless the URL opts out
#: (``wait_replicas=0``). A worker's lease renewals and other upkeep are never under it.
enqueue_writes: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "blitzq_enqueue_writes", default=False
)

#: Set while a command must be waited for by the replicas that exist: a worker's completion
#: (``RedisStateStore.complete_durably``: a commit that acks its delivery, or that a foreign
#: transport acks next) and its fetches (``streams.py``: a task starts only once the
#: replicas know it is leased, so a failover cannot lose the message of a task that ran).
durable_writes: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "blitzq_durable_writes", default=False
)


def is_replicated(client: Any) -> bool:
    """``True`` if ``client`` is ``sentinel.py``'s ``ReplicatedRedis`` (a ``redis+sentinel://``
    client, whose writes and lease-taking reads are waited for on its replicas).

    ``sentinel.py`` is not imported for this (an idle worker on a plain URL does not load it,
    issue 29): such a client exists only once that module has made it.

    Args:
        client: any Redis client.
    """
    sentinel = sys.modules.get(f"{__package__}.sentinel")
    return sentinel is not None and isinstance(client, sentinel.ReplicatedRedis)


def durably(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate a coroutine function so that its commands run under :data:`durable_writes`
    (nothing changes on a client that waits for no replica: a single server, a cluster
    without replicas)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        token = durable_writes.set(True)
        try:
            return await fn(*args, **kwargs)
        finally:
            durable_writes.reset(token)

    return wrapper


def enqueuing(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate a coroutine function that writes a producer's messages so that its commands
    run under :data:`enqueue_writes` (durable by default on ``redis+sentinel://`` and on a
    Redis Cluster with replicas; nothing changes elsewhere)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        token = enqueue_writes.set(True)
        try:
            return await fn(*args, **kwargs)
        finally:
            enqueue_writes.reset(token)

    return wrapper


def waited(args: tuple[Any, ...]) -> bool:
    """Whether the command ``args`` is durable now (:data:`durable_writes` set): one of
    :data:`WAITED` or :data:`WAITED_READS`."""
    name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    name = name.upper()
    return name in WAITED or name in WAITED_READS


def check_acknowledged(
    watch: ReplicaWatch, what: str, acknowledged: Any, wanted: int, timeout: float
) -> None:
    """Raise :class:`~blitzq.BrokerError` (transient, ``unavailable``, ``unreplicated``: the
    primary applied the command) when ``acknowledged`` (``WAIT``'s reply) is under
    ``wanted``; ``watch`` then reads the replicas again at the next durable command (a
    replica may have gone, or been promoted). A producer's write then raises
    :class:`~blitzq.OutcomeUnknown` (:func:`~blitzq.exceptions.unknown_outcome`).

    Args:
        watch: the replicas of the server that ran the command.
        what: the command, for the message.
        acknowledged: ``WAIT``'s reply.
        wanted: replicas it waited for.
        timeout: seconds it waited at most.
    """
    if int(acknowledged) < wanted:
        watch.forget()
        error = BrokerError(
            f"{what} was applied by the primary but acknowledged by {acknowledged} of "
            f"{wanted} replica(s) within {timeout} s: a failover may lose it",
            unavailable=True,
        )
        error.unreplicated = True
        raise error


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ReplicaWatch:
    """The replicas a durable write on one client waits for (module docstring).

    Args:
        credentials: ``username``/``password`` of the servers (a replica is asked with them).
    """

    def __init__(self, credentials: dict[str, Any]) -> None:
        self._credentials = {k: v for k, v in credentials.items() if v is not None}
        #: The primary (``(host, port)``, as the pool names it) the replicas below belong to.
        self._primary: Any = None
        #: ``host:port`` of the replicas counted at the last look (the connected ones, and
        #: those gone from the list that answered as promoted).
        self._replicas: set[str] = set()
        #: The replicas last seen of each primary the pool named: when the pool names an
        #: earlier primary again (the sentinels disagree for a moment during a failover: one
        #: names the old primary after another named the new), its replica promoted meanwhile
        #: is probed again at once, and the old primary is found superseded again, rather than
        #: taken for a primary without replicas whose writes go unwaited.
        self._seen: dict[Any, set[str]] = {}
        self._count: int | None = None
        self._read_at = 0.0
        #: The primary found superseded at the last look (one of its replicas was promoted,
        #: or one gone from its list does not answer: in doubt), else ``None``.
        self.superseded: Any = None
        #: Replicas gone from the list whose probe went unanswered, and since when
        #: (``time.monotonic()``): asked again at each look, up to :data:`DOUBT_SECONDS`.
        self._silent: dict[str, float] = {}
        self._lock: asyncio.Lock | None = None

    def forget(self) -> None:
        """Read the list again at the next write (a ``WAIT`` fell short)."""
        self._count = None

    async def count(self, client: Any, primary: Any) -> int:
        """Replicas a durable write on ``client`` waits for, the server being ``primary``
        (its pool's address for it); 0 when the server is not a primary. One look at a time
        (concurrent callers share it); a look that the pool's move to another primary
        overtook changes nothing.

        Raises:
            redis.exceptions.RedisError: ``ROLE`` failed.
        """
        if primary != self._primary:  # the connections moved: a new primary, new replicas
            if self._primary is not None:
                self._seen[self._primary] = self._replicas
            self._primary, self._count = primary, None
            self._replicas = set(self._seen.get(primary, ()))
            self.superseded = None
            self._silent.clear()
        if self._count is not None and time.monotonic() - self._read_at < REPLICAS_CHECK:
            return self._count
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if primary != self._primary:  # moved while this caller waited: look again
                return await self.count(client, primary)
            if self._count is not None and time.monotonic() - self._read_at < REPLICAS_CHECK:
                return self._count
            count, replicas, promoted, silent = await self._look(client, primary)
            if primary != self._primary:  # the pool moved meanwhile: this look is stale
                return count
            if promoted and self.superseded is None:
                logger.warning(
                    "replica %s of the primary %s:%s answers as promoted (a failover): "
                    "durable writes wait until the sentinels name the new primary",
                    ", ".join(promoted),
                    *primary,
                )
            elif silent and self.superseded is None:
                logger.warning(
                    "replica %s left the primary %s:%s and does not answer: durable writes "
                    "wait until it does (it may be being promoted), at most %.0f s",
                    ", ".join(silent),
                    *primary,
                    DOUBT_SECONDS,
                )
            self.superseded = primary if promoted or silent else None
            self._replicas, self._count, self._read_at = replicas, count, time.monotonic()
            return count

    async def _look(self, client: Any, primary: Any) -> tuple[int, set[str], list[str], list[str]]:
        """``(count, replicas, promoted, silent)``: one ``ROLE`` on ``client``, and a probe of
        each replica gone since the last look (never ``primary`` itself). ``replicas`` (the
        next look's reference) holds the silent ones, ``count`` does not."""
        role = await client.execute_command("ROLE")
        if _text(role[0]) != "master":
            return 0, set(), [], []
        connected = {f"{_text(r[0])}:{_text(r[1])}" for r in (role[2] if len(role) > 2 else [])}
        itself = f"{primary[0]}:{primary[1]}" if primary is not None else ""
        gone = self._replicas - connected - {itself}
        promoted: list[str] = []
        silent: list[str] = []
        now = time.monotonic()
        for replica in sorted(gone):
            answer = await self._probe(replica, primary)
            if answer is None and now - self._silent.setdefault(replica, now) < DOUBT_SECONDS:
                silent.append(replica)
                continue
            self._silent.pop(replica, None)
            if answer:
                promoted.append(replica)
        for replica in connected:
            self._silent.pop(replica, None)
        replicas = connected | set(promoted)
        return len(replicas), replicas | set(silent), promoted, silent

    async def _probe(self, replica: str, primary: Any) -> bool | None:
        """Whether ``replica`` answers as a primary, or as the replica of a server other than
        ``primary``; ``False`` when it follows ``primary`` or fails at once (refused: taken as
        crashed); ``None`` when it does not answer in time (module docstring)."""
        host, _, port = replica.rpartition(":")
        probe = aioredis.Redis(
            host=host,
            port=int(port),
            retry=Retry(NoBackoff(), 0),  # one try: a refusal is an answer, not a wait
            socket_timeout=PROBE_TIMEOUT,
            socket_connect_timeout=PROBE_TIMEOUT,
            **self._credentials,
        )
        try:
            role = await asyncio.wait_for(probe.execute_command("ROLE"), 2 * PROBE_TIMEOUT)  # type: ignore[no-untyped-call]
        except (TimeoutError, RedisTimeoutError):
            return None
        except (RedisError, OSError):
            return False
        finally:
            with contextlib.suppress(RedisError, OSError):
                await probe.aclose()
        kind = _text(role[0])
        logger.debug("replica %s answers ROLE %r (primary %r)", replica, role[:3], primary)
        if kind == "master":
            return True
        if kind != "slave" or primary is None or len(role) < 3:
            return False
        followed = (_text(role[1]), int(role[2]))
        return followed != (str(primary[0]), int(primary[1]))


__all__ = [
    "DEFAULT_ENQUEUE_WAIT_TIMEOUT",
    "DEFAULT_WAIT_TIMEOUT",
    "DOUBT_SECONDS",
    "PROBE_TIMEOUT",
    "REPLICAS_CHECK",
    "WAITED",
    "WAITED_READS",
    "ReplicaWatch",
    "check_acknowledged",
    "durable_writes",
    "durably",
    "enqueue_wait_timeout",
    "enqueue_writes",
    "enqueuing",
    "is_replicated",
    "waited",
]
