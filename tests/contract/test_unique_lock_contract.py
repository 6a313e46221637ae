"""Contract: unique-task keys and task locks behave the same on every broker.

``claim_unique`` claims keys atomically (a held key answers its holder);
``enqueue_unique`` claims a key and writes its message in one step (a held key writes
nothing; a key held by the item's own id is a retry whose message is already written); the
``unique_release`` completion op frees a key only while it holds the given id, and keys
expire after their TTL. ``acquire_lock`` gives at most ``limit`` places, frees expired
leases, lets a holder renew its own place; ``renew_locks`` renews only places still held;
``lock_release`` gives a place back together with the ack.
"""

from __future__ import annotations

import asyncio
import time

from blitzq.broker import Broker, Completion
from blitzq.broker.effects import LockRelease, UniqueRelease
from blitzq.broker.state import UniqueSend
from blitzq.serialization import Envelope, encode_envelope


def message(task_id: str, queue: str = "q") -> bytes:
    return encode_envelope(Envelope(task_id, "t", queue), 1 << 20)


async def wait_for(probe, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    """Await ``probe()`` until it is truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_claim_unique_answers_the_holder_of_a_taken_key(broker: Broker) -> None:
    first = await broker.claim_unique([("t:k1", "id-1", 60), ("t:k2", "id-2", 60)])
    assert first == [None, None]
    again = await broker.claim_unique([("t:k1", "id-3", 60), ("t:k3", "id-4", 60)])
    assert again == ["id-1", None]
    # the same key twice in one batch: the second sees the first
    assert await broker.claim_unique([("t:k5", "a", 60), ("t:k5", "b", 60)]) == [None, "a"]


async def test_enqueue_unique_writes_each_message_with_its_claim_once(broker: Broker) -> None:
    await broker.prepare_consumer(["q"], "c1")
    sends = [
        UniqueSend("t:a", "id-a", 60, "q", message("id-a")),
        UniqueSend("t:a", "id-b", 60, "q", message("id-b")),  # same key: a duplicate
        UniqueSend("t:c", "id-c", 60, "q", message("id-c"), delay=300),
    ]
    assert await broker.enqueue_unique(sends) == [None, "id-a", None]
    # A retry under the same ids (the first reply lost): already written, nothing again.
    assert await broker.enqueue_unique([sends[0], sends[2]]) == [None, None]
    assert await broker.claim_unique([("t:a", "x", 60), ("t:c", "x", 60)]) == ["id-a", "id-c"]
    (delivery,) = await wait_for(lambda: broker.fetch("q", 10, 0.1))
    assert delivery.payload == message("id-a")
    assert await broker.scheduled_count() == 1
    assert (await broker.scheduled_entry("id-c")) is not None
    await broker.complete([Completion("q", delivery.token, "id-a")])
    assert await broker.fetch("q", 10, 0.1) == []


async def test_unique_release_frees_a_key_only_for_its_holder(broker: Broker) -> None:
    await broker.prepare_consumer(["q"], "c1")
    assert await broker.claim_unique([("t:k", "id-1", 60)]) == [None]
    await broker.complete([Completion("q", None, "id-2", ops=(UniqueRelease("t:k", "id-2"),))])
    assert await broker.claim_unique([("t:k", "id-9", 60)]) == ["id-1"]
    await broker.publish("q", [message("id-1")])
    (delivery,) = await broker.fetch("q", 1, 0)
    await broker.complete(
        [Completion("q", delivery.token, "id-1", ops=(UniqueRelease("t:k", "id-1"),))]
    )
    assert await broker.claim_unique([("t:k", "id-9", 60)]) == [None]
    assert await broker.fetch("q", 1, 0) == []


async def test_a_unique_key_expires_after_its_ttl(broker: Broker) -> None:
    assert await broker.claim_unique([("t:k", "id-1", 0.3)]) == [None]
    assert await broker.claim_unique([("t:k", "id-2", 0.3)]) == ["id-1"]
    claimed = await wait_for(lambda: _claimed(broker, "t:k", "id-3"), timeout=30.0)
    assert claimed


async def _claimed(broker: Broker, key: str, task_id: str) -> bool:
    return (await broker.claim_unique([(key, task_id, 60)])) == [None]


async def test_a_mutex_has_one_holder_and_answers_a_wait(broker: Broker) -> None:
    assert await broker.acquire_lock("user:1", "a", 1, 30) == 0.0
    wait = await broker.acquire_lock("user:1", "b", 1, 30)
    assert 0 < wait <= 30
    assert await broker.acquire_lock("user:2", "b", 1, 30) == 0.0  # another key
    assert await broker.acquire_lock("user:1", "a", 1, 30) == 0.0  # the holder itself


async def test_a_semaphore_has_limit_holders(broker: Broker) -> None:
    answers = [await broker.acquire_lock("pool", f"h{i}", 3, 30) for i in range(5)]
    assert answers[:3] == [0.0, 0.0, 0.0]
    assert all(a > 0 for a in answers[3:])


async def test_lock_release_op_frees_a_place_with_the_ack(broker: Broker) -> None:
    await broker.prepare_consumer(["q"], "c1")
    await broker.publish("q", [message("a")])
    (delivery,) = await broker.fetch("q", 1, 0)
    assert await broker.acquire_lock("k", "a", 1, 30) == 0.0
    assert await broker.acquire_lock("k", "b", 1, 30) > 0
    await broker.complete([Completion("q", delivery.token, "a", ops=(LockRelease("k", "a"),))])
    assert await broker.acquire_lock("k", "b", 1, 30) == 0.0
    assert (await broker.queue_stats(["q"]))["q"]["in_flight"] == 0


async def test_an_expired_lease_frees_its_place(broker: Broker) -> None:
    assert await broker.acquire_lock("k", "dead", 1, 0.3) == 0.0
    wait = await broker.acquire_lock("k", "next", 1, 30)
    assert 0 < wait <= 0.3
    assert await wait_for(lambda: _acquired(broker, "k", "next"), timeout=30.0)


async def _acquired(broker: Broker, key: str, holder: str) -> bool:
    return await broker.acquire_lock(key, holder, 1, 30) == 0.0


async def test_renew_locks_renews_only_places_still_held(broker: Broker) -> None:
    assert await broker.acquire_lock("k", "a", 1, 2.0) == 0.0
    assert await broker.renew_locks([("k", "a", 30), ("k", "ghost", 30)]) == 1
    await asyncio.sleep(2.3)  # past the first lease: the renewal must have extended it
    assert await broker.acquire_lock("k", "b", 1, 30) > 1
    await broker.complete([Completion("q", None, "a", ops=(LockRelease("k", "a"),))])
    assert await broker.renew_locks([("k", "a", 30)]) == 0
    assert await broker.acquire_lock("k", "b", 1, 30) == 0.0
