"""Waits that ride out transient broker errors until their deadline.

A wait with a timeout (``result()``, ``get_results()``, a workflow's ``get()``, the results
of its groups and chords) returns or raises within its timeout plus :data:`GRACE`. A broker
that is briefly away (a restart, a failover, a paused or stalled server: a timeout, a
refused or reset connection) is not a failure of the wait: every broker call a wait makes
goes through :func:`patiently`, which tries again until the wait's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..exceptions import BrokerError

__all__ = ["GRACE", "PAUSE", "patiently"]

T = TypeVar("T")

#: Seconds past its deadline a wait may take to give up on a broker call that never answers.
GRACE = 1.0

#: Longest pause (seconds) between two tries of a call that failed with a transient error.
PAUSE = 0.5


async def patiently(call: Callable[[], Awaitable[T]], deadline: float) -> T:
    """``await call()``, tried again after a transient :class:`~blitzq.BrokerError` until
    ``deadline``.

    Each try is bounded by the time left plus :data:`GRACE` seconds (a server that accepts
    and never answers cannot hold the wait for its socket timeout). A call a wait makes to
    decide what to do next (read a record, a workflow's steps) is safe to run again.

    Args:
        call: makes the awaitable of one try (called once per try).
        deadline: ``time.monotonic()`` past which a transient error is raised, not retried.

    Returns:
        What the first try that succeeded returned.

    Raises:
        BrokerError: a non-transient one at once; a transient one once the deadline has
            passed (also when a try was not answered by the deadline plus :data:`GRACE`).
        Exception: whatever else ``call`` raises, at once.
    """
    while True:
        left = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, left) + GRACE) as bound:
                return await call()
        except TimeoutError:
            if not bound.expired():
                raise
            raise BrokerError(
                f"the broker did not answer within {max(0.0, left) + GRACE:.1f} s "
                "(the wait's deadline passed)",
                True,
            ) from None
        except BrokerError as exc:
            if not exc.transient or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(min(PAUSE, max(0.0, deadline - time.monotonic())))
