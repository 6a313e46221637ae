"""Fencing: a completion from a consumer that lost its delivery's lease writes nothing.

A worker paused past its visibility timeout (SIGSTOP, a long GC, a cut network) comes back
after another consumer recovered its message and finished it. Its late completion must not
overwrite the record, dead-letter a succeeded task, retry, requeue, free unique keys or lock
places, store progress or advance a workflow: ``complete()`` checks ownership in the same
atomic step, returns the stale completions and counts them in ``counters()``.

Every test runs on reliable Redis (the test server and the ephemeral Valkey); fast mode (lists,
at-most-once) has no leases and so nothing to fence (its tests only check that completions still
apply). A state store paired with a foreign transport cannot see that transport's leases and
fences nothing (at-least-once, unfenced: docs/architecture.md, "Adding a broker"), so the
fencing tests skip there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from blitzq.broker import Broker, Completion, DeadLetterFields, Delivery
from blitzq.broker.effects import LockRelease, Progress, Publish, UniqueRelease
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import dumps
from tests.broker_kinds import is_reliable_redis, is_spread

from .test_broker_contract import CONSUMER, Q, consumer, message, needs_fused, needs_recovery


def record(task_id: str, state: str, worker: str, result: object = None) -> bytes:
    """An encoded task record."""
    return dumps({"id": task_id, "task": "t", "queue": Q, "state": state, "worker": worker,
                  "result": result})  # fmt: skip


async def lose_lease(broker: Broker, rescuer: Broker, task_id: str) -> tuple[Delivery, Delivery]:
    """``broker`` fetches ``task_id``; its lease lapses and ``rescuer`` recovers and fetches it.

    Returns:
        (the stale delivery of ``broker``, the redelivery now held by ``rescuer``).
    """
    await consumer(broker)
    await rescuer.prepare_consumer([Q], "consumer-2")
    await broker.publish(Q, [message(task_id)])
    (old,) = await broker.fetch(Q, 1, 0)
    assert old.token is not None
    await asyncio.sleep(0.15)
    assert await rescuer.recover(Q, 0.1, 10, 5) == (1, 0)
    (new,) = await rescuer.fetch(Q, 1, 0)
    assert new.deliveries == 2
    return old, new


def stream_key(broker: Broker) -> str:
    """The key of queue ``Q``'s stream (on the spread layout, under the queue's own tag)."""
    if is_spread(broker):
        return broker.transport.keys.stream(Q)  # type: ignore[attr-defined]
    return broker.state.keys.stream(Q)


def needs_fencing(broker: Broker) -> None:
    """Skip unless the broker has leases and its store fences on them (a fused pairing)."""
    needs_recovery(broker)
    needs_fused(broker, "it cannot see the transport's leases, so it fences nothing")


async def stale_count(broker: Broker) -> int:
    """The namespace's ``stale_completions`` counter."""
    return (await broker.counters()).get("stale_completions", 0)


async def test_late_success_does_not_overwrite_the_recovered_run(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "t1")
    theirs = Completion(Q, new.token, "t1", record("t1", "succeeded", "w2", 2), 60)
    assert await rescuer.complete([theirs]) == []
    mine = Completion(Q, old.token, "t1", record("t1", "succeeded", "w1", 1), 60)
    assert await broker.complete([mine]) == [mine]
    raw = await broker.get_record("t1")
    assert raw is not None
    stored = TaskRecord.from_bytes(raw)
    assert (stored.state, stored.worker, stored.result) == (TaskState.SUCCEEDED, "w2", 2)
    assert await stale_count(broker) == 1


async def test_late_failure_writes_no_record_dead_letter_retry_or_ops(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "t2")
    assert await broker.claim_unique([("u-key", "t2", 60)]) == [None]
    assert await broker.acquire_lock("lk", "t2@new", 1, 60) == 0.0
    assert (
        await rescuer.complete(
            [Completion(Q, new.token, "t2", record("t2", "succeeded", "w2"), 60)]
        )
        == []
    )
    dead = DeadLetterFields(old.payload, "failed", "boom", "t", Q, 1.0)
    late = [
        Completion(Q, old.token, "t2", record("t2", "dead_lettered", "w1"), 60, dead_letter=dead),
        Completion(Q, old.token, "t2", None, 0, reschedule=message("t2"), delay=1.0),
        Completion(Q, old.token, "t2", requeue=old.payload),
        Completion(
            Q, old.token, "t2",
            ops=(
                UniqueRelease("u-key", "t2"),
                LockRelease("lk", "t2@new"),
                Progress("t2", 5.0, b"late", 60),
                Publish("side", message("side", "side")),
            ),
        ),
    ]  # fmt: skip
    stale = await broker.complete(late)
    assert len(stale) == len(late)
    assert all(any(s is c for s in stale) for c in late)
    raw = await broker.get_record("t2")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED
    assert await broker.get_dead_letter("t2") is None
    assert await broker.dead_letter_count() == 0
    assert await broker.scheduled_count() == 0
    assert await broker.claim_unique([("u-key", "other", 60)]) == ["t2"]  # still held
    assert await broker.acquire_lock("lk", "someone", 1, 60) > 0  # place still held
    assert await broker.get_progress("t2") is None
    await broker.prepare_consumer(["side"], CONSUMER)
    assert await broker.fetch("side", 10, 0) == []
    assert await broker.fetch(Q, 10, 0) == []  # nothing requeued
    assert await stale_count(broker) == len(late)


async def test_a_stale_ack_leaves_the_redelivery_in_flight(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "t3")
    bare = Completion(Q, old.token, "t3")
    assert await broker.complete([bare]) == [bare]
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 1}
    assert new.token is not None
    assert await rescuer.heartbeat(Q, [new.token]) == 1
    assert await stale_count(broker) == 1


async def test_a_mixed_batch_applies_only_what_is_still_owned(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, _ = await lose_lease(broker, rescuer, "lost")
    await broker.publish(Q, [message("kept"), message("kept-bare")])
    kept, kept_bare = await broker.fetch(Q, 2, 0)
    ok = Completion(Q, kept.token, "kept", record("kept", "succeeded", "w1"), 60)
    ok_bare = Completion(Q, kept_bare.token, "kept-bare")
    late = Completion(Q, old.token, "lost", record("lost", "failed", "w1"), 60)
    late_bare = Completion(Q, old.token, "lost")
    stale = await broker.complete([ok, late, ok_bare, late_bare])
    assert sorted(id(c) for c in stale) == sorted([id(late), id(late_bare)])
    assert await broker.get_record("kept") is not None
    assert await broker.get_record("lost") is None
    # The kept deliveries were acknowledged; the redelivery of "lost" is still in flight.
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 1}
    assert await stale_count(broker) == 2


async def test_a_stale_record_among_owned_ones_writes_only_the_owned_records(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    """Completions that only ack and store a record go to the broker together (one ack for
    the batch); a stale one between owned ones must still write nothing, and only it."""
    needs_fencing(broker)
    rescuer = make_broker()
    old, _ = await lose_lease(broker, rescuer, "lost")
    await broker.publish(Q, [message(f"kept-{i}") for i in range(3)])
    kept = await broker.fetch(Q, 3, 0)
    owned = [
        Completion(Q, d.token, f"kept-{i}", record(f"kept-{i}", "succeeded", "w1", i), 60)
        for i, d in enumerate(kept)
    ]
    late = Completion(Q, old.token, "lost", record("lost", "succeeded", "w1"), 60)
    stale = await broker.complete([owned[0], late, owned[1], owned[2]])
    assert stale == [late]
    for i in range(3):
        raw = await broker.get_record(f"kept-{i}")
        assert raw is not None
        assert TaskRecord.from_bytes(raw).result == i
    assert await broker.get_record("lost") is None
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 1}


async def test_a_batch_writes_one_task_s_records_in_order(broker: Broker) -> None:
    """A task's ``running`` record and its retry in one batch: the later record stays (the
    plain record completions travel grouped, but in their place in the batch)."""
    await consumer(broker)
    running = Completion(Q, None, "ordered", record("ordered", "running", "w1"), 60)
    retry = Completion(
        Q, None, "ordered", record("ordered", "retrying", "w1"), 60,
        reschedule=message("ordered"), delay=60.0,
    )  # fmt: skip
    assert await broker.complete([running, retry]) == []
    raw = await broker.get_record("ordered")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.RETRYING


async def test_a_second_completion_of_one_delivery_in_the_same_batch_is_stale(
    broker: Broker,
) -> None:
    """Where the store acks in the completion script itself (a fused Redis pairing), the
    second completion of one delivery in a batch finds it acked and writes nothing."""
    needs_fencing(broker)
    if not is_reliable_redis(broker):
        pytest.skip("only where the completion script acks the stream entry itself")
    await consumer(broker)
    await broker.publish(Q, [message("dup")])
    (d,) = await broker.fetch(Q, 1, 0)
    first = Completion(Q, d.token, "dup", record("dup", "succeeded", "w1", 1), 60)
    again = Completion(Q, d.token, "dup", record("dup", "failed", "w1"), 60)
    # The stale ones are told by (queue, token), which both share: only the count is exact.
    assert again in await broker.complete([first, again])
    assert await stale_count(broker) == 1
    raw = await broker.get_record("dup")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED


async def test_a_completion_of_an_already_completed_delivery_is_stale(broker: Broker) -> None:
    needs_fencing(broker)
    await consumer(broker)
    await broker.publish(Q, [message("twice")])
    (d,) = await broker.fetch(Q, 1, 0)
    first = Completion(Q, d.token, "twice", record("twice", "succeeded", "w1", 1), 60)
    assert await broker.complete([first]) == []
    again = Completion(Q, d.token, "twice", record("twice", "failed", "w1"), 60)
    assert await broker.complete([again]) == [again]
    raw = await broker.get_record("twice")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED


async def test_fence_checks_without_acknowledging(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "t4")
    running = Completion(Q, None, "t4", record("t4", "running", "w1"), 60, fence=old.token)
    assert await broker.complete([running]) == [running]
    assert await broker.get_record("t4") is None
    # The owner's fenced write applies and leaves its delivery in flight.
    owned = Completion(Q, None, "t4", record("t4", "running", "w2"), 60, fence=new.token)
    assert await rescuer.complete([owned]) == []
    raw = await broker.get_record("t4")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).worker == "w2"
    assert (await broker.queue_stats([Q]))[Q]["in_flight"] == 1


async def test_progress_writes_are_fenced(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "t5")
    assert old.token is not None
    assert new.token is not None
    assert await broker.set_progress("t5", b"late", 10.0, 60, (Q, old.token)) is False
    assert await broker.get_progress("t5") is None
    assert await rescuer.set_progress("t5", b"ok", 1.0, 60, (Q, new.token)) is True
    assert await broker.get_progress("t5") == b"ok"


async def test_without_leases_completions_apply(broker: Broker) -> None:
    """Fast mode has nothing to fence: a completion without a token always applies."""
    await consumer(broker)
    done = Completion(Q, None, "f1", record("f1", "succeeded", "w1"), 60)
    assert await broker.complete([done]) == []
    assert await broker.get_record("f1") is not None
    assert await broker.set_progress("f1", b"p", 1.0, 60) is True
    assert await stale_count(broker) == 0


async def test_an_entry_pending_under_another_consumer_is_not_ours(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    """A write fenced by an entry another consumer holds (XCLAIM) is refused: the check
    without an ack compares consumer names (XPENDING)."""
    if not (is_reliable_redis(broker) or is_spread(broker)):
        pytest.skip("consumer names in a pending list are a Redis Streams notion")
    await consumer(broker)
    await broker.publish(Q, [message("claimed")])
    (d,) = await broker.fetch(Q, 1, 0)
    stream = stream_key(broker)
    await broker.state.client.execute_command("XCLAIM", stream, "blitzq", "consumer-2", 0, d.token)
    running = Completion(Q, None, "claimed", record("claimed", "running", "w1"), 60, fence=d.token)
    assert await broker.complete([running]) == [running]
    assert await broker.get_record("claimed") is None
    assert d.token is not None
    assert await broker.set_progress("claimed", b"p", 1.0, 60, (Q, d.token)) is False
    pending = await broker.state.client.xpending_range(stream, "blitzq", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(d.token, b"consumer-2")]


async def test_an_entry_is_only_ever_pending_under_the_consumer_that_read_it(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    """The invariant the cheap check of acknowledging completions relies on (complete.lua
    takes XACK's answer, "was it pending", as "is it still mine"): recovery acknowledges
    and deletes what it claims in the same script, and a renewal never claims another
    consumer's entry; so no entry is ever left pending under a consumer that did not read
    it, and a stale consumer's XACK finds nothing."""
    if not (is_reliable_redis(broker) or is_spread(broker)):
        pytest.skip("consumer names in a pending list are a Redis Streams notion")
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "inv")
    assert old.token is not None
    assert new.token is not None
    assert await broker.heartbeat(Q, [old.token, new.token]) == 0
    stream = stream_key(broker)
    pending = await broker.state.client.xpending_range(stream, "blitzq", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(new.token, b"consumer-2")]
    assert await broker.state.client.exists(stream) == 1
    assert await broker.state.client.xrange(stream, old.token, old.token) == []
