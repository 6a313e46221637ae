"""Dead-letter retention, the same on every backend: a byte bound over all dead letters, a
retention TTL, and counts kept right through replay and purge (issue 8, section 1)."""

from __future__ import annotations

import asyncio
import time

from blitzq.broker.base import Broker, Completion, DeadLetterFields


def dead(task_id: str, size: int, failed_at: float) -> Completion:
    """A completion dead-lettering ``task_id`` with a message of ``size`` bytes."""
    fields = DeadLetterFields(b"m" * size, "failed", "boom", "t", "q", failed_at)
    return Completion("q", None, task_id, dead_letter=fields)


async def ids(broker: Broker) -> list[str]:
    """Ids of the stored dead letters, newest first."""
    return [task_id for task_id, _ in await broker.dead_letters(0, 100)]


async def test_oldest_dead_letters_go_beyond_the_byte_bound(broker: Broker) -> None:
    broker.dead_letter_max_bytes = 5000  # type: ignore[attr-defined]
    for i in range(6):  # each counts 1500 + 4 + 64 bytes: three fit in 5000
        await broker.complete([dead(f"d{i}", 1500, 1000.0 + i)])
    assert await ids(broker) == ["d5", "d4", "d3"]
    assert await broker.dead_letter_count() == 3
    assert await broker.replay_dead_letter("d5", "q", b"again")
    await broker.complete([dead("d6", 1500, 1006.0), dead("d7", 1500, 1007.0)])
    assert await ids(broker) == ["d7", "d6", "d4"]  # d5's bytes were given back by the replay
    assert await broker.purge_dead_letters() == 3
    await broker.complete([dead(f"e{i}", 1500, 2000.0 + i) for i in range(3)])
    assert await ids(broker) == ["e2", "e1", "e0"]  # the purge reset the count


async def test_dead_letters_expire_after_the_ttl(broker: Broker) -> None:
    broker.dead_letter_ttl = 1  # type: ignore[attr-defined]
    await broker.complete([dead("short", 10, time.time())])
    assert await ids(broker) == ["short"]
    broker.dead_letter_ttl = 3600  # type: ignore[attr-defined]
    await broker.complete([dead("long", 10, time.time())])
    deadline = time.monotonic() + 10
    while await broker.dead_letter_count() > 1:
        assert time.monotonic() < deadline, "the 1 s dead letter never expired"
        await asyncio.sleep(0.05)
    assert await ids(broker) == ["long"]
    assert await broker.get_dead_letter("short") is None
