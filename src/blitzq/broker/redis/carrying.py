"""Fetches that carry a batch of completions: both in one round trip.

Under load a worker's two commands are its non-blocking fetches and its completion batches
(``complete.lua``): two round trips per batch. A carrier sends the completions the worker
has waiting and the next non-blocking fetch in one write on one connection, and reads both
replies (``EVALSHA complete``, then the fetch: the server applies the completions first).
No new script: the same two, pipelined.

- :class:`Carrier`, fast mode: the fetch is the pop (``EVALSHA pop_levels``), read under the
  :class:`~.popping.Popper`'s deadline, which a pause or a stall cannot trip
  (``popping.py``).
- :class:`StreamCarrier`, reliable mode: the fetch is the look (``EVALSHA fetch_levels``),
  each reply read under ``socket_timeout`` as the look alone is. A carried completion is
  fenced as a written one is (``fencing.lua``: applied only while its entry is pending to
  this consumer). A backlog's large fetch, read with plain ``XREADGROUP`` commands
  (``streams.py``), carries nothing.

What stays as it was:

- a connection error sends both again (the client's retries): a completion applies once
  however often it is sent (its guard, ``completion.py``; a stream completion's entry is
  acked), a fetch sent again is what a retried fetch always was;
- the completions are the flusher's (``worker/flusher.py``): it hands a batch to the fetch
  only while it is not writing one itself, and writes it itself when the carried try is not
  known to be applied (an error reply, a failed connection, a cancelled fetch), with its
  own retries and refusal handling;
- a blocking fetch (``BLMPOP``, ``XREADGROUP BLOCK``) never carries completions: a
  completion never waits for work to arrive.

Only on one server (:attr:`~.popping.Popper.direct` for the lists; a client whose commands
go to its pool directly, :func:`~.pool.direct_pool`, for the streams) and a store that
neither waits for replicas (``complete_durably``) nor writes through an outbox: elsewhere
the broker has no carrier.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..transport import Delivery
from ..values import Completion
from .client import REDIS_ERRORS, broker_error
from .keys import GROUP
from .lists import ListsTransport
from .pool import direct_pool, run_direct_many
from .scripts import load
from .store import RedisStateStore
from .streams import StreamsTransport

__all__ = ["Carrier", "Settle", "StreamCarrier", "carrier_for"]

#: Called once with what became of the carried completions: the stale ones (applied, an
#: empty list in fast mode), or ``None`` when they are not known to be applied.
Settle = Callable[[list[Completion] | None], None]


class Carrier:
    """Fast mode's pops with a batch of completions in the same round trip (see the module
    docstring).

    Args:
        transport: the lists transport popped from.
        state: the state store on the same connection that applies the completions.
    """

    __slots__ = ("_popper", "_state", "_transport")

    def __init__(self, transport: ListsTransport, state: RedisStateStore) -> None:
        self._transport = transport
        self._state = state
        self._popper = transport.popper

    async def fetch_first(
        self,
        queues: Sequence[str],
        count: int,
        completions: Sequence[Completion],
        settle: Settle,
    ) -> list[Delivery]:
        """Apply ``completions`` and pop up to ``count`` messages from ``queues`` in order
        (as :meth:`ListsTransport.fetch_first` without blocking), in one round trip.

        ``settle`` is called exactly once, before this returns or raises: with the stale
        completions when the server applied the batch, with ``None`` when that is not known
        (the caller writes them again; they apply once).

        Raises:
            BrokerError: the pop failed (a failed connection, an error reply); whatever
                became of the completions was settled first.
        """
        transport = self._transport
        head = transport.levels_of(queues).head  # None on a cluster (never carried there)
        call = None if head is None else self._state.prepare_complete(completions)
        if call is None or head is None:  # nothing to apply, or no carrying: a plain pop
            settle([] if head is not None else None)
            return await transport.fetch_first(queues, count, 0)
        complete = load("complete")
        _, rows = await _send(
            call,
            settle,
            self._popper.execute_many(
                ("EVALSHA", complete.sha, len(call.keys), *call.keys, *call.args),
                (*head, count),
            ),
        )
        if isinstance(rows, NoScriptError):  # a server that lost its scripts: nothing popped
            return await transport.fetch_first(queues, count, 0)
        if isinstance(rows, Exception):
            raise broker_error(rows) from rows
        return transport.deliveries(queues, rows)


class StreamCarrier:
    """Reliable mode's look (``fetch_levels.lua``) with a batch of completions in the same
    round trip: ``EVALSHA complete`` then ``EVALSHA fetch_levels`` in one write on one
    connection of the pool (:func:`~.pool.run_direct_many`: each reply read under
    ``socket_timeout``, a connection error sends both again, as redis-py would send each).
    The stream completions of a retried batch are fenced as always (their entries are
    acked); a look sent again takes what a look retried by redis-py takes.

    Args:
        transport: the streams transport read from.
        state: the state store on the same connection that applies the completions.
        pool: the client's pool (:func:`~.pool.direct_pool`).
    """

    __slots__ = ("_pool", "_state", "_transport")

    def __init__(self, transport: StreamsTransport, state: RedisStateStore, pool: Any) -> None:
        self._transport = transport
        self._state = state
        self._pool = pool

    async def fetch_first(
        self,
        queues: Sequence[str],
        count: int,
        completions: Sequence[Completion],
        settle: Settle,
    ) -> list[Delivery]:
        """Apply ``completions`` and take up to ``count`` new entries from ``queues`` in
        order (as :meth:`StreamsTransport.fetch_first` without blocking), in one round trip.
        ``settle`` as for :meth:`Carrier.fetch_first`.

        Raises:
            BrokerError: the read failed; whatever became of the completions was settled
                first.
        """
        transport = self._transport
        if transport.plain_reads_due(queues, count):  # a backlog's plain reads go alone
            settle(None)
            return await transport.fetch_first(queues, count, 0)
        call = self._state.prepare_complete(completions)
        if call is None:  # nothing to apply
            settle([])
            return await transport.fetch_first(queues, count, 0)
        transport.looking(queues)
        keys = [transport.keys.stream(q) for q in queues]
        complete, look = load("complete"), load("fetch_levels")
        _, rows = await _send(
            call,
            settle,
            run_direct_many(
                self._pool,
                (
                    ("EVALSHA", complete.sha, len(call.keys), *call.keys, *call.args),
                    ("EVALSHA", look.sha, len(keys), *keys, GROUP, transport.consumer, count),
                ),
            ),
        )
        if isinstance(rows, NoScriptError):  # a server that lost its scripts: nothing taken
            return await transport.fetch_first(queues, count, 0)
        if isinstance(rows, Exception):
            raise broker_error(rows) from rows
        return transport.deliveries(queues, count, rows)


async def _send(call: Any, settle: Settle, sending: Awaitable[list[Any]]) -> list[Any]:
    """Await ``sending`` (the completion's call, then the fetch), settle the completions by
    its first reply, and return both replies.

    Raises:
        BrokerError: the round trip failed (the completions settled as not known applied).
    """
    try:
        replies = await sending
    except BaseException as exc:
        call.failed()
        settle(None)
        if isinstance(exc, REDIS_ERRORS):
            raise broker_error(exc) from exc
        raise
    done = replies[0]
    if isinstance(done, Exception):  # refused (or NOSCRIPT): the flusher writes it itself
        call.failed()
        settle(None)
    else:
        settle(call.applied(done))
    return replies


def carrier_for(transport: Any, state: Any) -> Carrier | StreamCarrier | None:
    """A carrier for a broker of ``transport`` and ``state``, or ``None`` where none can
    serve: not the Redis store on the transport's own connection, a Cluster, a store that
    waits for replicas; for lists, a pool without ``socket_timeout``
    (:attr:`~.popping.Popper.direct`); for streams, a client whose commands do not go to
    its pool directly (:func:`~.pool.direct_pool`)."""
    if not isinstance(state, RedisStateStore):
        return None
    if state.conn is not getattr(transport, "conn", None) or state.outbox is not None:
        return None
    if state.replicated:
        return None
    if isinstance(transport, ListsTransport):
        return Carrier(transport, state) if transport.popper.direct else None
    if type(transport) is StreamsTransport and not transport.conn.cluster:  # not spread.py's
        pool = direct_pool(transport.client, "EVALSHA")
        return None if pool is None else StreamCarrier(transport, state, pool)
    return None
