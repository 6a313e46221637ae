"""Fast mode's pop path alone: ``ListsTransport.fetch_first`` over a queue's three levels,
through the ``Popper``, on a stand-in connection whose reply (10 messages) is always there.

No server and no I/O, so an instruction count under callgrind depends on the code only, not on
how busy the machine is (``bench/pop_cost.py``'s real round trips add turns of the event loop
when the server's reply is late, which a loaded machine makes it). Run it under callgrind with
two values of ``N`` (1,000 and 6,000): the difference of the counts over 5,000 is one pop's
instructions, start-up cancelled. Each pop is followed by one turn of the event loop (a real
pop waits for its reply at least once), which runs the deadline timers due. The stand-in pool
and connection replace the popper's private ones (``Popper._pool``); the URL is never
connected to.

argv: ``N``. Prints the number of messages popped.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from blitzq import Queue

LEVELS = ["default:high", "default", "default:low"]
ROWS: list[Any] = [0, 10, 0] + [b"m" * 57] * 10  # pop_levels.lua's reply: counts, messages


class StandInConnection:
    """What the popper uses of a redis-py connection; every reply is :data:`ROWS`."""

    retry = Retry(NoBackoff(), 0)

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        """Send nothing."""

    async def read_response(self, timeout: float | None = None, **kwargs: Any) -> Any:
        """A copy of :data:`ROWS`, at once."""
        return list(ROWS)

    async def disconnect(self, nowait: bool = False) -> None:
        """Close nothing."""


class StandInPool:
    """One :class:`StandInConnection`, handed out and taken back."""

    connection = StandInConnection()

    async def get_connection(self, *args: Any, **kwargs: Any) -> StandInConnection:
        """The connection."""
        return self.connection

    async def release(self, connection: StandInConnection) -> None:
        """Take it back."""


async def main(n: int) -> None:
    """Pop ``n`` times (10 messages each) and print how many messages came."""
    queue = Queue(
        name="default",
        redis_url="redis://127.0.0.1:1/0?socket_timeout=5",
        namespace="poppath",
        mode="fast",
    )
    transport: Any = queue.broker.transport
    transport.popper._pool = StandInPool()
    transport.popper._timeout = 5.0
    got = 0
    for _ in range(n):
        got += len(await transport.fetch_first(LEVELS, 10, 0))
        await asyncio.sleep(0)
    if got != 10 * n:
        raise SystemExit(f"popped {got} of {10 * n}")
    print(got)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
