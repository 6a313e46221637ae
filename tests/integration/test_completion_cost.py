"""What ``complete.lua`` does to spare the server (issue 29), on Redis and the embedded Valkey:
acked entries at the head of a stream go with one ``XTRIM MINID`` (exactly those: an older
entry still pending stays, and the acked ones behind it go with ``XDEL``), and a record is
still pushed to a subscriber of its done channel when the script checks for subscribers
before publishing (``PUBSUB NUMSUB``) instead of publishing every record. Entry ids are
ordered as numbers though compared as strings (``"<ms>-10"`` after ``"<ms>-9"``).
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


async def test_entry_ids_of_different_widths_are_ordered_as_numbers(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    # Entries 5-0 .. 5-11: "5-10" sorts before "5-9" as bytes. The script orders them as
    # numbers.
    queue = make_queue()
    stream = "{" + namespace + "}:s:default"
    await queue.broker.prepare_consumer(["default"], "c1")
    for seq in range(12):
        await raw_redis.xadd(stream, {"m": f"m{seq}"}, id=f"5-{seq}")
    deliveries = await queue.broker.fetch("default", 12, 0)
    by_seq = {int(d.token.split(b"-")[1]): d for d in deliveries}
    assert sorted(by_seq) == list(range(12))
    head = [by_seq[s] for s in (7, 0, 5, 1, 6, 2, 4, 3)]  # out of order: trimmed at once
    done = [Completion("default", d.token, f"h{i}", b"rec", 60) for i, d in enumerate(head)]
    assert await queue.broker.complete(done) == []
    left = [e[0] for e in await raw_redis.xrange(stream)]
    assert left == [by_seq[s].token for s in (8, 9, 10, 11)]
    # 8 and 10 acked, 9 still pending (older than 10): nothing may be trimmed past 9, and
    # both acked entries leave the stream (XDEL). Taken as bytes, "8" would be the largest.
    done = [Completion("default", by_seq[s].token, f"t{s}", b"rec", 60) for s in (8, 10)]
    assert await queue.broker.complete(done) == []
    left = [e[0] for e in await raw_redis.xrange(stream)]
    assert left == [by_seq[s].token for s in (9, 11)]
    # The last two, the head of the stream: trimmed at once ("9" the larger as bytes).
    done = [Completion("default", by_seq[s].token, f"r{s}", b"rec", 60) for s in (11, 9)]
    assert await queue.broker.complete(done) == []
    assert await raw_redis.xlen(stream) == 0
    assert (await raw_redis.xpending(stream, "blitzq"))["pending"] == 0
    assert await raw_redis.get("{" + namespace + "}:t:r9") == b"rec"
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


@pytest.mark.parametrize("others", [0, 100])
async def test_a_large_batch_reaches_the_one_subscriber_among_its_records(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, others: int
) -> None:
    # 70 records in one batch: with few channels on the server the script looks them up with
    # INFO and PUBSUB CHANNELS of its prefix's done channels (the prefix's glob characters
    # escaped), with more than 70 (others) with PUBSUB NUMSUB as for a small batch.
    ns = namespace + "*?[x]\\"
    queue = make_queue(namespace=ns)
    deliveries = await _fetched(queue, 70)
    pubsub = raw_redis.pubsub()
    wanted = "{" + ns + "}:done:t5"
    near = "{" + namespace + "Q?[x]\\}:done:t6"  # matches the pattern were it not escaped
    channels = [wanted, near, *(f"{namespace}:other:{i}" for i in range(others))]
    await pubsub.subscribe(*channels)
    try:
        for _ in channels:
            confirmed = await pubsub.get_message(timeout=5)
            assert confirmed is not None
            assert confirmed["type"] == "subscribe"
        done = [
            Completion("default", d.token, f"t{i}", b"rec%d" % i, 60)
            for i, d in enumerate(deliveries)
        ]
        assert await queue.broker.complete(done) == []
        message = None
        async with asyncio.timeout(10):
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        assert (message["channel"], message["data"]) == (wanted.encode(), b"rec5")
        assert await raw_redis.get("{" + ns + "}:t:t69") == b"rec69"
    finally:
        await pubsub.aclose()
        await queue.close()


async def test_acked_entries_below_newer_pending_ones_go_at_once_and_those_stay(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    # The cut of the XTRIM is the group's oldest pending entry: the three acked ones below
    # it go, the two still pending (newer) stay in the stream and in the pending list.
    queue = make_queue()
    stream = "{" + namespace + "}:s:default"
    deliveries = await _fetched(queue, 5)
    done = [Completion("default", d.token, f"t{i}", b"rec", 60) for i, d in enumerate(deliveries)]
    assert await queue.broker.complete(done[:3]) == []
    left = [e[0] for e in await raw_redis.xrange(stream)]
    assert left == [d.token for d in deliveries[3:]]
    assert (await raw_redis.xpending(stream, "blitzq"))["pending"] == 2
    # Acked out of order around a pending one: only the acked one goes.
    assert await queue.broker.complete(done[4:]) == []
    assert [e[0] for e in await raw_redis.xrange(stream)] == [deliveries[3].token]
    assert await queue.broker.complete(done[3:4]) == []
    assert await raw_redis.xlen(stream) == 0
    await queue.close()


async def test_the_records_of_a_batch_expire_in_their_ttl_and_the_later_one_of_a_task_stays(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    # The records of a run of plain successes are written with one MSET and a PEXPIREAT
    # each (the server's clock, plus the TTL): each expires in its TTL, and of two records of
    # one task in one batch the later one stays, as with a SET each.
    queue = make_queue()
    p = "{" + namespace + "}:"
    deliveries = await _fetched(queue, 4)
    done = [
        Completion("default", deliveries[0].token, "t0", b"first", 60),
        Completion("default", deliveries[1].token, "t1", b"one", 60),
        Completion("default", deliveries[2].token, "t0", b"second", 60),
        Completion("default", deliveries[3].token, "t3", b"long", 86400),
    ]
    assert await queue.broker.complete(done) == []
    stored = await raw_redis.mget([p + "t:t0", p + "t:t1", p + "t:t3"])
    assert stored == [b"second", b"one", b"long"]
    for key in ("t:t0", "t:t1"):
        assert 58_000 <= await raw_redis.pttl(p + key) <= 60_000
    assert 86_398_000 <= await raw_redis.pttl(p + "t:t3") <= 86_400_000
    await queue.close()


@pytest.mark.parametrize("size", [1, 2])
async def test_a_batch_of_one_or_two_records_stores_each_in_its_ttl_and_empties_the_stream(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, size: int
) -> None:
    # One or two records go with a SET each (fewer calls than MSET, TIME and a PEXPIREAT
    # each), a single acked entry with one XDEL: the same records, TTLs and stream after.
    queue = make_queue()
    p = "{" + namespace + "}:"
    deliveries = await _fetched(queue, size)
    ttls = [60, 86400][:size]
    done = [
        Completion("default", d.token, f"t{i}", f"r{i}".encode(), ttl)
        for i, (d, ttl) in enumerate(zip(deliveries, ttls, strict=True))
    ]
    assert await queue.broker.complete(done) == []
    assert await raw_redis.mget([f"{p}t:t{i}" for i in range(size)]) == [
        f"r{i}".encode() for i in range(size)
    ]
    for i, ttl in enumerate(ttls):
        assert (ttl - 2) * 1000 <= await raw_redis.pttl(f"{p}t:t{i}") <= ttl * 1000
    assert await raw_redis.xlen(p + "s:default") == 0
    assert (await raw_redis.xpending(p + "s:default", "blitzq"))["pending"] == 0
    await queue.close()
