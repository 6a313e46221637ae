"""A lock place taken by a start check whose reply was lost is given back with the deferral.

The fault (see ``test_unique_lost_reply.py``): the worker's ``lock_acquire`` script runs on
the real Redis and its reply is lost. The check raises, the task is deferred (an outage),
and its next delivery is a new holder. Before the fix the first holder's place stood until
its lease lapsed (``lock_ttl``, here 300 s), so the task waited behind its own lost place;
now the deferral's completion gives it back and the task runs at its next start.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from blitzq import Queue

from .proc_tasks import make_worker, running
from .test_unique_lost_reply import LostReply, producer_client


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_lost_lock_reply_does_not_hold_the_lock_for_a_lease(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(name="ll", mode=mode)
    try:

        @queue.task(name="ll.locked", lock="k:{x}", lock_limit=1, lock_ttl=300)
        async def locked(x: int) -> int:
            return 3 * x

        lock_key = queue.broker.state.keys.lock("k:1")
        lost = LostReply(
            producer_client(queue), lambda args: args[0] == "EVALSHA" and lock_key in args
        )
        try:
            handle = await locked.enqueue(1)
            async with running(make_worker(queue, concurrency=2, defer_base_delay=0.1)):
                assert await handle.result(timeout=30) == 3
        finally:
            lost.remove()
        assert lost.lost == ["EVALSHA"]
        client = producer_client(queue)
        assert await client.zcard(lock_key) == 0  # no place left behind
    finally:
        await queue.close()
