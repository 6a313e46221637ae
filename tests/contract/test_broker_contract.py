"""The broker contract: every backend passes this one module unchanged.

Runs against ReliableRedisBroker and FastRedisBroker, the code behind every URL including
``memory://`` (see ``conftest.py``).
Capability-dependent tests (leases, heartbeat, recovery) skip where ``supports_recovery`` is
false, with the reason given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from blitzq.broker import Broker, Completion, DeadLetterFields, Delivery, Scheduled
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import Envelope, decode_envelope, encode_envelope

T = TypeVar("T")

Q = "contract"
CONSUMER = "consumer-1"


def message(task_id: str, queue: str = Q, *args: Any) -> bytes:
    """A well-formed encoded envelope."""
    return encode_envelope(Envelope(task_id, "tests.contract.task", queue, list(args)), 1 << 20)


def ids(deliveries: list[Delivery]) -> list[str]:
    """Task ids of deliveries, in order."""
    return [decode_envelope(d.payload).id for d in deliveries]


def dead_letter(task_id: str, failed_at: float, reason: str = "failed") -> DeadLetterFields:
    """Dead-letter fields for ``task_id``."""
    return DeadLetterFields(message(task_id), reason, "boom", "tests.contract.task", Q, failed_at)


def origin(broker: Broker) -> str:
    """The kind of queue a broker records as a dead letter's origin: "s" (a reliable-mode
    stream, and any pairing whose store writes to an outbox: RabbitMQ, the spread layout),
    "l" (a fast-mode list)."""
    kind = str(getattr(broker.state, "kind", ""))
    return "s" if kind == "o" else kind


def stored(broker: Broker, fields: DeadLetterFields) -> DeadLetterFields:
    """``fields`` as ``broker`` stores them: with the origin of the dead letter recorded."""
    return dataclasses.replace(fields, kind=origin(broker))


async def eventually(
    probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], timeout: float = 30.0
) -> T:
    """Poll ``probe`` until ``accept`` holds for its value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout} s; last value {value!r}")
        await asyncio.sleep(0.02)


async def consumer(broker: Broker, queue: str = Q) -> Broker:
    """Prepare ``broker`` to fetch from ``queue`` and return it."""
    await broker.prepare_consumer([queue], CONSUMER)
    return broker


async def fetch_all(broker: Broker, queue: str = Q, count: int = 100) -> list[Delivery]:
    """Every message waiting on ``queue`` (non-blocking fetches)."""
    out: list[Delivery] = []
    while True:
        batch = await broker.fetch(queue, count, 0)
        if not batch:
            return out
        out += batch


def needs_recovery(broker: Broker) -> None:
    """Skip unless the broker has leases, heartbeat and recovery."""
    if not broker.supports_recovery:
        pytest.skip(f"{type(broker).__name__} has no leases (at-most-once): no recovery")


def needs_fused(broker: Broker, what: str) -> None:
    """Skip unless the state store acks the transport's deliveries itself (a fused pairing);
    ``what`` says what a foreign pairing lacks (docs/architecture.md, "Adding a broker").
    A broker whose pairing fences and dead-letters recovered deliveries through the store
    itself (``pairing.fences``: the spread layout, ``broker/redis/spread.py``) runs those
    tests too."""
    if not broker.state.acks(broker.transport) and not broker.pairing.fences:
        pytest.skip(f"a state store paired with a foreign transport: {what}")


# ------------------------------------------------------------------------------ publish / fetch
async def test_publish_one_and_many_fetch_in_order(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("a")])
    await broker.publish(Q, [message(f"m{i}") for i in range(5)])
    got = await broker.fetch(Q, 100, 0)
    assert ids(got) == ["a", "m0", "m1", "m2", "m3", "m4"]
    assert all(d.queue == Q and d.deliveries == 1 for d in got)
    assert await broker.fetch(Q, 10, 0) == []


async def test_fetch_takes_at_most_count(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message(f"m{i}") for i in range(7)])
    first = await broker.fetch(Q, 3, 0)
    assert ids(first) == ["m0", "m1", "m2"]
    rest = await broker.fetch(Q, 100, 0)
    assert ids(rest) == ["m3", "m4", "m5", "m6"]


async def test_payload_bytes_round_trip_exactly(broker: Broker) -> None:
    await consumer(broker)
    raw = bytes(range(256)) * 3
    await broker.publish(Q, [raw])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.payload == raw


async def test_queues_are_separate(broker: Broker) -> None:
    await broker.prepare_consumer([Q, "other"], CONSUMER)
    await broker.publish("other", [message("x", "other")])
    assert await broker.fetch(Q, 10, 0) == []
    assert ids(await broker.fetch("other", 10, 0)) == ["x"]


async def test_blocking_fetch_times_out_empty(broker: Broker) -> None:
    await consumer(broker)
    start = time.monotonic()
    got = await broker.fetch(Q, 1, 0.3)
    elapsed = time.monotonic() - start
    assert got == []
    assert 0.2 <= elapsed < 3.0


async def test_blocking_fetch_is_woken_by_publish(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    await consumer(broker)
    producer = make_broker()
    start = time.monotonic()
    fetching = asyncio.create_task(broker.fetch(Q, 1, 10.0))
    await asyncio.sleep(0.1)  # let the fetch block first (the test holds either way)
    await producer.publish(Q, [message("late")])
    got = await asyncio.wait_for(fetching, 5.0)
    assert ids(got) == ["late"]
    assert time.monotonic() - start < 5.0


async def test_fetch_first_drains_earlier_queues_first(broker: Broker) -> None:
    levels = [f"{Q}:high", Q, f"{Q}:low"]
    await broker.prepare_consumer(levels, CONSUMER)
    await broker.publish(f"{Q}:low", [message("low1", f"{Q}:low")])
    await broker.publish(Q, [message("mid1"), message("mid2")])
    await broker.publish(f"{Q}:high", [message("high1", f"{Q}:high")])
    got = await broker.fetch_first(levels, 3, 0)
    assert ids(got) == ["high1", "mid1", "mid2"]
    assert [d.queue for d in got] == [f"{Q}:high", Q, Q]
    rest = await broker.fetch_first(levels, 10, 0)
    assert ids(rest) == ["low1"]
    assert rest[0].queue == f"{Q}:low"
    assert await broker.fetch_first(levels, 10, 0) == []


async def test_fetch_first_blocks_on_every_queue(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    levels = [f"{Q}:high", Q, f"{Q}:low"]
    await broker.prepare_consumer(levels, CONSUMER)
    start = time.monotonic()
    assert await broker.fetch_first(levels, 5, 0.3) == []
    assert time.monotonic() - start >= 0.2
    producer = make_broker()
    fetching = asyncio.create_task(broker.fetch_first(levels, 5, 10.0))
    await asyncio.sleep(0.1)
    await producer.publish(f"{Q}:low", [message("wake", f"{Q}:low")])
    got = await asyncio.wait_for(fetching, 5.0)
    assert ids(got) == ["wake"]
    assert got[0].queue == f"{Q}:low"


# ----------------------------------------------------------------------------- completions
async def test_complete_ack_removes_the_delivery(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("a"), message("b")])
    got = await broker.fetch(Q, 2, 0)
    await broker.complete(
        [Completion(Q, d.token, tid) for d, tid in zip(got, ids(got), strict=True)]
    )
    stats = await broker.queue_stats([Q])
    assert stats[Q] == {"waiting": 0, "in_flight": 0}
    assert await broker.fetch(Q, 10, 0) == []


async def test_complete_empty_batch_is_a_no_op(broker: Broker) -> None:
    await broker.complete([])


async def test_complete_with_record_stores_it_with_ttl(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("r1")])
    (d,) = await broker.fetch(Q, 1, 0)
    await broker.complete([Completion(Q, d.token, "r1", record=b"record-bytes", record_ttl=60)])
    assert await broker.get_record("r1") == b"record-bytes"
    assert (await broker.queue_stats([Q]))[Q]["in_flight"] == 0


async def test_a_completion_of_an_older_enqueue_of_an_id_stores_no_record(
    broker: Broker,
) -> None:
    # Two enqueues of the explicit id "x": the newer ("n2") owns its record from its reset on.
    await consumer(broker)
    await broker.publish(Q, [message("x"), message("x")])
    old, new = await broker.fetch(Q, 2, 0)
    await broker.reset_tasks(["x"], {"x": "n2"}, 60)
    await broker.complete([Completion(Q, old.token, "x", b"old-run", 60, nonce="n1")])
    assert await broker.get_record("x") is None  # not the older run's (its ack applies)
    await broker.complete([Completion(Q, None, "x", b"running", 60, nonce="n2")])
    assert await broker.get_record("x") == b"running"
    await broker.complete([Completion(Q, new.token, "x", b"new-run", 60, nonce="n2")])
    assert await broker.get_record("x") == b"new-run"
    await broker.complete([Completion(Q, None, "x", b"late", 60, nonce="n1")])  # ends late
    assert await broker.get_record("x") == b"new-run"
    # A generated id (no nonce) or a message without a mark writes as always.
    await broker.complete([Completion(Q, None, "x", b"unmarked", 60)])
    assert await broker.get_record("x") == b"unmarked"


async def test_record_set_get_and_expiry(broker: Broker) -> None:
    assert await broker.get_record("nope") is None
    await broker.set_record("short", b"v", 1)
    assert await broker.get_record("short") == b"v"
    await eventually(lambda: broker.get_record("short"), lambda v: v is None, timeout=30.0)


async def test_wait_for_record_times_out(broker: Broker) -> None:
    start = time.monotonic()
    assert await broker.wait_for_record("never", 0.3) is None
    assert 0.2 <= time.monotonic() - start < 3.0


async def test_wait_for_record_returns_an_existing_record(broker: Broker) -> None:
    await broker.set_record("there", b"v", 60)
    assert await broker.wait_for_record("there", 0) == b"v"
    assert await broker.wait_for_record("there", 5) == b"v"


async def test_wait_for_record_is_woken_by_set_record(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    writer = make_broker()
    waiting = asyncio.create_task(broker.wait_for_record("w1", 10.0))
    await asyncio.sleep(0.1)
    await writer.set_record("w1", b"done", 60)
    # The record arrives (by its push, or the 1 s re-read on a loaded machine: no timing is
    # asserted here; tests/integration/test_result_pattern.py awaits a push with no record).
    assert await asyncio.wait_for(waiting, 5.0) == b"done"


async def test_wait_for_record_is_woken_by_a_completion(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    worker = await consumer(make_broker())
    await worker.publish(Q, [message("w2")])
    (d,) = await worker.fetch(Q, 1, 0)
    waiting = asyncio.create_task(broker.wait_for_record("w2", 10.0))
    await asyncio.sleep(0.1)
    await worker.complete([Completion(Q, d.token, "w2", record=b"ok", record_ttl=60)])
    # The record arrives (by its push, or the 1 s re-read on a loaded machine: no timing is
    # asserted here; tests/integration/test_result_pattern.py awaits a push with no record).
    assert await asyncio.wait_for(waiting, 5.0) == b"ok"


async def test_reschedule_then_promote_when_due(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("s1"), message("s2")])
    d1, d2 = await broker.fetch(Q, 2, 0)
    # The delay is counted on the broker's clock from when the completion is applied.
    await broker.complete(
        [Completion(Q, d1.token, "s1", reschedule=message("s1", Q, 2), delay=100.0)]
    )
    assert await broker.scheduled_count() == 1
    stats = await broker.queue_stats([Q])
    assert stats[Q] == {"waiting": 0, "in_flight": 1 if broker.supports_recovery else 0}
    # Not due yet: nothing moves, and the next due time is reported on the broker's clock.
    moved, next_eta, now = await broker.promote_due(100)
    assert moved == 0
    assert next_eta is not None
    assert 99.0 < next_eta - now <= 100.0
    assert await broker.fetch(Q, 10, 0) == []
    # A short delay: moved to its queue once due by the broker's clock, not before.
    await broker.complete(
        [Completion(Q, d2.token, "s2", reschedule=message("s2", Q, 3), delay=0.3)]
    )
    moved, next_eta, now = await broker.promote_due(100)
    assert moved == 0
    assert next_eta is not None
    assert 0 < next_eta - now <= 0.3
    due = next_eta
    deadline = time.monotonic() + 10
    while moved == 0:
        assert time.monotonic() < deadline, "the rescheduled message was never promoted"
        await asyncio.sleep(0.02)
        moved, next_eta, now = await broker.promote_due(100)
    assert moved == 1
    assert now >= due
    assert next_eta is not None
    assert next_eta - now > 90
    got = await broker.fetch(Q, 10, 0)
    assert ids(got) == ["s2"]
    assert decode_envelope(got[0].payload).args == [3]
    assert await broker.scheduled_count() == 1


async def test_schedule_and_promote_respect_due_order_and_limit(broker: Broker) -> None:
    await consumer(broker)
    await broker.schedule(
        [
            Scheduled("late", Q, message("late"), delay=30.0),
            Scheduled("first", Q, message("first"), eta=1_000_000_001.0),  # long past
            Scheduled("second", Q, message("second"), eta=1_000_000_002.0),
        ]
    )
    assert await broker.scheduled_count() == 3
    moved, next_eta, _ = await broker.promote_due(1)
    assert moved == 1
    assert next_eta == pytest.approx(1_000_000_002.0, abs=0.01)
    moved, next_eta, now = await broker.promote_due(100)
    assert moved == 1
    assert next_eta is not None
    assert 29.0 < next_eta - now <= 30.0
    assert ids(await broker.fetch(Q, 10, 0)) == ["first", "second"]
    assert await broker.scheduled_count() == 1


async def test_scheduled_for_counts_and_purges_one_queues_delayed_tasks(broker: Broker) -> None:
    """``scheduled_for(queues)`` counts the schedule's messages bound for those physical
    queues; with ``purge`` it takes them off, leaving other queues' (a name that is a prefix of
    another, ``Q`` of ``Q:high``, matches only itself)."""
    await broker.schedule(
        [
            Scheduled("a1", Q, message("a1"), delay=300.0),
            Scheduled("a2", Q, message("a2"), delay=300.0),
            Scheduled("h1", f"{Q}:high", message("h1"), delay=300.0),
            Scheduled("o1", f"{Q}x", message("o1"), delay=300.0),
        ]
    )
    assert await broker.scheduled_for([Q]) == 2
    assert await broker.scheduled_for([Q, f"{Q}:high"]) == 3
    assert await broker.scheduled_for(["nobody"]) == 0
    assert await broker.scheduled_for([Q], purge=True) == 2
    assert await broker.scheduled_count() == 2
    assert await broker.scheduled_for([Q]) == 0
    assert await broker.scheduled_entry("h1") is not None
    assert await broker.scheduled_entry("o1") is not None


async def test_promote_ahead_moves_what_is_due_within_that_many_seconds(broker: Broker) -> None:
    """``promote_due(limit, ahead)`` (the eager test mode's virtual time) also moves what is
    due within ``ahead`` seconds of the broker's clock; what is due later stays, and the
    clock reported is the broker's own."""
    await consumer(broker)
    await broker.schedule(
        [
            Scheduled("soon", Q, message("soon"), delay=30.0),
            Scheduled("later", Q, message("later"), delay=500.0),
        ]
    )
    assert (await broker.promote_due(100))[0] == 0
    moved, next_eta, now = await broker.promote_due(100, 60.0)
    assert moved == 1
    assert next_eta is not None
    assert 400.0 < next_eta - now <= 500.0  # ``now`` is not moved ahead
    assert ids(await broker.fetch(Q, 10, 0)) == ["soon"]
    assert await broker.scheduled_count() == 1


async def test_schedule_is_keyed_by_task_id(broker: Broker) -> None:
    await broker.schedule([Scheduled("same", Q, message("same", Q, 1), delay=50.0)])
    await broker.schedule([Scheduled("same", Q, message("same", Q, 2), eta=1_000_000_000.0)])
    assert await broker.scheduled_count() == 1
    await consumer(broker)
    assert (await broker.promote_due(10))[0] == 1
    (d,) = await broker.fetch(Q, 10, 0)
    assert decode_envelope(d.payload).args == [2]


async def test_complete_dead_letter_with_record(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("d1")])
    (d,) = await broker.fetch(Q, 1, 0)
    fields = DeadLetterFields(d.payload, "failed", "ValueError: boom", "tests.t", Q, time.time())
    await broker.complete(
        [Completion(Q, d.token, "d1", record=b"rec", record_ttl=60, dead_letter=fields)]
    )
    assert await broker.get_dead_letter("d1") == stored(broker, fields)
    assert await broker.dead_letter_count() == 1
    assert await broker.get_record("d1") == b"rec"
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}
    assert await broker.get_dead_letter("other") is None


async def test_dead_letters_listed_newest_first_with_paging(broker: Broker) -> None:
    base = time.time()
    await broker.complete(
        [Completion(Q, None, f"d{i}", dead_letter=dead_letter(f"d{i}", base + i)) for i in range(5)]
    )
    assert await broker.dead_letter_count() == 5
    listed = await broker.dead_letters(0, 10)
    assert [tid for tid, _ in listed] == ["d4", "d3", "d2", "d1", "d0"]
    assert listed[0][1] == stored(broker, dead_letter("d4", base + 4))
    page = await broker.dead_letters(1, 2)
    assert [tid for tid, _ in page] == ["d3", "d2"]
    assert await broker.dead_letters(10, 5) == []


async def test_dead_letters_are_capped_dropping_the_oldest(broker: Broker) -> None:
    broker.dead_letter_limits.cap = 3  # type: ignore[union-attr]
    base = time.time()
    for i in range(5):
        await broker.complete(
            [Completion(Q, None, f"c{i}", dead_letter=dead_letter(f"c{i}", base + i))]
        )
    assert await broker.dead_letter_count() == 3
    assert [tid for tid, _ in await broker.dead_letters(0, 10)] == ["c4", "c3", "c2"]
    assert await broker.get_dead_letter("c0") is None
    assert await broker.get_dead_letter("c1") is None


async def test_complete_requeue_puts_the_message_back(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message("rq")])
    (d,) = await broker.fetch(Q, 1, 0)
    await broker.complete([Completion(Q, d.token, "rq", requeue=d.payload)])
    got = await broker.fetch(Q, 10, 0)
    assert ids(got) == ["rq"]
    assert got[0].payload == d.payload
    assert (await broker.queue_stats([Q]))[Q]["in_flight"] == (1 if broker.supports_recovery else 0)


async def test_complete_batch_applies_every_completion(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message(f"b{i}") for i in range(4)])
    d0, d1, d2, d3 = await broker.fetch(Q, 4, 0)
    await broker.complete(
        [
            Completion(Q, d0.token, "b0"),
            Completion(Q, d1.token, "b1", record=b"r1", record_ttl=60),
            Completion(Q, d2.token, "b2", reschedule=message("b2"), delay=60.0),
            Completion(Q, d3.token, "b3", dead_letter=dead_letter("b3", time.time())),
        ]
    )
    assert await broker.get_record("b1") == b"r1"
    assert await broker.scheduled_count() == 1
    assert await broker.dead_letter_count() == 1
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}


# ------------------------------------------------------------------------------ replay / purge
async def test_replay_dead_letter_is_atomic_and_publishes_once(broker: Broker) -> None:
    await consumer(broker)
    await broker.complete(
        [Completion(Q, None, "x", record=b"old", record_ttl=60, dead_letter=dead_letter("x", 1.0))]
    )
    replayed = message("x", Q, "again")
    assert await broker.replay_dead_letter("x", Q, replayed) is True
    assert await broker.replay_dead_letter("x", Q, replayed) is False
    assert await broker.get_dead_letter("x") is None
    assert await broker.dead_letter_count() == 0
    # The stale final record is gone, so a waiter does not read the old outcome.
    assert await broker.get_record("x") is None
    got = await fetch_all(broker)
    assert [d.payload for d in got] == [replayed]


async def test_concurrent_replays_publish_once(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    await consumer(broker)
    await broker.complete([Completion(Q, None, "y", dead_letter=dead_letter("y", 1.0))])
    others = [make_broker() for _ in range(4)]
    results = await asyncio.gather(
        *(b.replay_dead_letter("y", Q, message("y")) for b in [broker, *others])
    )
    assert sorted(results) == [False, False, False, False, True]
    assert ids(await fetch_all(broker)) == ["y"]


async def test_replay_takes_only_the_dead_letter_that_was_read(broker: Broker) -> None:
    """Two operators list the same dead letter; one replays it, the task fails again and is
    dead-lettered anew under its id: the other's replay of what it listed finds it gone and
    leaves the new dead letter alone (compare-and-delete on the failure time)."""
    await consumer(broker)
    first, second = 1_764_583_097.123456, 1_764_583_101.654321  # Unix seconds, as stamped
    await broker.complete([Completion(Q, None, "z", dead_letter=dead_letter("z", first))])
    listed = await broker.get_dead_letter("z")
    assert listed is not None
    assert listed.failed_at == first
    assert await broker.replay_dead_letter("z", Q, message("z"), failed_at=first) is True
    assert ids(await fetch_all(broker)) == ["z"]
    await broker.complete([Completion(Q, None, "z", dead_letter=dead_letter("z", second))])
    assert await broker.replay_dead_letter("z", Q, message("z"), failed_at=first) is False
    assert await broker.fetch(Q, 10, 0) == []
    kept = await broker.get_dead_letter("z")
    assert kept is not None
    assert kept.failed_at == second
    assert await broker.replay_dead_letter("z", Q, message("z"), failed_at=second) is True
    assert ids(await fetch_all(broker)) == ["z"]


async def test_replay_of_missing_dead_letter_publishes_nothing(broker: Broker) -> None:
    await consumer(broker)
    assert await broker.replay_dead_letter("ghost", Q, message("ghost")) is False
    assert await broker.fetch(Q, 10, 0) == []


async def test_replay_claims_the_unique_key_or_keeps_the_dead_letter(broker: Broker) -> None:
    await consumer(broker)
    await broker.complete([Completion(Q, None, "u1", dead_letter=dead_letter("u1", 1.0))])
    # Another task holds the key: nothing changes, the holder is named.
    assert await broker.claim_unique([("task:k", "other", 60)]) == [None]
    outcome = await broker.replay_dead_letter("u1", Q, message("u1"), unique=("task:k", 60))
    assert outcome == "other"
    assert await broker.get_dead_letter("u1") is not None
    assert await broker.fetch(Q, 10, 0) == []
    # A free key is claimed for the replayed task in the same step.
    assert await broker.replay_dead_letter("u1", Q, message("u1"), unique=("task:k2", 60))
    assert await broker.get_dead_letter("u1") is None
    assert await broker.claim_unique([("task:k2", "dup", 60)]) == ["u1"]
    assert ids(await fetch_all(broker)) == ["u1"]


async def test_replay_over_a_key_the_task_itself_holds(broker: Broker) -> None:
    await consumer(broker)
    assert await broker.claim_unique([("task:k", "u2", 60)]) == [None]  # never released
    await broker.complete([Completion(Q, None, "u2", dead_letter=dead_letter("u2", 1.0))])
    assert await broker.replay_dead_letter("u2", Q, message("u2"), unique=("task:k", 60)) is True
    assert await broker.claim_unique([("task:k", "dup", 60)]) == ["u2"]
    assert ids(await fetch_all(broker)) == ["u2"]


async def test_purge_dead_letters(broker: Broker) -> None:
    assert await broker.purge_dead_letters() == 0
    await broker.complete(
        [Completion(Q, None, f"p{i}", dead_letter=dead_letter(f"p{i}", float(i))) for i in range(3)]
    )
    assert await broker.purge_dead_letters() == 3
    assert await broker.dead_letter_count() == 0
    assert await broker.dead_letters(0, 10) == []
    assert await broker.get_dead_letter("p1") is None


# --------------------------------------------------------------------------------- inspection
async def counts_reach(
    broker: Broker, queues: list[str], expected: dict[str, dict[str, int]]
) -> None:
    """Assert ``queue_stats(queues) == expected``: at once on Redis, whose counts are exact;
    on RabbitMQ once the messages in transit to this process's consumer have arrived. Its
    ``waiting`` is the ready count plus the consumer's buffer, an estimate while RabbitMQ
    pushes (a message dispatched as the count is read, e.g. after an ack freed a prefetch
    place, is counted twice or not at all: a run in four under load), exact when idle
    (:func:`blitzq.broker.amqp.inspection.queue_stats`)."""
    if custody_of(broker) is None:
        assert await broker.queue_stats(queues) == expected
    else:
        await eventually(lambda: broker.queue_stats(queues), lambda got: got == expected)


async def test_queue_stats_waiting_and_in_flight(broker: Broker) -> None:
    await consumer(broker)
    await counts_reach(broker, [Q], {Q: {"waiting": 0, "in_flight": 0}})
    await broker.publish(Q, [message(f"q{i}") for i in range(3)])
    await counts_reach(broker, [Q], {Q: {"waiting": 3, "in_flight": 0}})
    (d,) = await broker.fetch(Q, 1, 0)
    leased = 1 if broker.supports_recovery else 0
    await counts_reach(broker, [Q], {Q: {"waiting": 2, "in_flight": leased}})
    await broker.complete([Completion(Q, d.token, "q0")])
    await counts_reach(
        broker,
        [Q, "never-used"],
        {Q: {"waiting": 2, "in_flight": 0}, "never-used": {"waiting": 0, "in_flight": 0}},
    )


async def test_known_queues(broker: Broker) -> None:
    await broker.prepare_consumer(["alpha", "beta"], CONSUMER)
    await broker.prepare_consumer(["beta", "gamma"], CONSUMER)
    known = await broker.known_queues()
    assert {"alpha", "beta", "gamma"} <= set(known)
    assert len(known) == len(set(known))


async def test_worker_registration_and_expiry(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    other = make_broker()
    await other.workers()  # connected before the short registration's clock starts
    await broker.register_worker("w-long", b"info-long", 60)
    # 3 s: long enough for the first read on a loaded machine (a new cluster client connects
    # first), short enough for the wait on its expiry below.
    await broker.register_worker("w-short", b"info-short", 3)
    workers = await other.workers()
    assert workers == {"w-long": b"info-long", "w-short": b"info-short"}
    await eventually(other.workers, lambda w: "w-short" not in w)
    assert await other.workers() == {"w-long": b"info-long"}
    # Registering again refreshes the info.
    await broker.register_worker("w-long", b"info-2", 60)
    assert (await other.workers())["w-long"] == b"info-2"
    await broker.unregister_worker("w-long")
    await broker.unregister_worker("never-registered")
    assert await other.workers() == {}


async def test_a_lapsed_registration_is_taken_by_one_caller_only(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    others = [make_broker() for _ in range(4)]
    await broker.register_worker("w-live", b"info-live", 60)
    await broker.register_worker("w-gone", b"info-gone", 0.2)
    await eventually(others[0].workers, lambda w: "w-gone" not in w)
    # Lapsed but not yet taken: left out of workers(), taken once by lapsed_workers().
    taken = await asyncio.gather(*(o.lapsed_workers() for o in others))
    assert [t for t in taken if t] == [{"w-gone": b"info-gone"}]
    assert await broker.lapsed_workers() == {}
    assert await broker.workers() == {"w-live": b"info-live"}
    await broker.unregister_worker("w-live")  # a clean stop never lapses
    assert await broker.lapsed_workers() == {}


async def test_registrations_add_each_workers_counts_to_the_namespace_once(
    broker: Broker,
) -> None:
    """Each registration adds what the worker's (succeeded, failed) counts grew by since
    the counts already added for it; a write sent again or overtaken by a newer one adds
    nothing, and the unregistration adds the rest: the namespace's counters hold every run
    once, so a reader's rate is their difference between two reads."""

    async def totals() -> tuple[int, int]:
        counters = await broker.counters()
        return counters.get("processed", 0), counters.get("failed", 0)

    assert await totals() == (0, 0)
    await broker.register_worker("w1", b"i", 60, (5, 1))
    await broker.register_worker("w1", b"i", 60, (5, 1))  # sent again: nothing more
    assert await totals() == (5, 1)
    await broker.register_worker("w1", b"i", 60, (3, 0), (3, 0))  # an older write, late
    await broker.register_worker("w2", b"i", 60, (2, 0))
    await broker.register_worker("w1", b"i", 60, (9, 2), (5, 1))
    assert await totals() == (11, 2)
    await broker.unregister_worker("w1", (12, 3))
    await broker.unregister_worker("w1", (12, 3))  # sent again: nothing more
    await broker.unregister_worker("never-registered", (7, 7))
    assert await totals() == (14, 3)
    assert set(await broker.workers()) == {"w2"}
    # A registration that lapsed and was taken out: the worker's next one adds what grew
    # since the last one it saw written (its base).
    await broker.register_worker("w3", b"i", 0.2, (4, 0))
    await eventually(broker.lapsed_workers, lambda taken: "w3" in taken)
    await broker.register_worker("w3", b"i", 60, (6, 1), (4, 0))
    assert await totals() == (20, 4)
    await broker.unregister_worker("w3", (6, 1))
    await broker.unregister_worker("w2", (2, 0))
    assert await totals() == (20, 4)


async def test_purge_queue_drops_waiting_keeps_in_flight(broker: Broker) -> None:
    await consumer(broker)
    assert await broker.purge_queue(Q) == 0
    await broker.publish(Q, [message(f"g{i}") for i in range(4)])
    (d,) = await broker.fetch(Q, 1, 0)
    assert await broker.purge_queue(Q) == 3
    assert await broker.fetch(Q, 10, 0) == []
    assert (await broker.queue_stats([Q]))[Q]["waiting"] == 0
    # The delivery in flight is still completable and the queue keeps working.
    await broker.complete([Completion(Q, d.token, "g0", record=b"r", record_ttl=60)])
    assert await broker.get_record("g0") == b"r"
    await broker.publish(Q, [message("after")])
    assert ids(await broker.fetch(Q, 10, 0)) == ["after"]


async def test_purge_before_any_consumer(broker: Broker) -> None:
    await broker.publish(Q, [message("n1"), message("n2")])
    assert await broker.purge_queue(Q) == 2
    await consumer(broker)
    assert await broker.fetch(Q, 10, 0) == []


async def test_ping(broker: Broker) -> None:
    await broker.ping()


# ------------------------------------------------------------------------------ recovery
async def test_heartbeat_keeps_a_lease_past_min_idle(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    await broker.publish(Q, [message("hb")])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.token is not None
    min_idle = 1.0  # a stall between a heartbeat and the next recover must not lapse it
    deadline = time.monotonic() + 3 * min_idle
    while time.monotonic() < deadline:
        assert await broker.heartbeat(Q, [d.token]) == 1
        assert await broker.recover(Q, min_idle, 10, 5) == (0, 0)
        await asyncio.sleep(min_idle / 4)
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 1}
    # Without heartbeats the lease lapses and the message is recovered.
    await eventually(lambda: broker.recover(Q, min_idle, 10, 5), lambda r: r == (1, 0))


async def test_heartbeat_of_unknown_tokens_renews_nothing(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    assert await broker.heartbeat(Q, []) == 0
    await broker.publish(Q, [message("k")])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.token is not None
    await broker.complete([Completion(Q, d.token, "k")])
    assert await broker.heartbeat(Q, [d.token]) == 0


async def test_recover_requeues_an_idle_delivery(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    await broker.publish(Q, [message("idle"), message("busy")])
    idle, busy = await broker.fetch(Q, 2, 0)
    assert idle.token is not None
    assert busy.token is not None
    await asyncio.sleep(0.25)
    await broker.heartbeat(Q, [busy.token])
    assert await broker.recover(Q, 0.15, 10, 5) == (1, 0)
    (again,) = await broker.fetch(Q, 10, 0)
    assert decode_envelope(again.payload).id == "idle"
    assert again.payload == idle.payload
    assert again.deliveries == 2
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 2}
    # Each further recovery counts one more delivery.
    await asyncio.sleep(0.25)
    await broker.heartbeat(Q, [busy.token])
    assert await broker.recover(Q, 0.15, 10, 5) == (1, 0)
    (third,) = await broker.fetch(Q, 10, 0)
    assert third.deliveries == 3


async def test_a_requeued_delivery_keeps_its_delivery_count(broker: Broker) -> None:
    """A recovered message handed back unstarted (no free slot) or put back at shutdown is
    the same delivery of its history: its count goes on towards max_deliveries (on the
    spread layout too: the requeue is written in the queue's slot, not through the outbox)."""
    needs_recovery(broker)
    needs_fused(broker, "the transport counts its own redeliveries")
    await consumer(broker)
    await broker.publish(Q, [message("again")])
    (first,) = await broker.fetch(Q, 1, 0)
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 5) == (1, 0)
    (recovered,) = await broker.fetch(Q, 1, 0)
    assert recovered.deliveries == 2
    await broker.complete([Completion(Q, recovered.token, "again", requeue=recovered.payload)])
    (handed_back,) = await broker.fetch(Q, 1, 0)
    assert handed_back.payload == first.payload
    assert handed_back.deliveries == 2
    await broker.complete([Completion(Q, handed_back.token, "again", requeue=first.payload)])
    (fresh,) = await broker.fetch(Q, 1, 0)  # a first delivery stays a first delivery
    await broker.publish(Q, [message("new")])
    (new,) = await broker.fetch(Q, 1, 0)
    await broker.complete([Completion(Q, new.token, "new", requeue=new.payload)])
    (new_again,) = await broker.fetch(Q, 1, 0)
    assert (fresh.deliveries, new_again.deliveries) == (2, 1)


@pytest.mark.parametrize(
    "args",
    # A bytes argument travels as a MessagePack bin, which the server's cmsgpack refuses: the
    # message was filed under its stream entry id, not its task id.
    [(), (b"\x00\xff raw",)],
    ids=["no arguments", "bytes argument"],
)
async def test_recover_dead_letters_at_max_deliveries(
    broker: Broker, args: tuple[Any, ...]
) -> None:
    needs_recovery(broker)
    needs_fused(broker, "the transport's recovery dead-letters in its own storage")
    await consumer(broker)
    await broker.publish(Q, [message("poison", Q, *args)])
    (d,) = await broker.fetch(Q, 1, 0)
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 2) == (1, 0)
    (d2,) = await broker.fetch(Q, 1, 0)
    assert d2.deliveries == 2
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 2, record_ttl=60) == (0, 1)
    fields = await broker.get_dead_letter("poison")
    assert fields is not None
    assert fields.reason == "max deliveries exceeded"
    assert fields.message == d.payload
    assert fields.task == "tests.contract.task"
    assert fields.queue == Q
    assert fields.kind == origin(broker)
    raw = await broker.get_record("poison")
    assert raw is not None
    record = TaskRecord.from_bytes(raw)
    assert record.state is TaskState.DEAD_LETTERED
    assert record.attempts == 2
    assert record.error_type == "MaxDeliveriesExceeded"
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}
    assert await broker.fetch(Q, 10, 0) == []


def custody_of(broker: Broker) -> Any:
    """The transport's custody of long-held deliveries (RabbitMQ's), or ``None``."""
    return getattr(broker.transport, "custody", None)


async def test_recovered_lease_is_never_taken_back(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_recovery(broker)
    if custody_of(broker) is not None:
        pytest.skip(
            "RabbitMQ gives an unacked delivery to another consumer only once its holder's "
            "channel closes: another process cannot recover it while the holder lives "
            "(test_recovered_custody_lease_is_never_taken_back is this promise there)"
        )
    await consumer(broker)
    rescuer = make_broker()
    await rescuer.prepare_consumer([Q], "consumer-2")
    await broker.publish(Q, [message("stolen")])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.token is not None
    await asyncio.sleep(0.15)
    assert await rescuer.recover(Q, 0.1, 10, 5) == (1, 0)
    # The original holder's renewal must not claim the message back.
    assert await broker.heartbeat(Q, [d.token]) == 0
    (again,) = await rescuer.fetch(Q, 1, 0)
    assert again.deliveries == 2
    assert again.token is not None
    assert await rescuer.heartbeat(Q, [again.token]) == 1


async def test_recovered_custody_lease_is_never_taken_back(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    """On RabbitMQ a delivery is another process's to recover only once its holder handed it
    to the state store's custody (held past the visibility timeout, the task still running,
    docs/guarantees.md) and stopped renewing that lease: then any process publishes it again,
    and the holder's late renewal does not claim it back."""
    needs_recovery(broker)
    if custody_of(broker) is None:
        pytest.skip("no custody: the transport's own leases are recovered (the test above)")
    await consumer(broker)
    rescuer = make_broker()
    await rescuer.prepare_consumer([Q], "consumer-2")
    await broker.publish(Q, [message("stolen")])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.token is not None
    token = d.token
    held = broker.transport.held  # type: ignore[attr-defined]

    async def handed_over() -> str:
        # Renewed (still running), then held past 0.1 s: the round hands it to custody.
        await broker.heartbeat(Q, [token])
        await asyncio.sleep(0.12)
        await broker.heartbeat(Q, [token])
        await broker.recover(Q, 0.1, 10, 5)
        return str(held[token].state)

    await eventually(handed_over, lambda state: state == "custody", 30)
    # The holder stops renewing: once the 0.1 s lease lapses, the rescuer publishes it again.
    await eventually(lambda: rescuer.recover(Q, 0.1, 10, 5), lambda n: n == (1, 0), 30)
    assert await broker.heartbeat(Q, [token]) == 0  # the late renewal does not take it back

    async def fetched() -> list[tuple[Broker, Delivery]]:
        # RabbitMQ pushes it to either consumer.
        return [(b, x) for b in (rescuer, broker) for x in await b.fetch(Q, 1, 0)]

    ((taker, again),) = await eventually(fetched, bool, 30)
    assert again.deliveries == 2
    assert again.token is not None
    assert await taker.heartbeat(Q, [again.token]) == 1


async def test_recover_with_nothing_idle(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    assert await broker.recover(Q, 0.05, 10, 5) == (0, 0)
    await broker.publish(Q, [message("fresh")])
    await broker.fetch(Q, 1, 0)
    assert await broker.recover(Q, 30.0, 10, 5) == (0, 0)
