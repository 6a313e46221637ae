"""RabbitMQ's delivery limit as a backstop (``x-delivery-limit``, docs/guarantees.md): a
task that reached it only through the crashes of workers that held it (prefetched, never run
alone) is published again by the dead-letter drain, marked as delivered once; one whose solo
runs (``{ns}:solo:<id>``) spent its budget is a dead letter, and so is one that reached the
limit :data:`~blitzq.broker.amqp.custody.BACKSTOP_ROUNDS` times already.

On the shared RabbitMQ (skipped when it does not answer) with the state on the test Redis;
a worker crash is the holder's connection closing with the delivery unacked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq.broker import Broker
from blitzq.broker.amqp.custody import BACKSTOP_ROUNDS
from blitzq.broker.amqp.publishing import BACKSTOPS
from blitzq.broker.transport import delivery_backstop, solo_plan
from blitzq.serialization import Envelope, decode_envelope, encode_envelope
from tests.amqp_server import amqp_brokers

from .proc_tasks import eventually

pytestmark = pytest.mark.timeout(120)

MAX_DELIVERIES = 5


def message(task_id: str, queue: str) -> bytes:
    """An encoded message of a task nobody runs (transport-level tests)."""
    return encode_envelope(Envelope(task_id, "tests.amqp.noop", queue, []), 1 << 20)


@pytest.fixture
async def amqp(server_url: str, namespace: str) -> AsyncIterator[Callable[..., Broker]]:
    """Factory of AmqpBrokers with ``max_deliveries=5`` (backstop 20); their RabbitMQ queues
    are deleted afterwards."""
    async with amqp_brokers(server_url, namespace, "?pack=1") as factory:
        yield factory


async def crash_until_dead_lettered(holder: Broker, queue: str, task_id: str) -> None:
    """Take the one message of ``queue`` and close the connection with it unacked (a worker
    crash), as many times as RabbitMQ delivers it before its delivery limit."""
    for n in range(1, delivery_backstop(MAX_DELIVERIES) + 1):
        (got,) = await holder.fetch(queue, 1, 10)
        assert decode_envelope(got.payload).id == task_id
        assert got.deliveries == n
        await holder.transport.link.close()  # type: ignore[attr-defined]


async def drain(broker: Broker, queue: str) -> int:
    """Run maintenance rounds until the drain moved a message of RabbitMQ's dead-letter
    queue; return how many messages it dead-lettered."""

    async def round_() -> tuple[int, int]:
        return await broker.recover(queue, 60, 100, MAX_DELIVERIES, 60)

    found = await eventually(round_, lambda r: r != (0, 0), 30)
    return int(found[1])


async def test_a_task_prefetched_through_crashes_is_published_again_below_its_solo_budget(
    amqp: Callable[..., Broker],
) -> None:
    broker, holder = amqp(max_deliveries=MAX_DELIVERIES), amqp(max_deliveries=5, prefetch=1)
    await broker.publish("bs1", [message("b1", "bs1")])
    await broker.state.records.count_solo_start("b1", 60)  # one solo run: below the budget
    await crash_until_dead_lettered(holder, "bs1", "b1")
    await drain(broker, "bs1")
    (again,) = await broker.fetch("bs1", 1, 10)
    assert decode_envelope(again.payload).id == "b1"
    assert again.deliveries == 2  # published as delivered once
    held = broker.transport.held[again.token]  # type: ignore[attr-defined]
    assert (held.message.headers or {}).get(BACKSTOPS) == 1
    assert await broker.get_dead_letter("b1") is None
    assert await broker.dead_letter_count() == 0


async def test_a_task_that_spent_its_solo_budget_is_a_dead_letter(
    amqp: Callable[..., Broker],
) -> None:
    broker, holder = amqp(max_deliveries=MAX_DELIVERIES), amqp(max_deliveries=5, prefetch=1)
    await broker.publish("bs2", [message("b2", "bs2")])
    for _ in range(solo_plan(MAX_DELIVERIES)[1]):  # every solo run it was allowed
        await broker.state.records.count_solo_start("b2", 60)
    await crash_until_dead_lettered(holder, "bs2", "b2")
    await drain(broker, "bs2")
    fields = await broker.get_dead_letter("b2")
    assert fields is not None
    assert fields.reason == "max deliveries exceeded"
    assert await broker.fetch("bs2", 1, 0) == []


async def test_a_task_at_the_limit_too_often_is_a_dead_letter_whatever_its_solo_runs(
    amqp: Callable[..., Broker],
) -> None:
    """A message that kills its worker before it starts counts no solo run: the drain
    publishes it again at most ``BACKSTOP_ROUNDS`` times."""
    broker, holder = amqp(max_deliveries=MAX_DELIVERIES), amqp(max_deliveries=5, prefetch=1)
    transport: Any = broker.transport
    await transport.publish_with("bs3", [message("b3", "bs3")], 1, BACKSTOP_ROUNDS)
    first = delivery_backstop(MAX_DELIVERIES)
    for n in range(1, first + 1):  # marked as delivered once: one more each time
        (got,) = await holder.fetch("bs3", 1, 10)
        assert got.deliveries == n + 1
        await holder.transport.link.close()  # type: ignore[attr-defined]
    await drain(broker, "bs3")
    fields = await broker.get_dead_letter("b3")
    assert fields is not None
    assert fields.reason == "max deliveries exceeded"
