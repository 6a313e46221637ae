"""Contract: task progress is stored newest-wins, pushed to watchers, and the ``progress``
completion op writes it atomically with the completion, on every broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from blitzq.broker import Broker, Completion
from blitzq.broker.effects import Progress
from blitzq.progress import decode_progress, encode_progress
from blitzq.serialization import dumps


async def next_event(events: AsyncGenerator[tuple[str, bytes], None]) -> tuple[str, bytes]:
    return await asyncio.wait_for(anext(events), 5)


async def test_the_newest_update_wins_whatever_order_writes_arrive_in(broker: Broker) -> None:
    assert await broker.get_progress("p1") is None
    newer = encode_progress(2, 10, "two", 200.0)
    older = encode_progress(1, 10, "one", 100.0)
    assert await broker.set_progress("p1", newer, 200.0, 60) is True
    assert await broker.set_progress("p1", older, 100.0, 60) is False
    stored = await broker.get_progress("p1")
    assert stored is not None
    assert decode_progress(stored)[0].message == "two"
    # The completion op obeys the same rule.
    await broker.complete([Completion("q", None, "p1", ops=(Progress("p1", 150.0, older, 60),))])
    stored = await broker.get_progress("p1")
    assert stored is not None
    assert decode_progress(stored)[0].current == 2


async def test_watchers_get_the_stored_state_then_pushed_updates_and_records(
    broker: Broker,
) -> None:
    await broker.set_progress("p2", encode_progress(1, 3, None, 1.0), 1.0, 60)
    events = broker.watch_progress("p2")
    try:
        kind, data = await next_event(events)
        assert kind == "progress"
        assert decode_progress(data)[0].current == 1
        await broker.set_progress("p2", encode_progress(2, 3, None, 2.0), 2.0, 60)
        kind, data = await next_event(events)
        assert (kind, decode_progress(data)[0].current) == ("progress", 2)
        last = encode_progress(3, 3, "done", 3.0, final=True)
        record = dumps({"id": "p2", "task": "t", "queue": "q", "state": "succeeded"})
        await broker.complete(
            [Completion("q", None, "p2", record, 60, ops=(Progress("p2", 3.0, last, 60),))]
        )
        seen = [await next_event(events), await next_event(events)]
        assert sorted(kind for kind, _ in seen) == ["progress", "record"]
        progress = dict(seen)["progress"]
        assert decode_progress(progress) == decode_progress(last)
        assert decode_progress(progress)[1] is True
    finally:
        await events.aclose()
