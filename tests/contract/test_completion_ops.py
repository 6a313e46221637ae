"""Contract: operations carried by a Completion apply atomically with it, on every broker."""

from __future__ import annotations

from typing import Any

import pytest

from blitzq import BrokerError
from blitzq.broker import Broker, Completion
from blitzq.broker.effects import Publish
from blitzq.serialization import Envelope, decode_envelope, encode_envelope


def message(task_id: str, queue: str) -> bytes:
    return encode_envelope(Envelope(task_id, "t", queue), 1 << 20)


async def test_a_publish_op_publishes_together_with_the_ack(broker: Broker) -> None:
    await broker.prepare_consumer(["first", "next"], "c1")
    await broker.publish("first", [message("a", "first")])
    (delivery,) = await broker.fetch("first", 1, 0)
    follow_up = message("b", "next")
    await broker.complete(
        [Completion("first", delivery.token, "a", ops=(Publish("next", follow_up),))]
    )
    (published,) = await broker.fetch("next", 1, 0)
    assert decode_envelope(published.payload).id == "b"
    assert await broker.fetch("first", 1, 0) == []
    stats = await broker.queue_stats(["first"])
    assert stats["first"]["in_flight"] == 0


async def test_an_unknown_op_is_refused_as_a_permanent_error(broker: Broker) -> None:
    await broker.prepare_consumer(["first"], "c1")
    unknown: Any = object()  # no completion effect
    with pytest.raises(BrokerError) as refused:
        await broker.complete([Completion("first", None, "x", ops=(unknown,))])
    assert refused.value.transient is False
