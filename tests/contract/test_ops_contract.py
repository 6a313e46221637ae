"""The broker methods of the operator tools, the same on every backend: deleting named dead
letters (a filtered purge) with their byte counts kept right, run-time periodic entries, and
the server description ``blitzq check`` reads."""

from __future__ import annotations

from blitzq.broker import Broker
from tests.contract.test_dead_letter_bounds import dead, ids


async def test_named_dead_letters_are_deleted_and_their_bytes_given_back(broker: Broker) -> None:
    broker.dead_letter_limits.max_bytes = 5000  # type: ignore[union-attr]
    for i in range(3):  # each counts 1500 + 4 + 64 bytes: three fit in 5000
        await broker.complete([dead(f"d{i}", 1500, 1000.0 + i)])
    assert await broker.delete_dead_letters(["d1", "missing", "d1"]) == 1
    assert await ids(broker) == ["d2", "d0"]
    assert await broker.get_dead_letter("d1") is None
    # d1's bytes were given back: one more fits without dropping d0.
    await broker.complete([dead("d3", 1500, 1003.0)])
    assert await ids(broker) == ["d3", "d2", "d0"]
    assert await broker.delete_dead_letters(["d0", "d2", "d3"]) == 3
    assert await broker.dead_letter_count() == 0
    assert await broker.delete_dead_letters([]) == 0


async def test_runtime_periodic_entries_are_stored_and_removed_with_their_last_run(
    broker: Broker,
) -> None:
    assert await broker.state.operations.runtime_periodic() == {}
    await broker.state.operations.set_runtime_periodic("a", b"one")
    await broker.state.operations.set_runtime_periodic("b", b"two")
    await broker.state.operations.set_runtime_periodic("a", b"three")  # replaced
    assert await broker.state.operations.runtime_periodic() == {"a": b"three", "b": b"two"}
    now = await broker.server_time()
    assert await broker.claim_periodic("a", now - 1, b"message", "q")
    assert await broker.periodic_last(["a"]) == {"a": now - 1}
    assert await broker.state.operations.remove_runtime_periodic("a") is True
    assert await broker.state.operations.remove_runtime_periodic("a") is False
    assert await broker.state.operations.runtime_periodic() == {"b": b"two"}
    assert await broker.periodic_last(["a"]) == {}  # a new "a" starts afresh
    await broker.state.operations.remove_runtime_periodic("b")


async def test_server_info_names_the_server_and_its_persistence(broker: Broker) -> None:
    info = await broker.state.operations.server_info()
    assert info["server"] in ("redis", "valkey")
    assert info["version"][0].isdigit()
    assert info["aof_enabled"] in ("0", "1")
