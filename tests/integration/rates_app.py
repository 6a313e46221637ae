"""The application module the dashboard's rate test runs in real worker processes
(``blitzq worker tests.integration.rates_app:queue --workers 2``): a Queue read from
``BLITZQ_REDIS_URL`` / ``BLITZQ_NAMESPACE`` and one short task, every tenth call failing."""

from __future__ import annotations

import asyncio

from blitzq import Queue

queue = Queue()


@queue.task(name="nap")
async def nap(i: int) -> int:
    """Sleep a little and return ``i``; fail for every tenth ``i``."""
    await asyncio.sleep(0.02)
    if i % 10 == 0:
        raise ValueError(f"nap {i}")
    return i
