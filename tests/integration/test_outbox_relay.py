"""The outbox relay on a real foreign pairing: every way the state store writes into queues
ends with the task run on the foreign transport.

The pairing (``tests/foreign.py``) is the Redis state store on the test's namespace and a
streams transport on another connection and namespace: the store never sees the transport's
keys, as with RabbitMQ. Delays, retries with backoff, chains and chords, periodic claims and
dead-letter replays are written to the store's outbox and published on the transport by the
relay (a worker's loop, or inline after a producer's or the scheduler's call); a relay that
dies between taking a batch and releasing it has the batch put back and published again
(at-least-once: nothing lost, a duplicate possible).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from blitzq import Queue, RetryPolicy
from blitzq.broker import Relay, Scheduled
from blitzq.broker.redis import ReliableRedisBroker
from blitzq.exceptions import BrokerError
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every
from blitzq.serialization import Envelope, encode_envelope
from blitzq.workflow import chord
from tests.foreign import TRANSPORT_SUFFIX, ForeignPairing, delete_namespace

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)

Q = "relayed"


class App:
    """A Queue on a foreign pairing with a few tasks and counters of their runs."""

    def __init__(self, pairing: ForeignPairing, namespace: str) -> None:
        self.pairing = pairing
        self.queue = queue = Queue(name=Q, namespace=namespace, broker=pairing)
        self.runs: Counter[str] = Counter()
        runs = self.runs
        flaky_left = {"n": 1}
        fail_first = {"n": 1}

        @queue.task(name="ob.add")
        async def add(a: int, b: int) -> int:
            runs["add"] += 1
            return a + b

        @queue.task(name="ob.total")
        async def total(values: list[int]) -> int:
            runs["total"] += 1
            return sum(values)

        @queue.task(name="ob.flaky", retries=3, retry_policy=RetryPolicy(base=0.05, jitter="none"))
        async def flaky(value: int) -> int:
            runs["flaky"] += 1
            if flaky_left["n"] > 0:
                flaky_left["n"] -= 1
                raise RuntimeError("transient")
            return value

        @queue.task(name="ob.fragile", retries=0)
        async def fragile(value: int) -> int:
            runs["fragile"] += 1
            if fail_first["n"] > 0:
                fail_first["n"] -= 1
                raise ValueError("first run fails")
            return value

        self.gate = asyncio.Event()
        self.started = asyncio.Event()

        @queue.task(name="ob.gated")
        async def gated(value: int) -> int:
            runs["gated"] += 1
            self.started.set()
            await self.gate.wait()
            return value

        @queue.periodic(Every(3600), name="ob.beat", missed="run_all")
        async def beat() -> None:
            runs["beat"] += 1

        self.add, self.total, self.flaky, self.fragile = add, total, flaky, fragile
        self.gated = gated

    async def count(self, name: str) -> int:
        """Runs of ``name`` so far (a coroutine, for ``eventually``)."""
        return self.runs[name]

    async def waiting_on_transport(self) -> int:
        """Messages waiting on the transport's stream of the queue."""
        stats = await self.pairing.transport.queue_stats([Q])
        return stats[Q]["waiting"]


@pytest.fixture
async def app(redis_url: str, namespace: str) -> AsyncIterator[App]:
    """The app on a fresh foreign pairing; the transport's namespace is deleted after."""
    made = App(ForeignPairing(redis_url, namespace), namespace)
    yield made
    await made.queue.close()
    await delete_namespace(redis_url, namespace + TRANSPORT_SUFFIX)


async def store_queue_keys(app: App, raw_redis: Any) -> list[bytes]:
    """Keys of the store's namespace a fused transport would read (``s:`` / ``l:``): a store
    in outbox mode writes none."""
    keys = app.pairing.state.conn.keys
    found = []
    for key in (keys.stream(Q), keys.list(Q)):
        if await raw_redis.exists(key):
            found.append(key.encode())
    return found


async def test_the_facade_relays_only_for_a_foreign_pairing(
    app: App, redis_url: str, namespace: str
) -> None:
    assert isinstance(app.pairing.relay, Relay)
    assert app.pairing.state.kind == "o"  # type: ignore[attr-defined]
    fused = ReliableRedisBroker(redis_url, namespace + "-fused")
    try:
        assert fused.relay is None
        assert fused.complete == fused.state.complete  # the hot path is untouched
        assert fused.state.kind == "s"  # type: ignore[attr-defined]
    finally:
        await fused.close()


async def test_delays_and_retries_with_backoff_run_on_the_transport(
    app: App, raw_redis: Any
) -> None:
    async with running(make_worker(app.queue, concurrency=4)):
        delayed = await app.add.options(delay=0.2).enqueue(2, 3)
        retried = await app.flaky.enqueue(7)
        assert await delayed.result(timeout=30) == 5
        assert await retried.result(timeout=30) == 7
    assert app.runs["flaky"] == 2  # the retry went schedule -> outbox -> transport
    assert app.pairing.relay is not None
    assert app.pairing.relay.relayed >= 2
    assert await store_queue_keys(app, raw_redis) == []


async def test_a_chain_and_a_chord_run_on_the_transport(app: App) -> None:
    async with running(make_worker(app.queue, concurrency=8)):
        chained = await app.queue.apply(app.add.s(1, 2) | app.add.s(10) | app.add.s(100))
        assert await chained.get(timeout=30) == 113
        gathered = await app.queue.apply(chord([app.add.s(i, i) for i in range(4)], app.total.s()))
        assert await gathered.get(timeout=30) == 12
    assert app.runs["total"] == 1


async def test_a_periodic_claim_is_relayed_by_the_scheduler_itself(
    app: App, raw_redis: Any
) -> None:
    now = await app.queue.broker.server_time()
    newest = Every(3600).next_after(now) - 3600
    await raw_redis.hset(app.pairing.state.keys.periodic, "ob.beat", repr(newest - 3600))
    scheduler = Scheduler(app.queue)
    assert await scheduler.tick() == 1
    # No worker runs: the scheduler's own call relayed the claim to the transport.
    assert await app.waiting_on_transport() == 1
    async with running(make_worker(app.queue, concurrency=2)):
        await eventually(lambda: app.count("beat"), lambda n: n == 1)


async def test_a_dead_letter_replay_runs_on_the_transport(app: App) -> None:
    async with running(make_worker(app.queue, concurrency=2)):
        handle = await app.fragile.enqueue(42)
        await eventually(app.queue.dead_letter_count, lambda n: n == 1)
    # No worker runs (as with `blitzq dead-letter replay`): the replay relays it itself.
    replayed = await app.queue.retry(handle.id)
    assert replayed is not None
    assert await app.waiting_on_transport() == 1
    async with running(make_worker(app.queue, concurrency=2)):
        assert await replayed.result(timeout=30) == 42
    assert app.runs["fragile"] == 2


async def test_a_requeue_at_shutdown_goes_through_the_outbox(app: App) -> None:
    """A task still running when a graceful stop times out is requeued: the store writes its
    message to the outbox with the ack of the delivery (no ``Transport.nack``), and the final
    flush relays it to the transport, where the next worker runs it."""
    async with running(make_worker(app.queue, concurrency=1, shutdown_timeout=0.2)):
        handle = await app.gated.enqueue(5)
        await asyncio.wait_for(app.started.wait(), 30)
    assert await app.waiting_on_transport() == 1
    assert app.pairing.relay is not None
    assert await app.pairing.relay.outbox.waiting([Q]) == {Q: 0}
    app.gate.set()
    async with running(make_worker(app.queue, concurrency=1)):
        assert await handle.result(timeout=30) == 5
    assert app.runs["gated"] == 2


async def test_stats_and_purge_count_the_outbox(app: App) -> None:
    await outbox_message(app, "counted")
    await app.pairing.publish(Q, [encode_envelope(Envelope("direct", "ob.add", Q, [1, 2]), 1024)])
    assert (await app.pairing.queue_stats([Q]))[Q]["waiting"] == 2
    assert await app.pairing.purge_queue(Q) == 2
    assert (await app.pairing.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 0}


async def outbox_message(app: App, task_id: str) -> None:
    """Put one message for ``ob.add(1, 1)`` in the store's outbox without relaying it: the
    store's own schedule and promotion, below the facade."""
    envelope = Envelope(task_id, "ob.add", Q, [1, 1])
    state = app.pairing.state
    await state.scheduling.schedule(
        [Scheduled(task_id, Q, encode_envelope(envelope, 1 << 20), delay=0.0)]
    )
    await eventually(lambda: state.scheduling.promote_due(10), lambda r: r[0] == 1)
    assert app.pairing.relay is not None
    assert await app.pairing.relay.outbox.waiting([Q]) == {Q: 1}


async def test_a_relay_killed_between_take_and_publish_loses_nothing(app: App) -> None:
    await outbox_message(app, "orphan")
    relay = app.pairing.relay
    assert relay is not None
    # A relay "dies" right after the move: its batch is taken, under a short lease.
    taken = await relay.outbox.take("dead-relay", Q, 10, 0.2)
    assert taken is not None
    assert len(taken[1]) == 1
    assert await relay.outbox.waiting([Q]) == {Q: 0}
    assert await app.waiting_on_transport() == 0
    # A worker's relay puts the lapsed batch back and publishes it: the task runs.
    async with running(make_worker(app.queue, concurrency=2)):
        await eventually(lambda: app.count("add"), lambda n: n == 1)
        raw = await app.queue.broker.wait_for_record("orphan", 30)
        assert raw is not None


async def test_a_relay_killed_between_publish_and_release_publishes_twice(app: App) -> None:
    await outbox_message(app, "twice")
    relay = app.pairing.relay
    assert relay is not None
    taken = await relay.outbox.take("dead-relay", Q, 10, 0.2)
    assert taken is not None
    await app.pairing.transport.publish(*taken)  # published, then "killed" before release
    assert await app.waiting_on_transport() == 1
    # The batch is put back once the lease lapses and published again: at-least-once.
    async with running(make_worker(app.queue, concurrency=2)):
        await eventually(lambda: app.count("add"), lambda n: n == 2)
    assert await relay.outbox.waiting([Q]) == {Q: 0}


async def test_a_failed_publish_keeps_the_batch_for_the_next_pass(app: App) -> None:
    await outbox_message(app, "retried-publish")
    relay = app.pairing.relay
    assert relay is not None
    transport = app.pairing.transport
    real_publish = transport.publish
    calls = {"n": 0}

    async def failing_once(queue: str, messages: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise BrokerError("transport unavailable")
        await real_publish(queue, messages)

    transport.publish = failing_once  # type: ignore[method-assign]
    try:
        await relay.pushed([Q])  # inline: the failure is logged, not raised
        assert await relay.outbox.waiting([Q]) == {Q: 0}  # the batch stays taken
        assert await app.waiting_on_transport() == 0
        assert await relay.drain([Q]) == 1  # the next pass publishes the taken batch first
    finally:
        transport.publish = real_publish  # type: ignore[method-assign]
    assert await app.waiting_on_transport() == 1
    assert await relay.drain([Q]) == 0


async def test_a_relay_paused_with_its_peers_puts_back_no_batch_they_hold(app: App) -> None:
    """After a pause of its own (a whole-host pause), a relay's first sweep leaves the other
    relays' lapsed batches alone: they were paused too and release them at once."""
    import time

    await outbox_message(app, "paused-peer")
    outbox = app.pairing.relay.outbox  # type: ignore[union-attr]
    taken = await outbox.take("peer-relay", Q, 10, 0.3)  # lapses during the pause below
    assert taken is not None
    relay = Relay(outbox, app.pairing.transport, lease=2.0)  # a pause: 0.5 s late or more
    restores: list[int] = []
    restore = outbox.restore

    async def counting(count: int) -> int:
        restores.append(await restore(count))
        return restores[-1]

    outbox.restore = counting  # type: ignore[method-assign]
    task = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: asyncio.sleep(0, len(restores)), lambda n: n >= 1)
        assert restores == [0]  # the peer's lease still ran at the first sweep
        time.sleep(3.0)  # the whole host pauses (this loop with it), past the peer's lease
        await app.pairing.transport.publish(*taken)  # the peer resumes: publishes, releases
        await outbox.release("peer-relay")
        # Wait for a sweep that could put it back (not the one right after the pause).
        await eventually(lambda: asyncio.sleep(0, len(restores)), lambda n: n >= 2, 30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        outbox.restore = restore  # type: ignore[method-assign]
    assert sum(restores) == 0, restores
    assert await app.waiting_on_transport() == 1  # published once, by the peer
