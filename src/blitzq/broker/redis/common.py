"""The Redis broker both modes share: the Redis state store put together.

The two modes differ only in where a queue's messages wait (a stream with a consumer group, or
a list) and so in publish, fetch, ack, heartbeat and recovery -- the transport; see
``reliable.py`` and ``fast.py``. Everything else is the state store, in parts by concern:
``state.py`` (completions, schedule, cancel, periodic, rate limits), ``records.py`` (records,
workflow state, progress), ``dead_letters.py``, ``inspection.py`` (registries, counters) and
``control.py`` (unique keys, locks), all on ``connection.py``.
"""

from __future__ import annotations

from .. import Broker
from .connection import DEFAULT_DEAD_LETTER_CAP
from .control import RedisControl
from .dead_letters import RedisDeadLetters
from .inspection import RedisInspection
from .records import RedisRecords
from .state import RedisState

__all__ = ["DEFAULT_DEAD_LETTER_CAP", "RedisBroker"]


class RedisBroker(
    RedisState, RedisRecords, RedisDeadLetters, RedisInspection, RedisControl, Broker
):
    """Base of the Redis brokers: the Redis state store; a mode adds its transport.

    Args:
        See :class:`~.connection.RedisConnection`.

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value.
    """
