"""The one record schema: the record ``recover.lua`` writes in Lua is the one the Python
writer (:func:`blitzq.records.deliveries_exceeded`) makes, on every backend."""

from __future__ import annotations

import asyncio
import re
from importlib import resources

from blitzq import records
from blitzq.broker import Broker
from blitzq.serialization import loads
from tests.contract.test_broker_contract import Q, consumer, message, needs_fused, needs_recovery

_LUA = resources.files("blitzq.broker.redis") / "lua" / "recover.lua"


def test_recover_lua_record_keys_are_record_fields() -> None:
    source = _LUA.read_text()
    (table,) = re.findall(r"cmsgpack\.pack\(\{(id = .*?)\}\)", source, re.S)
    keys = re.findall(r"(\w+)\s*=", table)
    assert keys, table
    assert set(keys) <= set(records.RECORD_FIELDS)
    written = loads(records.deliveries_exceeded("t", "n", "q", 2, "e", 1.0))
    assert set(keys) == set(written)


async def test_recover_writes_the_builders_record(broker: Broker) -> None:
    needs_recovery(broker)
    needs_fused(broker, "the transport's recovery writes records in its own storage")
    await consumer(broker)
    await broker.publish(Q, [message("exhausted")])
    await broker.fetch(Q, 1, 0)
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 2) == (1, 0)
    await broker.fetch(Q, 1, 0)
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 2, record_ttl=60) == (0, 1)
    raw = await broker.get_record("exhausted")
    assert raw is not None
    stored = loads(raw)
    expected = loads(
        records.deliveries_exceeded(
            "exhausted",
            "tests.contract.task",
            Q,
            2,
            "delivered 2 times without completing (the backstop of 2 deliveries: "
            "4 x max_deliveries, at least 20); the worker running it probably crashed",
            stored["finished_at"],
        )
    )
    assert stored == expected
    assert isinstance(stored["finished_at"], float | int)


async def test_a_recovery_past_max_deliveries_1_names_it(broker: Broker) -> None:
    """The limit a recovery is given is the transports' backstop; ``max_deliveries=1`` is the
    one case where it is the limit itself, and the error says so."""
    needs_recovery(broker)
    needs_fused(broker, "the transport's recovery writes records in its own storage")
    await consumer(broker)
    await broker.publish(Q, [message("once")])
    await broker.fetch(Q, 1, 0)
    await asyncio.sleep(0.1)
    assert await broker.recover(Q, 0.05, 10, 1, record_ttl=60) == (0, 1)
    raw = await broker.get_record("once")
    assert raw is not None
    assert loads(raw)["error"] == (
        "delivered 1 times without completing (max_deliveries=1); "
        "the worker running it probably crashed"
    )
