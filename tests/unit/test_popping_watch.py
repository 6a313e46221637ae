"""The one deadline timer of fast mode's pops (``broker/redis/popping._Watch``), without a
server: each read in flight ends at its own budget of the event loop's running time, and a
check that comes late (the loop was blocked: a paused worker) ends none."""

from __future__ import annotations

import asyncio
import time

import pytest

from blitzq.broker.redis import popping

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def short_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks every 0.05 s instead of 0.5 s."""
    monkeypatch.setattr(popping, "TICK", 0.05)


async def watched(budget: float, reply: asyncio.Future[str]) -> str:
    """Wait for ``reply`` as a pop waits for its reply, watched for ``budget`` seconds."""
    loop = asyncio.get_running_loop()
    watch = popping._watch(loop)
    async with asyncio.timeout(None) as scope:
        watch.add(loop, scope, budget)
        try:
            return await reply
        finally:
            watch.discard(scope)


async def test_each_read_ends_at_its_own_budget() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[str] = loop.create_future()
    later: asyncio.Future[str] = loop.create_future()
    short = asyncio.create_task(watched(0.1, never))
    long = asyncio.create_task(watched(60.0, later))
    with pytest.raises(TimeoutError):
        await short
    assert not long.done()
    later.set_result("reply")
    assert await long == "reply"
    assert not popping._watch(loop)._reads


async def test_a_late_check_ends_no_read() -> None:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[str] = loop.create_future()
    read = asyncio.create_task(watched(0.1, reply))
    await asyncio.sleep(0)  # the read is watched
    time.sleep(0.5)  # the loop is blocked past the whole budget (a paused worker)
    for _ in range(3):
        await asyncio.sleep(0)  # the late check runs: it charges one tick, ends nothing
    assert not read.done()
    reply.set_result("reply")  # the reply that came meanwhile is read
    assert await read == "reply"
