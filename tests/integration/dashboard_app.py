"""The application module the dashboard command tests serve (``blitzq dashboard
tests.integration.dashboard_app:queue``): a Queue read from ``BLITZQ_REDIS_URL`` /
``BLITZQ_NAMESPACE``, one task and one periodic entry in a time zone of its own."""

from __future__ import annotations

from blitzq import Queue
from blitzq.schedules import Cron

queue = Queue()


@queue.task
async def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


queue.add_periodic(add, Cron("30 6 * * *", tz="Asia/Tokyo"), name="morning", args=(1, 2))
