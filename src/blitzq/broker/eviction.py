"""Whether the server's memory policy can evict blitzq's keys, and the start-up check.

Redis and Valkey evict keys only when ``maxmemory`` is set (non-zero) and reached; which keys
depends on ``maxmemory-policy``:

- ``noeviction`` (the server default): nothing is evicted; writes that need memory are
  refused (enqueue fails with :class:`~blitzq.BrokerError`) until memory is freed. Running
  workers keep draining, and a new worker starts without writes the server may refuse.
- ``allkeys-lru``, ``allkeys-lfu``, ``allkeys-random``: *any* key, including queued messages
  (``{ns}:s:<q>`` streams, ``{ns}:l:<q>`` lists), the schedule of delayed tasks and retries
  (``{ns}:sched``, ``{ns}:sched:m``), dead letters, periodic state and registries. Tasks
  vanish without a trace: no run, no dead letter, no log.
- ``volatile-lru``, ``volatile-lfu``, ``volatile-random``, ``volatile-ttl``: keys with an
  expiry: task records and results (``{ns}:t:<id>``), workflow state and chord joins
  (``{ns}:wf:<id>``), unique-task keys (``{ns}:u:…``), lock places (``{ns}:lk:<key>``),
  progress (``{ns}:p:<id>``) and rate-limit buckets (``{ns}:rl:<key>``). Queued and scheduled
  messages have no expiry and stay; a result can vanish before ``result_ttl``, a workflow
  can stall, a unique task can run twice and a lock can be exceeded.

:func:`check_eviction` runs at worker start and in ``blitzq queue stats``: it logs a WARNING
naming the policy, or refuses (``strict=True``) with :class:`~blitzq.ConfigurationError`.
"""

from __future__ import annotations

import logging

from ..exceptions import BrokerError, ConfigurationError
from . import Broker

logger = logging.getLogger("blitzq.broker")

_ALLKEYS = "any key: queued messages, delayed tasks and retries, records, dead letters"
_VOLATILE = (
    "keys with an expiry: task records and results, workflow state, unique-task keys, "
    "lock places, progress and rate-limit buckets"
)


def eviction_risk(policy: str, maxmemory: int) -> str | None:
    """What ``policy`` can evict of blitzq's keys, or ``None`` when nothing.

    Args:
        policy: the server's ``maxmemory-policy`` (e.g. ``"allkeys-lru"``).
        maxmemory: the server's ``maxmemory`` in bytes; ``0`` means no limit, so nothing
            is ever evicted.

    Returns:
        A short description of the keys at risk, or ``None``.
    """
    if maxmemory <= 0 or policy == "noeviction":
        return None
    if policy.startswith("allkeys-"):
        return _ALLKEYS
    if policy.startswith("volatile-"):
        return _VOLATILE
    return f"keys by a policy blitzq does not know ({policy})"


async def check_eviction(broker: Broker, *, strict: bool = False) -> str | None:
    """Warn (or refuse) when the broker's server may evict blitzq's keys.

    Args:
        broker: the broker to check; backends without a memory policy pass.
        strict: raise instead of warning.

    Returns:
        The warning logged, or ``None`` when the policy is safe or unknown (the server
        does not answer INFO, or the backend has no such setting).

    Raises:
        ConfigurationError: ``strict`` and the policy can evict blitzq's keys.
    """
    try:
        found = await broker.memory_policy()
    except BrokerError as exc:
        logger.debug("could not read the server's memory policy: %s", exc)
        return None
    if found is None:
        return None
    policy, maxmemory = found
    risk = eviction_risk(policy, maxmemory)
    if risk is None:
        return None
    message = (
        f"the server's maxmemory-policy is {policy} (maxmemory {maxmemory} bytes): when memory "
        f"is full it evicts {risk}, silently; use maxmemory-policy noeviction"
    )
    if strict:
        raise ConfigurationError(message)
    logger.warning("%s", message)
    return message
