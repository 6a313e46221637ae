"""The Redis state store: records, results, schedule, dead letters, feature state, completions.

:class:`RedisStateStore` is the :class:`~blitzq.broker.state.StateStore` of every Redis
deployment, put together from parts by concern: ``state.py`` (completions, schedule, cancel,
periodic, rate limits), ``records.py`` (records, workflow state, progress), ``dead_letters.py``,
``inspection.py`` (registries, counters), ``control.py`` (unique keys, locks),
``scaling.py`` (autoscale setpoint, supervisor status) and ``schedules.py`` (run-time
periodic entries), all reading
one :class:`~.connection.RedisConnection`. Its logic is the Lua in ``lua/``.
"""

from __future__ import annotations

from ..outbox import Outbox
from ..state import StateStore
from ..transport import Transport
from .connection import RedisPart
from .control import RedisControl
from .dead_letters import RedisDeadLetters
from .inspection import RedisInspection
from .outbox import RedisOutbox
from .records import RedisRecords
from .scaling import RedisScaling
from .schedules import RedisSchedules
from .state import RedisState

__all__ = ["RedisStateStore"]


class RedisStateStore(
    RedisState,
    RedisRecords,
    RedisDeadLetters,
    RedisInspection,
    RedisControl,
    RedisScaling,
    RedisSchedules,
    StateStore,
):
    """The Redis state store on a connection it may share with a Redis transport.

    Args:
        conn: the :class:`~.connection.RedisConnection` (its ``kind`` says where the
            store's writes into queues go, and whether completions are fenced by stream
            leases).
    """

    def acks(self, transport: Transport) -> bool:
        """``True`` for a Redis transport on this store's connection: ``complete.lua`` acks
        (XACK + XDEL) and fences its stream entries in the same script as the writes."""
        return isinstance(transport, RedisPart) and transport.conn is self.conn

    def use_outbox(self) -> Outbox:
        """Switch this store to outbox mode (kind ``"o"``) and return its
        :class:`~.outbox.RedisOutbox`: every message its scripts write into a queue goes to
        ``{ns}:outbox:<queue>`` from now on, whatever the connection's kind, and completions
        are never fenced (the transport's leases are not this store's). For good: a store in
        outbox mode serves one pairing."""
        self.kind = "o"
        return RedisOutbox(self.conn)
