"""Calls of the RabbitMQ transport on a channel that closed under them (a connection given
up, a server close): each raises blitzq's :class:`~blitzq.exceptions.BrokerError`, never
aio-pika/aiormq's own ``ChannelInvalidStateError`` (a ``RuntimeError``) -- a worker's
shutdown sampled the queue depths on such a channel and the raw error ended ``Worker.run()``.

The tests use the shared RabbitMQ (skipped when it does not answer) and their own queues.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq.broker.amqp import AmqpBroker, AmqpTransport, inspection
from blitzq.broker.amqp.deliveries import Consumer
from blitzq.broker.base import Broker
from blitzq.exceptions import BrokerError
from blitzq.serialization import Envelope, encode_envelope
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

pytestmark = pytest.mark.timeout(60)

QUEUE = "closedch"


@pytest.fixture
async def broker(server_url: str, namespace: str) -> AsyncIterator[Broker]:
    """An AmqpBroker on the shared RabbitMQ; its queues are deleted afterwards."""
    url = amqp_or_skip()
    made = AmqpBroker(url, server_url, namespace)
    yield made
    await made.close()
    await delete_amqp_queues(url, [made])


async def consumer_closed_under(broker: Broker) -> Consumer:
    """The consumer of :data:`QUEUE` after one fetch, its channel then closed (as a given-up
    connection closes it)."""
    body = encode_envelope(Envelope("c1", "tests.amqp.noop", QUEUE, []), 1 << 20)
    await broker.publish(QUEUE, [body])
    transport = broker.transport
    assert isinstance(transport, AmqpTransport)
    assert len(await transport.fetch(QUEUE, 1, 10.0)) == 1
    consumer = transport.consumers[QUEUE]
    await consumer.raw.close()
    return consumer


Call = Callable[[Broker, Consumer], Any]


async def count(broker: Broker, consumer: Consumer) -> Any:
    """The depth count of a shutdown's last sample, on the consumer's own channel (the
    consumer was alive when the sample began)."""
    transport = broker.transport
    assert isinstance(transport, AmqpTransport)
    return await inspection.queue_stats(transport.link, {QUEUE: consumer}, [], [QUEUE])


async def consume_again(broker: Broker, consumer: Consumer) -> Any:
    """``basic.consume`` again on its channel (a paused queue resumed)."""
    transport = broker.transport
    assert isinstance(transport, AmqpTransport)
    return await transport._consume(consumer)


@pytest.mark.parametrize("call", [count, consume_again], ids=["queue_stats", "consume"])
async def test_a_call_on_a_closed_channel_raises_broker_error(broker: Broker, call: Call) -> None:
    consumer = await consumer_closed_under(broker)
    with pytest.raises(BrokerError):
        await call(broker, consumer)
