"""Running the Lua scripts on a Redis Cluster, safely while their slot migrates.

Every script of a namespace works on keys of one hash tag (one slot), but it builds most of
them itself (``KEY.record(prefix, id)``) instead of receiving them in ``KEYS``. While a
slot migrates (``CLUSTER SETSLOT MIGRATING`` on the source, ``MIGRATE`` key by key), Redis
refuses a script's access to a key of that slot that is not on the node ("Script attempted
to access a non local key") -- and keeps the writes the script made before. A script of
blitzq must therefore never start a write while its slot migrates. Two rules make sure of it:

1. **Guard.** On a cluster each script starts with one read, before any write, of a key of
   its namespace that never exists (``{ns}:~``, built from the tag of ``KEYS[1]``). On a
   node whose slot is stable that read costs one lookup; on the source of a migration it
   is refused, so the script stops before its first write, with nothing done.
2. **No ASK for scripts.** :class:`ClusterScripts` sends each ``EVALSHA`` to the primary
   the slot map names and does not follow ``ASK`` (a declared key already moved): on the
   importing node the script would see the keys not yet moved as missing. ``MOVED`` (the
   migration is over) updates the slot map and the call goes to the new owner at once.

A refused guard, ``ASK`` and ``TRYAGAIN`` (declared keys split between the two nodes) mean
"the slot is migrating": the call waits (20 ms growing to 200 ms) and goes again, for at
most :data:`MIGRATION_WAIT` seconds (:data:`patience`: a worker's completions and
recoveries do not wait, :data:`BRIEF_WAIT`, :func:`briefly`: their caller retries them,
so that one migrating slot holds up nothing else), then raises (a transient, ``unavailable``
:class:`~blitzq.BrokerError` once translated). A script therefore runs wholly on the source
before the migration or wholly on the target after it, never across it.

**Scripts of declared keys** (:data:`DECLARED`: the lease renewal, the fencing check, the
fetch and the recovery of one queue, which touch nothing but their ``KEYS``) need neither
rule: on the source Redis runs them only when every key is there (else ``ASK``, or
``TRYAGAIN`` for keys split between the nodes), and the target runs them after ``ASKING``
only when every key has arrived (else ``TRYAGAIN``). They carry no guard and follow ``ASK``
(``ASKING`` and the ``EVALSHA`` on one connection of the importing node, as redis-py's
cluster client does for a command), so a worker fetches and renews the leases of a queue
whose slot migrates for as long as the migration lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .cluster import BoundedCluster
from .scripts import Script, Scripts, load

#: Seconds a script call waits at most for its slot's migration to end.
MIGRATION_WAIT = 30.0
#: The same for a call that its caller retries (:func:`briefly`): a worker's completions,
#: kept and retried per queue (``worker/flusher.py``), and its recovery rounds. None: a
#: refusal raises at once, and the caller's own backoff paces the tries.
BRIEF_WAIT = 0.0
#: Seconds the script calls of the current task wait for a migration (see above).
patience: ContextVar[float] = ContextVar("patience", default=MIGRATION_WAIT)
#: The scripts that touch no key but their ``KEYS`` (see the module docstring): no guard,
#: ``ASK`` followed.
DECLARED = frozenset({"fetch_levels", "hold", "recover_split", "renew"})
#: ``MOVED`` replies a script call follows before raising (redis-py's bound for a command).
MAX_MOVES = 16
#: Connection errors a script call survives (reconnecting to the slot's node) before raising.
CONNECT_RETRIES = 3
#: The guard each script starts with on a cluster (see the module docstring).
GUARD = "redis.call('EXISTS', string.match(KEYS[1], '^%b{}') .. ':~')\n"
#: Start of Redis's refusal of a script's access to a key of a migrating slot.
NON_LOCAL = "Script attempted to access a non local key"

_guarded: dict[str, Script] = {}

P = ParamSpec("P")
R = TypeVar("R")


def guarded(name: str) -> Script:
    """The script ``name`` with :data:`GUARD` as its first line (read once per process);
    a script of :data:`DECLARED` as it ships.

    Raises:
        FileNotFoundError: no such script ships with blitzq.
    """
    script = _guarded.get(name)
    if script is None:
        if name in DECLARED:
            script = load(name)
        else:
            source = GUARD + load(name).source
            script = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
        _guarded[name] = script
    return script


def briefly(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate a coroutine function whose caller retries it so that its script calls wait
    at most :data:`BRIEF_WAIT` seconds for a migrating slot (:data:`patience`), then raise:
    one slot's migration then holds up only what needs that slot."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        token = patience.set(BRIEF_WAIT)
        try:
            return await fn(*args, **kwargs)
        finally:
            patience.reset(token)

    return wrapper


def turn(client: Any) -> contextlib.AbstractAsyncContextManager[None]:
    """One of ``client``'s turns (:meth:`BoundedCluster.turn`); nothing to wait for on
    another cluster client (one given to the broker ready-made)."""
    return client.turn() if isinstance(client, BoundedCluster) else contextlib.nullcontext()


def migrating(exc: BaseException) -> bool:
    """Whether ``exc`` says the script's slot is migrating now."""
    if isinstance(exc, (AskError, TryAgainError)) and not isinstance(exc, MovedError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(NON_LOCAL)


class ClusterScripts(Scripts):
    """Runs the shipped scripts on a ``RedisCluster``, node by node (see the module
    docstring); the same interface as :class:`~blitzq.broker.redis.scripts.Scripts`.

    Args:
        client: the broker's ``redis.asyncio.cluster.RedisCluster``.
    """

    __slots__ = ()

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script ``name`` on the primary owning ``keys[0]``'s slot; its reply.

        Raises:
            redis.exceptions.RedisError: the server refused the call or the script raised;
                the slot was still migrating after :data:`MIGRATION_WAIT` seconds
                (``TryAgainError``, ``AskError`` or the refusal); more than
                :data:`MAX_MOVES` ``MOVED`` replies; the node stayed unreachable.
            FileNotFoundError: no script of that name ships with blitzq.
        """
        script = _guarded.get(name) or guarded(name)
        client = self._client
        await client.initialize()  # a no-op once the slot map is loaded
        deadline = time.monotonic() + patience.get()
        delay, failures, moves = 0.02, 0, 0
        asking = None  # the importing node an ASK named, for a script of declared keys
        while True:
            node = asking or client.get_node_from_key(keys[0])
            try:
                async with turn(client):
                    return await self._run(client, node, script, keys, args, asking is not None)
            except MovedError as exc:  # the migration ended: the new owner, at once
                moves += 1
                if moves > MAX_MOVES:
                    raise
                await client.nodes_manager.move_slot(exc)
                asking = None
                continue
            except RedisConnectionError:
                failures += 1
                if failures > CONNECT_RETRIES:
                    raise
                asking = None
                await client.nodes_manager.initialize()
            except (AskError, TryAgainError, ResponseError) as exc:
                if isinstance(exc, AskError) and asking is None and name in DECLARED:
                    asking = _importing(client, exc)
                    moves += 1
                    if asking is not None and moves <= MAX_MOVES:
                        continue  # at once, after ASKING
                asking = None
                if not migrating(exc) or time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    @staticmethod
    async def _run(
        client: Any,
        node: Any,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        asking: bool = False,
    ) -> Any:
        """``EVALSHA`` on ``node`` (after ``ASKING`` on the same connection when
        ``asking``); ``SCRIPT LOAD`` there and again on ``NOSCRIPT``. A durable call (a
        worker's fetch or completion, a producer's enqueue: ``ShardReplicas.durable_now``)
        is followed by ``WAIT`` for the shard's replicas on the same connection
        (``cluster_replicas.py``)."""
        replicas = getattr(client, "replicas", None)
        if replicas is not None and not (asking or replicas.durable_now()):
            replicas = None
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            if replicas is not None:
                return await replicas.run(node, command, asking=asking)
            return await node.execute_command(*command)
        except NoScriptError:
            await node.execute_command("SCRIPT", "LOAD", script.source)
            if replicas is not None:
                return await replicas.run(node, command, asking=asking)
            return await node.execute_command(*command)


def _importing(client: Any, exc: AskError) -> Any:
    """The node an ``ASK`` reply names, when ``client`` can send ``ASKING`` before a
    command on one connection (a :class:`BoundedCluster`); else ``None`` (the call waits
    for the migration to end instead)."""
    if getattr(client, "replicas", None) is None:
        return None
    return client.get_node(*client.nodes_manager.remap_host_port(exc.host, exc.port))
