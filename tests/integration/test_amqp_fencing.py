"""Fencing on the RabbitMQ transport: a completion of a delivery RabbitMQ took back (its
channel closed: missed heartbeats, a stall) writes nothing once another delivery of the
message was taken, and is counted in ``stale_completions``; a redelivery counts only the
returns of copies a worker took (``broker/amqp/redelivered.py``).

A channel closed here stands for a connection RabbitMQ gave up (tests/reliability's
``test_a_stalled_workers_late_completion_is_fenced`` does it with a ``SIGSTOP`` past the
heartbeat). The tests use the shared RabbitMQ (skipped when it does not answer), the test
Redis for the state, and their own namespace's queues, deleted afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from blitzq.broker import Completion, Delivery
from blitzq.broker.amqp import AmqpBroker, AmqpTransport
from blitzq.broker.base import Broker
from blitzq.broker.redis.connection import RedisConnection
from blitzq.broker.redis.store import RedisStateStore
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import Envelope, dumps, encode_envelope
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

pytestmark = pytest.mark.timeout(60)

QUEUE = "fencing"


@pytest.fixture
async def brokers(server_url: str, namespace: str) -> AsyncIterator[Callable[[], Broker]]:
    """Makes AmqpBrokers (prefetch 4) of one namespace on the shared RabbitMQ; closed and
    their queues deleted afterwards."""
    url = amqp_or_skip()
    made: list[Broker] = []

    def make() -> Broker:
        broker = AmqpBroker(url, server_url, namespace, prefetch=4)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        await broker.close()
    await delete_amqp_queues(url, made)


def body(task_id: str, attempt: int = 1) -> bytes:
    """An encoded message of ``task_id`` at ``attempt``."""
    return encode_envelope(
        Envelope(task_id, "tests.amqp.noop", QUEUE, [], attempt=attempt), 1 << 20
    )


def record(task_id: str, state: str, worker: str, attempts: int) -> bytes:
    """An encoded task record."""
    return dumps(
        {"id": task_id, "task": "t", "queue": QUEUE, "state": state, "worker": worker,
         "attempts": attempts}
    )  # fmt: skip


async def take(broker: Broker, count: int = 1) -> list[Delivery]:
    """Up to ``count`` deliveries of :data:`QUEUE` (waiting up to 10 s for the first)."""
    return await broker.fetch(QUEUE, count, 10.0)


async def lose_channel(broker: Broker) -> None:
    """Close the channel of ``broker``'s consumer, as RabbitMQ does to a connection whose
    heartbeats it missed: its unacked deliveries go back to the queue."""
    transport = broker.transport
    assert isinstance(transport, AmqpTransport)
    await transport.consumers[QUEUE].raw.close()


async def stale_count(broker: Broker) -> int:
    """The namespace's ``stale_completions`` counter."""
    return (await broker.counters()).get("stale_completions", 0)


async def test_a_late_completion_after_another_took_the_redelivery_writes_nothing(
    brokers: Callable[[], Broker],
) -> None:
    stalled, other = brokers(), brokers()
    await stalled.publish(QUEUE, [body("f1")])
    (old,) = await take(stalled)
    assert old.deliveries == 1
    await lose_channel(stalled)
    (new,) = await take(other)
    assert new.deliveries == 2
    assert new.token != old.token
    theirs = Completion(QUEUE, new.token, "f1", record("f1", "dead_lettered", "w2", 2), 60)
    assert await other.complete([theirs]) == []
    late = [
        Completion(
            QUEUE, old.token, "f1", record("f1", "retrying", "w1", 1), 60,
            reschedule=body("f1", 2), delay=0.1,
        ),
        Completion(QUEUE, old.token, "f1", record("f1", "succeeded", "w1", 1), 60),
    ]  # fmt: skip
    stale = await stalled.complete(late)
    assert len(stale) == 2
    assert all(any(s is c for s in stale) for c in late)
    raw = await other.get_record("f1")
    assert raw is not None
    stored = TaskRecord.from_bytes(raw)
    assert (stored.state, stored.worker, stored.attempts) == (TaskState.DEAD_LETTERED, "w2", 2)
    assert await other.scheduled_count() == 0  # no retry: no third run
    assert await stale_count(other) == 2


async def test_a_completion_before_the_take_applies_and_the_redelivery_does_not_run(
    brokers: Callable[[], Broker],
) -> None:
    stalled, other = brokers(), brokers()
    await stalled.publish(QUEUE, [body("f2"), body("f3")])
    old = await take(stalled, 2)
    assert [d.deliveries for d in old] == [1, 1]
    await lose_channel(stalled)
    done = Completion(QUEUE, old[0].token, "f2", record("f2", "succeeded", "w1", 1), 60)
    assert await stalled.complete([done]) == []  # nobody took it again yet
    again = await take(other, 2)
    assert [d.deliveries for d in again] == [2]  # f2's redelivery acked without running
    assert await stale_count(other) == 0


async def test_returns_of_copies_no_worker_took_count_no_attempt(
    brokers: Callable[[], Broker],
) -> None:
    """A message that waited unstarted in two consumers' buffers comes back from RabbitMQ
    as delivered three times; it counts as delivered twice (its first delivery may have
    run)."""
    first, second, third = brokers(), brokers(), brokers()
    await first.publish(QUEUE, [body("a"), body("b")])
    (a1,) = await take(first)  # takes "a"; "b" waits in the consumer's buffer
    await lose_channel(first)
    (a2,) = await take(second)  # a redelivery, taken; "b" waits in this buffer too
    assert (a2.deliveries, a2.token != a1.token) == (2, True)
    await lose_channel(second)
    got = {d.payload: d for d in await take(third, 2)}
    assert got[body("a")].deliveries == 3  # taken twice before: counted
    assert got[body("b")].deliveries == 2  # never taken: one return counted, not two
    assert all(d.unsure for d in got.values())  # their first delivery may not have run


@pytest.mark.parametrize("listed", [3, 200], ids=["few-takes", "many-takes"])
async def test_the_store_refuses_a_completion_of_a_copy_another_delivery_took(
    server_url: str, namespace: str, listed: int
) -> None:
    """The state store alone (no RabbitMQ): takes of ``listed`` task ids (a small listed set,
    read whole, and a large one, asked by ``ZMSCORE``); a plain success and a retry whose
    fence is not their copy's take are stale, the others applied."""
    conn = RedisConnection(server_url, namespace, kind="l")
    store = RedisStateStore(conn, outbox=True)
    try:
        ids = [f"x{i}" for i in range(listed)]
        tokens = [b"them.1.1.%d/00000000000000%02x" % (i, i % 256) for i in range(listed)]
        digests = [t.rpartition(b"/")[2].decode() for t in tokens]
        found, counts = await store.records.take_redelivered(ids, digests, tokens, 60)
        assert found == [None] * listed
        assert counts == [1] * listed
        mine = [b"me.1.1.%d/%s" % (i, d.encode()) for i, d in enumerate(digests[:2])]
        late = [
            Completion("q", None, "x0", record("x0", "succeeded", "me", 1), 60, fence=mine[0]),
            Completion("q", None, "x1", None, 0, reschedule=body("x1", 2), fence=mine[1]),
        ]
        theirs = Completion(
            "q", None, "x2", record("x2", "succeeded", "them", 2), 60, fence=tokens[2]
        )
        fresh = Completion(  # never redelivered: no take, applied
            "q", None, "y", record("y", "succeeded", "me", 1), 60, fence=b"me.1.1.9/ff"
        )
        stale = await store.complete([*late, theirs, fresh])
        assert len(stale) == 2
        assert all(any(s is c for s in stale) for c in late)
        assert await store.records.get_record("x0") is None
        assert await store.records.get_record("x2") is not None
        assert await store.records.get_record("y") is not None
        assert (await store.registry.counters()).get("stale_completions") == 2
    finally:
        await conn.close()


async def test_a_resumed_worker_does_not_publish_its_taken_back_buffer_again(
    server_url: str, namespace: str, brokers: Callable[[], Broker]
) -> None:
    """A worker resuming from a stall past the heartbeat finds its prefetch buffer older
    than the visibility timeout; the maintenance hand-back of old buffered messages confirms
    the channel first and, the channel gone, drops the buffer instead of publishing a second
    copy of messages RabbitMQ already put back."""
    url = amqp_or_skip()
    stalled = AmqpBroker(url, server_url, namespace, prefetch=4, visibility_timeout=6.0)
    try:
        await stalled.publish(QUEUE, [body("b1"), body("b2"), body("b3")])
        assert len(await take(stalled)) == 1  # the other two wait in the buffer
        transport = stalled.transport
        assert isinstance(transport, AmqpTransport)
        assert transport.custody is not None
        consumer = transport.consumers[QUEUE]
        consumer.confirmed = -1e9  # last confirmed long ago: as after a stall
        await lose_channel(stalled)
        assert await transport.custody.release_stale(QUEUE, 0.0) == 0
        other = brokers()
        got = await take(other, 10)
        while len(got) < 3:
            more = await take(other, 10)
            if not more:
                break
            got += more
        assert sorted(d.payload for d in got) == sorted(body(i) for i in ("b1", "b2", "b3"))
        assert await other.fetch(QUEUE, 10, 1.0) == []  # no second copy was published
    finally:
        await stalled.close()
        await delete_amqp_queues(url, [stalled])
