"""The client's cost of one non-blocking fetch: fast mode's pop (``ListsTransport.fetch_first``,
``pop_levels.lua`` through the ``Popper``) or reliable mode's read (``StreamsTransport
.fetch_first``, ``fetch_levels.lua``), over a queue's three priority levels.

``CALLS`` fetches of ``COUNT`` messages each from a queue filled beforehand (``full``), or
``CALLS`` fetches that find every level empty (``empty``); prints the process's CPU time per
fetch as JSON. Meant to run under callgrind twice with two values of ``CALLS`` (the difference
of the two instruction counts over the difference of ``CALLS`` is one fetch's instructions,
start-up cancelled; steady on a loaded machine, where the drains' rates are not). Nothing
runs but the fetches: no worker, no maintenance loop (under valgrind a worker's loops that
run by the second make a drain's count depend on how long it took).

argv: mode (``fast`` | ``reliable``), ``CALLS``, ``COUNT`` (10), kind (``full`` | ``empty``).
Env: ``BARS_REDIS_URL`` (a private server). The namespace's keys are deleted at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid

from blitzq import Queue

LEVELS = ["default:high", "default", "default:low"]


async def main(mode: str, calls: int, count: int, kind: str) -> None:
    """Fill the queue (``full``), time ``calls`` fetches of ``count``, print the figures."""
    namespace = "popcost" + uuid.uuid4().hex[:8]
    queue = Queue(
        name="default",
        redis_url=os.environ["BARS_REDIS_URL"],
        namespace=namespace,
        mode=mode,
        store_results=False,
    )
    broker = queue.broker
    await broker.prepare_consumer(LEVELS, "c1")
    total = calls * count if kind == "full" else 0
    message = b"x" * 57
    for start in range(0, total, 1000):
        await broker.transport.publish("default", [message] * min(1000, total - start))
    fetch = broker.fetch_first
    cpu0 = time.process_time()
    got = 0
    for _ in range(calls):
        got += len(await fetch(LEVELS, count, 0))
    cpu = time.process_time() - cpu0
    if got != total:
        raise SystemExit(f"fetched {got} of {total}")
    client = broker.transport.client
    keys = [k async for k in client.scan_iter(match=f"*{namespace}*")]
    if keys:
        await client.delete(*keys)
    print(json.dumps({"mode": mode, "kind": kind, "cpu_us_per_fetch": round(cpu / calls * 1e6, 2)}))


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1],
            int(sys.argv[2]),
            int(sys.argv[3]) if len(sys.argv) > 3 else 10,
            sys.argv[4] if len(sys.argv) > 4 else "full",
        )
    )
