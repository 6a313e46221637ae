"""Dead-letter retention, the same on every backend: a byte bound over all dead letters, a
retention TTL, and counts kept right through replay and purge (issue 8, section 1)."""

from __future__ import annotations

import asyncio
import time

from blitzq.broker import Broker, Completion, DeadLetterFields
from blitzq.limits import DEAD_MESSAGE_SAMPLE


def dead(task_id: str, size: int, failed_at: float) -> Completion:
    """A completion dead-lettering ``task_id`` with a message of ``size`` bytes."""
    fields = DeadLetterFields(b"m" * size, "failed", "boom", "t", "q", failed_at)
    return Completion("q", None, task_id, dead_letter=fields)


async def ids(broker: Broker) -> list[str]:
    """Ids of the stored dead letters, newest first."""
    return [task_id for task_id, _ in await broker.dead_letters(0, 100)]


async def test_oldest_dead_letters_go_beyond_the_byte_bound(broker: Broker) -> None:
    broker.dead_letter_limits.max_bytes = 5000  # type: ignore[union-attr]
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
    broker.dead_letter_limits.ttl = 1  # type: ignore[union-attr]
    await broker.complete([dead("short", 10, time.time())])
    assert await ids(broker) == ["short"]
    broker.dead_letter_limits.ttl = 3600  # type: ignore[union-attr]
    await broker.complete([dead("long", 10, time.time())])
    deadline = time.monotonic() + 10
    while await broker.dead_letter_count() > 1:
        assert time.monotonic() < deadline, "the 1 s dead letter never expired"
        await asyncio.sleep(0.05)
    assert await ids(broker) == ["long"]
    assert await broker.get_dead_letter("short") is None


async def test_one_dead_letter_over_the_byte_bound_does_not_wipe_the_others(
    broker: Broker,
) -> None:
    """Issue input: one dead letter larger than ``dead_letter_max_bytes`` used to evict every
    older one and then itself, leaving the store empty. It is cut instead (its message to the
    first DEAD_MESSAGE_SAMPLE bytes, a note in its error) and the others stay."""
    broker.dead_letter_limits.max_bytes = 5000  # type: ignore[union-attr]
    for i in range(3):
        await broker.complete([dead(f"d{i}", 500, 1000.0 + i)])
    await broker.complete([dead("huge", 20000, 1010.0)])
    assert await ids(broker) == ["huge", "d2", "d1", "d0"]
    huge = await broker.get_dead_letter("huge")
    assert huge is not None
    assert huge.message == b"m" * DEAD_MESSAGE_SAMPLE
    assert huge.error.startswith("boom; dead letter over dead_letter_max_bytes=5000")
    assert "20000-byte message" in huge.error
    assert len(huge.message) + len(huge.error) + 64 <= 5000

    # A bound smaller than the sample: the entry still fits it, alone.
    broker.dead_letter_limits.max_bytes = 300  # type: ignore[union-attr]
    await broker.complete([dead("tiny-bound", 20000, 1020.0)])
    assert await ids(broker) == ["tiny-bound"]
    small = await broker.get_dead_letter("tiny-bound")
    assert small is not None
    assert len(small.message) + len(small.error) + 64 <= 300
    assert await broker.dead_letter_count() == 1
