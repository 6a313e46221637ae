"""A worker whose event loop stalled past the AMQP heartbeat (``SIGSTOP``, a blocking call):
RabbitMQ gave its connection up and delivered its unacked messages to another consumer. On
waking, the stalled consumer must not hand out the messages it had buffered before the stall
(first deliveries, already another's): its fetch confirms the channel with a round trip first
(``Consumer.unconfirmed``/``confirm``), which meets the closed connection, drops the buffer,
and connects again.

The stall is a blocking wait of the test's own event loop (heartbeat 2 s) until a second
consumer, on its own loop in a thread, has received every message: RabbitMQ took them back.
Uses the shared RabbitMQ (skipped when it does not answer) and the test's own queue.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from blitzq.broker.amqp import AmqpTransport
from blitzq.exceptions import BrokerError
from tests.amqp_server import amqp_or_skip

from .proc_tasks import eventually

pytestmark = pytest.mark.timeout(120)

QUEUE = "stalled"
COUNT = 5


async def _take_back(url: str, namespace: str, expected: set[bytes], done: threading.Event) -> None:
    """The other worker: fetch (and ack) until every message of ``expected`` came."""
    other = AmqpTransport(url, namespace, prefetch=COUNT)
    got: set[bytes] = set()
    try:
        while not expected <= got:
            for d in await other.fetch(QUEUE, COUNT, 1.0):
                got.add(d.payload)
                assert d.token is not None
                await other.ack(QUEUE, [d.token])
    finally:
        await other.close()
        done.set()


async def test_a_stalled_consumer_never_hands_out_what_rabbitmq_took_back() -> None:
    url = amqp_or_skip().split("?")[0] + "?heartbeat=2"
    namespace = f"stalled-{uuid.uuid4().hex[:8]}"
    stalled = AmqpTransport(url, namespace, prefetch=COUNT * 2)
    bodies = [f"m{i}".encode() for i in range(COUNT)]
    try:
        await stalled.publish(QUEUE, bodies)
        first = await stalled.fetch(QUEUE, 1, 10.0)
        assert len(first) == 1
        consumer = stalled.consumers[QUEUE]
        await eventually(
            lambda: asyncio.sleep(0, len(consumer.buffer)), lambda n: n == COUNT - 1, 10
        )
        buffered = {m.body for m in consumer.buffer}
        # The loop stalls: no heartbeat goes out until another consumer got every message.
        done = threading.Event()
        thread = threading.Thread(
            target=asyncio.run, args=(_take_back(url, namespace, set(bodies), done),)
        )
        thread.start()
        assert done.wait(90), "RabbitMQ never gave the stalled connection up"
        thread.join(10)
        # Awake: whatever the fetches hand out, none is a delivery RabbitMQ took back.
        # One message a fetch (a worker's one free slot): the buffer is not topped up (a
        # basic.get would itself meet the closed connection), it is taken from.
        handed: list[bytes] = []
        for _ in range(COUNT + 2):
            try:
                handed += [d.payload for d in await stalled.fetch(QUEUE, 1, 0.5)]
            except BrokerError:
                continue  # the round trip met the closed connection: connects again
        assert not buffered & set(handed), handed
        assert not handed  # the other consumer acked them all
    finally:
        await stalled.link.delete([stalled.link.name(QUEUE), stalled.link.dead_letter_queue])
        await stalled.close()
