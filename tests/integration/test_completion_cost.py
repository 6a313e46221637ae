"""What ``complete.lua`` does to spare the server (issue 29), on Redis and the embedded Valkey:
acked entries at the head of a stream go with one ``XTRIM MINID`` (exactly those: an older
entry still pending stays, and the acked ones behind it go with ``XDEL``), and a record is
still pushed to a subscriber of its done channel when the script checks for subscribers
before publishing (``PUBSUB NUMSUB``) instead of publishing every record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker import Completion

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_servers]


async def _fetched(queue: Queue, n: int) -> list[Any]:
    broker = queue.broker
    await broker.prepare_consumer(["default"], "c1")
    await broker.publish("default", [f"m{i}".encode() for i in range(n)])
    deliveries = await broker.fetch("default", n, 0)
    assert len(deliveries) == n
    return deliveries


async def test_acked_entries_leave_the_stream_and_an_older_pending_one_stays(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue()
    stream = "{" + namespace + "}:s:default"
    first, *rest = await _fetched(queue, 5)
    done = [Completion("default", d.token, f"t{i}", b"rec", 60) for i, d in enumerate(rest)]
    assert await queue.broker.complete(done) == []
    # The oldest entry is still pending: only the four acked ones are gone (XDEL).
    assert [e[0] for e in await raw_redis.xrange(stream)] == [first.token]
    assert (await raw_redis.xpending(stream, "blitzq"))["pending"] == 1
    assert await queue.broker.complete([Completion("default", first.token, "t9", b"r", 60)]) == []
    assert await raw_redis.xlen(stream) == 0
    # A fresh batch at the head of the stream goes at once (XTRIM MINID), all of it.
    head = await _fetched(queue, 3)
    more = await queue.broker.fetch("default", 1, 0)
    assert more == []
    await queue.broker.publish("default", [b"later"])
    done = [Completion("default", d.token, f"h{i}", b"rec", 60) for i, d in enumerate(head)]
    assert await queue.broker.complete(done) == []
    assert [e[1] for e in await raw_redis.xrange(stream)] == [{b"m": b"later"}]
    assert await raw_redis.get("{" + namespace + "}:t:h2") == b"rec"
    await queue.close()


async def test_a_record_still_reaches_a_subscriber_of_its_channel(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue()
    (delivery,) = await _fetched(queue, 1)
    pubsub = raw_redis.pubsub()
    channel = "{" + namespace + "}:done:t1"
    await pubsub.subscribe(channel)
    try:
        confirmed = await pubsub.get_message(timeout=5)
        assert confirmed is not None
        assert confirmed["type"] == "subscribe"
        done = [Completion("default", delivery.token, "t1", b"the record", 60)]
        assert await queue.broker.complete(done) == []
        message = None
        async with asyncio.timeout(10):
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        assert message["data"] == b"the record"
    finally:
        await pubsub.aclose()
        await queue.close()
