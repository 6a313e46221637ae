"""The seam by composition: a Broker made by hand from a transport and a state store.

``Broker(transport, state)`` with the Redis transports and the Redis state store built
separately on one connection (the store given the streams transport's lease identity) is what
``ReliableRedisBroker`` / ``FastRedisBroker`` return, and passes a round trip (publish, fetch,
complete with a record, results, stats). A state store that does *not* ack the transport's
deliveries (here: the Redis store on another connection, made with its outbox, standing in
for RabbitMQ + Redis) gets the facade's commit-then-``Transport.ack`` path, and a streams
delivery handed back by ``Transport.nack`` is recovered at the next sweep. A store on a
streams transport's connection without that transport's lease identity is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from blitzq.broker import Broker, Completion, Transport
from blitzq.broker.redis.connection import RedisConnection
from blitzq.broker.redis.lists import ListsTransport
from blitzq.broker.redis.store import RedisStateStore
from blitzq.broker.redis.streams import StreamsTransport
from blitzq.exceptions import ConfigurationError
from blitzq.records import TaskRecord, TaskState

from .test_broker_contract import Q, consumer, ids, message
from .test_fencing_contract import record

Compose = Callable[..., Broker]


@pytest.fixture
async def compose(broker_kind: str, location: tuple[str, str]) -> AsyncIterator[Compose]:
    """``compose(separate=False)``: a Broker of this run's transport (streams, or lists for
    ``fast``) and a Redis state store, on one connection or (``separate``) on a second one
    whose store does not ack the transport's deliveries. Closed after the test."""
    url, namespace = location
    kind = "l" if broker_kind.endswith("fast") else "s"
    made: list[Broker] = []

    def factory(separate: bool = False) -> Broker:
        conn = RedisConnection(url, namespace, kind=kind)
        transport: Transport = StreamsTransport(conn) if kind == "s" else ListsTransport(conn)
        if separate:
            state = RedisStateStore(RedisConnection(url, namespace, kind="l"), outbox=True)
        else:
            state = RedisStateStore(conn, lease=getattr(transport, "lease", None))
        broker = Broker(transport, state)
        made.append(broker)
        return broker

    yield factory
    for broker in made:
        await broker.close()


async def test_a_composed_broker_makes_a_round_trip(compose: Compose) -> None:
    broker = await consumer(compose())
    assert broker.state.acks(broker.transport)
    # The hot paths are the components' own methods: nothing in between (a replicated store,
    # Sentinel's or a cluster's, completes durably: WAIT for the replicas that exist).
    assert broker.fetch == broker.transport.fetch
    assert broker.publish == broker.transport.publish
    state = broker.state
    assert broker.complete == (state.complete_durably if state.replicated else state.complete)
    await broker.publish(Q, [message("a"), message("b")])
    got = await broker.fetch(Q, 10, 0)
    assert ids(got) == ["a", "b"]
    stale = await broker.complete(
        [Completion(d.queue, d.token, tid, record(tid, "succeeded", "w", tid), 60)
         for d, tid in zip(got, ["a", "b"], strict=True)]
    )  # fmt: skip
    assert stale == []
    raw = await broker.wait_for_record("b", 5)
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}
    assert Q in await broker.known_queues()


async def test_a_store_that_does_not_ack_gets_commit_then_ack(compose: Compose) -> None:
    broker = await consumer(compose(separate=True))
    assert not broker.state.acks(broker.transport)
    assert broker.complete != broker.state.complete
    await broker.publish(Q, [message("a")])
    (d,) = await broker.fetch(Q, 1, 0)
    done = Completion(d.queue, d.token, "a", record("a", "succeeded", "w"), 60)
    assert await broker.complete([done]) == []
    raw = await broker.get_record("a")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED
    # Acked on the transport: nothing waits, nothing is leased, nothing comes back.
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}
    assert await broker.recover(Q, 0.001, 10, 5) == (0, 0)
    assert await broker.fetch(Q, 1, 0) == []


@pytest.mark.parametrize("state_kind", ["s", "l"])
async def test_a_separate_store_never_fences_on_the_transports_tokens(
    broker_kind: str, location: tuple[str, str], state_kind: str
) -> None:
    """The transport's delivery tags are not the store's leases, whatever the kind of the
    store's own connection: with a streams-kind store a foreign tag used to read as a lost
    stream lease, and every completion was dropped as stale (found by a newcomer pairing an
    in-process transport with the Redis store). The transport here keeps its queues in a
    namespace of its own, so its tags mean nothing to the store, as a RabbitMQ tag would."""
    url, namespace = location
    kind = "l" if broker_kind.endswith("fast") else "s"
    conn = RedisConnection(url, namespace + "-t", kind=kind)
    transport: Transport = StreamsTransport(conn) if kind == "s" else ListsTransport(conn)
    state = RedisStateStore(RedisConnection(url, namespace, kind=state_kind), outbox=True)
    broker = Broker(transport, state)
    try:
        await consumer(broker)
        await broker.publish(Q, [message("a"), message("b")])
        got = await broker.fetch(Q, 2, 0)
        done = [
            Completion(d.queue, d.token, tid, record(tid, "succeeded", "w"), 60, fence=d.token)
            for d, tid in zip(got, ["a", "b"], strict=True)
        ]
        assert await broker.complete(done) == []
        for tid in ("a", "b"):
            raw = await broker.get_record(tid)
            assert raw is not None
            assert TaskRecord.from_bytes(raw).state is TaskState.SUCCEEDED
        # Acked on the transport: nothing waits or is leased there.
        assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}
    finally:
        client = conn.client
        keys = [k async for k in client.scan_iter(match="{" + namespace + "-t}:*")]
        if keys:
            await client.delete(*keys)
        await broker.close()


async def test_nack_hands_a_streams_delivery_back(compose: Compose) -> None:
    broker = await consumer(compose())
    if not broker.supports_recovery:
        with pytest.raises(NotImplementedError):
            await broker.transport.nack(Q, [b"0-1"])
        return
    await broker.publish(Q, [message("a")])
    (d,) = await broker.fetch(Q, 1, 0)
    assert d.token is not None
    # Not idle long enough for a sweep with a 60 s visibility timeout ...
    assert await broker.recover(Q, 60, 10, 5) == (0, 0)
    await broker.transport.nack(Q, [d.token])
    # ... until handed back: the next sweep re-adds it, counted as a second delivery.
    assert await broker.recover(Q, 60, 10, 5) == (1, 0)
    (again,) = await broker.fetch(Q, 1, 0)
    assert ids([again]) == ["a"]
    assert again.deliveries == 2


async def test_a_store_without_the_transports_lease_identity_is_refused(
    broker_kind: str, location: tuple[str, str]
) -> None:
    """The store fences on the streams transport's leases only through the lease identity
    handed to it when it is made: composed without it, the broker is refused at once (it
    would fence on no consumer's name)."""
    if broker_kind.endswith("fast"):
        pytest.skip("a lists transport has no leases")
    url, namespace = location
    conn = RedisConnection(url, namespace, kind="s")
    try:
        with pytest.raises(ConfigurationError, match=r"lease=transport\.lease"):
            Broker(StreamsTransport(conn), RedisStateStore(conn))
    finally:
        await conn.close()
