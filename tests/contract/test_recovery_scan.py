"""Which pending deliveries a recovery round looks at (``claim_idle.lua``).

A round claims from the first delivery idle past the visibility timeout, found in the pending
list (``XPENDING ... IDLE``), and claims nothing without looking the young ones up in the
stream when none is: whatever the order of the entry ids, a delivery idle long enough is
claimed, one handed back included, and a young one never is.
"""

from __future__ import annotations

import asyncio

import pytest

from blitzq.broker import Broker
from tests.broker_kinds import is_amqp

from .test_broker_contract import Q, consumer, ids, message, needs_recovery


async def test_an_idle_delivery_behind_younger_leases_is_recovered(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    await broker.publish(Q, [message(f"young{i}") for i in range(3)] + [message("idle")])
    *young, idle = await broker.fetch(Q, 4, 0)
    assert ids([*young, idle]) == ["young0", "young1", "young2", "idle"]
    await asyncio.sleep(0.25)
    # The older entries' leases renewed: only the newest entry is idle.
    assert await broker.heartbeat(Q, [d.token for d in young if d.token]) == 3
    assert await broker.recover(Q, 0.15, 10, 5) == (1, 0)
    (again,) = await broker.fetch(Q, 10, 0)
    assert ids([again]) == ["idle"]
    assert again.deliveries == 2
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 4}


async def test_only_young_leases_recover_nothing_and_stay_pending(broker: Broker) -> None:
    needs_recovery(broker)
    await consumer(broker)
    await broker.publish(Q, [message(f"run{i}") for i in range(5)])
    assert len(await broker.fetch(Q, 5, 0)) == 5
    assert await broker.recover(Q, 30.0, 10, 5) == (0, 0)
    assert (await broker.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 5}


async def test_a_delivery_handed_back_among_young_ones_is_recovered_at_once(
    broker: Broker,
) -> None:
    needs_recovery(broker)
    if is_amqp(broker):
        pytest.skip("RabbitMQ: a nack requeues the delivery itself, no recovery takes it")
    await consumer(broker)
    await broker.publish(Q, [message("old0"), message("old1"), message("back")])
    *running, back = await broker.fetch(Q, 3, 0)
    assert back.token is not None
    # Added and delivered a moment ago, handed back: idle past a 60 s timeout at once.
    await broker.transport.nack(Q, [back.token])
    assert await broker.recover(Q, 60, 10, 5) == (1, 0)
    (again,) = await broker.fetch(Q, 10, 0)
    assert ids([again]) == ["back"]
    assert len(running) == 2


async def test_a_long_pending_list_is_still_recovered_from_its_head(broker: Broker) -> None:
    """Past 100 x count pending deliveries the round scans from the head, as XAUTOCLAIM
    always did: an idle delivery there is claimed."""
    needs_recovery(broker)
    await consumer(broker)
    await broker.publish(Q, [message(f"m{i}") for i in range(102)])
    first, *rest = await broker.fetch(Q, 102, 0)
    assert len(rest) == 101
    await asyncio.sleep(0.25)
    assert await broker.heartbeat(Q, [d.token for d in rest if d.token]) == 101
    assert await broker.recover(Q, 0.15, 1, 5) == (1, 0)
    (again,) = await broker.fetch(Q, 10, 0)
    assert ids([again]) == [ids([first])[0]]
