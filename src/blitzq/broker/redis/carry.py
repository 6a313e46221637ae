"""Fast mode's pop that carries the worker's pending completions: one round trip for both.

In fast mode (Redis lists, at-most-once) a busy worker otherwise makes two round trips per
cycle: the flusher's ``complete.lua`` call and the fetch loop's pop, each on its own
connection, each a write, a wake-up of the server and a read. :class:`CarriedPop` sends the
completion batch waiting in the flusher (not yet sent, none in flight) and the pop in one
write on one connection, ``EVALSHA complete`` first, and reads both replies: the server
applies the completions, then pops (``pop_levels.lua``), as if the flusher's call had
arrived just before the pop.

Nothing else changes:

- the batch is the one the flusher would have sent next (:meth:`~blitzq.worker.flusher.
  Flusher.carry`), in its order; while it is in flight the flusher sends nothing, so batches
  are still applied one after the other, in the order they were taken;
- the completions are applied only when the reply of ``complete.lua`` says so; any other
  outcome (an error reply, ``NOSCRIPT``, a connection that failed) hands the batch back to
  the flusher, which writes it on its own with its usual retries and isolation (a batch
  whose reply was lost may then be applied twice, as when the flusher retries it itself);
- the pop runs through the :class:`~.popping.Popper` (its deadline, its retries): a reply a
  pause of the process delays is still read; ``NOSCRIPT`` on the pop (a server that
  restarted) pops again through the usual path, which loads the script.

Only a single server without replica waits (not a Redis Cluster: the keys of the two
scripts may live on different nodes; not a ``redis+sentinel://`` client that waits for
replicas after each write) carries: :func:`carried_pop` returns ``None`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from ...exceptions import BrokerError
from ..transport import Delivery
from ..values import Completion
from .client import REDIS_ERRORS, broker_error
from .lists import ListsTransport, split_levels
from .scripts import load
from .sentinel import ReplicatedRedis
from .store import RedisStateStore

__all__ = ["CarriedPop", "carried_pop"]


class CarriedPop:
    """Pops from a lists transport with a completion batch carried in the same write.

    Args:
        transport: the fast-mode transport popped from.
        store: the state store on the same connection, whose ``complete.lua`` call is
            carried.
    """

    def __init__(self, transport: ListsTransport, store: RedisStateStore) -> None:
        self.transport = transport
        self.store = store
        #: Batches carried and applied, since this broker started (the bench reads it).
        self.carried = 0

    async def __call__(
        self, queues: Sequence[str], count: int, completions: Sequence[Completion]
    ) -> tuple[list[Delivery] | BrokerError, list[Completion] | None]:
        """Apply ``completions`` and pop up to ``count`` messages from ``queues`` (priority
        levels, in order, without blocking), in one round trip.

        Returns:
            What the pop gave (the deliveries, or the :class:`~blitzq.BrokerError` it failed
            with: the caller raises it once the batch's outcome is handed over), and the
            stale completions (a list: the batch was applied) or ``None`` (it was not, or
            it is unknown: the caller writes it again).
        """
        transport = self.transport
        try:
            args = self.store.complete_args(completions)
        except Exception:  # a completion that cannot be encoded (a bug): the flusher isolates it
            args, completions = None, ()
        try:
            if args is None:
                return await transport.fetch_first(queues, count, 0), [] if completions else None
            keys = [transport.keys.list(q) for q in queues]
            complete, pop = load("complete"), load("pop_levels")
            commands = [
                ("EVALSHA", complete.sha, len(args[0]), *args[0], *args[1]),
                ("EVALSHA", pop.sha, len(keys), *keys, count),
            ]
            applied, rows = await transport.popper.execute_many(commands)
        except BrokerError as exc:
            return exc, None
        except REDIS_ERRORS as exc:
            return broker_error(exc), None
        outcome: list[Completion] | None = None
        if not isinstance(applied, ResponseError):
            outcome = self.store.stale_of(completions, applied)
            self.carried += 1
        if isinstance(rows, NoScriptError):  # the server forgot its scripts: pop as usual
            try:
                return await transport.fetch_first(queues, count, 0), outcome
            except BrokerError as exc:
                return exc, outcome
        if isinstance(rows, ResponseError):
            return broker_error(rows), outcome
        return split_levels(queues, rows), outcome


def carried_pop(transport: Any, store: Any) -> CarriedPop | None:
    """A :class:`CarriedPop` for ``transport`` and ``store`` when they can carry (a lists
    transport and the Redis state store on one single-server connection whose pops can be
    pipelined, without replica waits); else ``None``."""
    if not isinstance(transport, ListsTransport) or not isinstance(store, RedisStateStore):
        return None
    conn = transport.conn
    if store.conn is not conn or conn.cluster or isinstance(conn.client, ReplicatedRedis):
        return None
    if not transport.popper.pipelines:
        return None
    return CarriedPop(transport, store)
