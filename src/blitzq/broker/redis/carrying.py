"""Fast mode's pop that carries a batch of completions: both in one round trip.

In fast mode a worker's two commands under load are its pops (``pop_levels.lua``) and its
completion batches (``complete.lua``); with results stored that is two round trips where
reliable mode also makes two, so fast mode saved nothing but the server's ack. A
:class:`Carrier` sends the completions the worker has waiting and the next non-blocking pop
in one write on one connection, and reads both replies (``EVALSHA complete``, then
``EVALSHA pop_levels``: the server applies the completions first). No new script: the
same two, pipelined.

What stays as it was:

- the pop is read under the :class:`~.popping.Popper`'s deadline, which a pause or a stall
  cannot trip (``popping.py``); a connection error sends both again (the client's retries):
  a completion applies once however often it is sent (its guard, ``completion.py``), a pop
  sent again is what a retried pop always was;
- the completions are the flusher's (``worker/flusher.py``): it hands a batch to the pop
  only while it is not writing one itself, and writes it itself when the carried try is not
  known to be applied (an error reply, a failed connection, a cancelled fetch), with its
  own retries and refusal handling;
- a blocking pop (``BLMPOP``) never carries completions: a completion never waits for work
  to arrive.

Only on one server or Sentinel-less pools (:attr:`~.popping.Popper.direct`) and a store that
does not wait for replicas (``complete_durably``): elsewhere the broker has no carrier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..transport import Delivery
from ..values import Completion
from .client import REDIS_ERRORS, broker_error
from .lists import ListsTransport
from .scripts import load
from .store import RedisStateStore

__all__ = ["Carrier", "Settle", "carrier_for"]

#: Called once with what became of the carried completions: the stale ones (applied, an
#: empty list in fast mode), or ``None`` when they are not known to be applied.
Settle = Callable[[list[Completion] | None], None]


class Carrier:
    """Pops with a batch of completions in the same round trip (see the module docstring).

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
        try:
            done, rows = await self._popper.execute_many(
                ("EVALSHA", complete.sha, len(call.keys), *call.keys, *call.args),
                (*head, count),
            )
        except BaseException as exc:
            call.failed()
            settle(None)
            if isinstance(exc, REDIS_ERRORS):
                raise broker_error(exc) from exc
            raise
        if isinstance(done, Exception):  # refused (or NOSCRIPT): the flusher writes it itself
            call.failed()
            settle(None)
        else:
            settle(call.applied(done))
        if isinstance(rows, NoScriptError):  # a server that lost its scripts: nothing popped
            return await transport.fetch_first(queues, count, 0)
        if isinstance(rows, Exception):
            raise broker_error(rows) from rows
        return transport.deliveries(queues, rows)


def carrier_for(transport: Any, state: Any) -> Carrier | None:
    """A :class:`Carrier` for a broker of ``transport`` and ``state``, or ``None`` where
    none can serve: not the lists transport and the Redis store on one connection, a
    Cluster or a pool without ``socket_timeout`` (:attr:`~.popping.Popper.direct`), or a
    store that waits for replicas."""
    if not isinstance(transport, ListsTransport) or not isinstance(state, RedisStateStore):
        return None
    if state.conn is not transport.conn or state.outbox is not None or state.replicated:
        return None
    if not transport.popper.direct:
        return None
    return Carrier(transport, state)
