"""A paused queue (``blitzq queue pause``) holds nothing on a worker: what the worker received
ahead of its fetches goes back to the queue, and nothing more comes to it until resume.

- RabbitMQ pushes each consumer up to its prefetch: a paused worker's consumer is cancelled
  (RabbitMQ lists no consumer of the queue) and what it had received and not started is
  published back (``queue stats`` from any process counts it waiting); the task that was
  running ends and is acked as usual; resume consumes again and the rest runs.
- Redis receives nothing ahead, but an idle worker's loops share one blocking read: a pause
  ends that read, so a message that arrives during the pause is not taken by a read that
  still covered the queue.

States are awaited (event-based), never timings. The RabbitMQ tests use the shared server
(skipped when it does not answer) and delete their own queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from blitzq import Queue, Worker
from blitzq.broker.amqp import AmqpTransport
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.broker_kinds import is_amqp

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)

QUEUE = "pz"
T = TypeVar("T")


@pytest.fixture
async def amqp_queues(server_url: str, namespace: str) -> AsyncIterator[tuple[Queue, Queue]]:
    """The worker's Queue and a producer's (no consumer: its stats read RabbitMQ's counts)
    on the shared RabbitMQ; the namespace's RabbitMQ queues deleted afterwards."""
    url = amqp_or_skip()
    made = [Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=url) for _ in range(2)]
    yield made[0], made[1]
    for queue in made:
        await queue.close()
    cleanup = Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=url)
    await cleanup.broker.prepare_consumer([QUEUE], "cleanup")
    await delete_amqp_queues(url, [q.broker for q in made] + [cleanup.broker])
    await cleanup.close()


async def _ready_and_consumers(producer: Queue) -> tuple[int, int]:
    """RabbitMQ's own counts of the queue: ready messages and consumers (a passive
    declaration on the producer's connection, which consumes nothing)."""
    transport = producer.broker.transport
    assert isinstance(transport, AmqpTransport)
    channel = await transport.link.publisher()
    raw = await channel.get_underlay_channel()
    ok = await raw.queue_declare(transport.link.name(QUEUE), passive=True)
    return int(ok.message_count or 0), int(ok.consumer_count or 0)


async def test_a_paused_amqp_queue_hands_back_the_prefetch_and_holds_no_consumer(
    amqp_queues: tuple[Queue, Queue],
) -> None:
    queue, producer = amqp_queues
    gate, started = asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    @queue.task(name="pz.hold")
    async def hold() -> str:
        started.set()
        await gate.wait()
        return "held"

    @queue.task(name="pz.note")
    async def note(i: int) -> int:
        ran.append(i)
        return i

    worker = make_worker(queue, concurrency=1)  # prefetch 2: one running, one buffered
    async with running(worker):
        held = await producer.send("pz.hold")
        await asyncio.wait_for(started.wait(), 60)
        notes = [await producer.send("pz.note", [i]) for i in range(5)]
        transport = queue.broker.transport
        assert isinstance(transport, AmqpTransport)
        consumer = transport.consumers[QUEUE]
        await eventually(_async(lambda: len(consumer.buffer)), lambda n: n == 1)
        assert await _ready_and_consumers(producer) == (4, 1)  # one held by the worker

        assert await producer.broker.set_paused(QUEUE, True)
        # Promptly (no visibility timeout): every note ready on RabbitMQ for any worker.
        await eventually(
            _async_call(_ready_and_consumers, producer), lambda c: c[0] == 5, timeout=30
        )
        assert not consumer.buffer
        stats = await producer.stats([QUEUE])
        assert stats["queues"][QUEUE]["waiting"] == 5

        gate.set()  # the running task ends; its ack goes over the consumer's open channel
        assert await held.result(timeout=30) == "held"
        # The consumer was cancelled: RabbitMQ lists none once its last delivery is acked
        # (a quorum queue keeps a cancelled consumer while it holds unacked messages).
        assert await eventually(
            _async_call(_ready_and_consumers, producer), lambda c: c == (5, 0), timeout=30
        )
        assert ran == []  # nothing of the paused queue started

        assert await producer.broker.set_paused(QUEUE, False)
        assert [await h.result(timeout=60) for h in notes] == list(range(5))
        assert sorted(ran) == list(range(5))  # each once
        assert (await _ready_and_consumers(producer))[1] >= 1  # consuming again
    record = await producer.inspect(held.id)
    assert record is not None
    assert record.attempts == 1  # the held task was not delivered again


async def test_a_pause_ends_the_idle_workers_shared_read_on_redis(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name=QUEUE)
    if is_amqp(queue.broker):
        pytest.skip("the Redis transports' case")
    ran: list[str] = []

    @queue.task(name="pz.mark")
    async def mark(tag: str) -> str:
        ran.append(tag)
        return tag

    # A long block: a read that still covered the paused queue would take what arrives.
    worker: Worker = make_worker(queue, queues=[QUEUE, "other"], block_timeout=30.0)
    try:
        async with running(worker):
            first = await queue.send("pz.mark", ["warm"], queue="other")
            assert await first.result(timeout=30) == "warm"
            shared = worker._fetcher.shared
            assert shared is not None
            await eventually(_async(lambda: set(shared._waiting)), lambda w: QUEUE in w)

            assert await queue.broker.set_paused(QUEUE, True)
            await eventually(_async(lambda: QUEUE in worker.paused), bool)
            # Sent at once: a read that still covered the paused queue would take it.
            paused = await queue.send("pz.mark", ["paused"])
            other = await queue.send("pz.mark", ["other"], queue="other")
            assert await other.result(timeout=30) == "other"
            await eventually(  # a read that took it handed it back, unstarted
                _async_call(_counts, queue), lambda c: c == {"waiting": 1, "in_flight": 0}
            )
            assert "paused" not in ran
            # The pause ended the idle read: the paused queue's loop is out of it.
            await eventually(_async(lambda: set(shared._waiting)), lambda w: QUEUE not in w)

            assert await queue.broker.set_paused(QUEUE, False)
            assert await paused.result(timeout=60) == "paused"
    finally:
        await queue.close()


async def _counts(queue: Queue) -> dict[str, int]:
    counts: dict[str, int] = (await queue.stats([QUEUE]))["queues"][QUEUE]
    return counts


def _async(value: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def probe() -> T:
        return value()

    return probe


def _async_call(fn: Callable[[Queue], Awaitable[T]], queue: Queue) -> Callable[[], Awaitable[T]]:
    async def probe() -> T:
        return await fn(queue)

    return probe
