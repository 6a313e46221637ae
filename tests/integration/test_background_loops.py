"""A worker's background loops outlive one bad payload or one error (issue 7, §8 siblings).

- The revoked set holds whatever anyone wrote there: a member that is not UTF-8 used to stop
  the worker at start (and the maintenance loop, which also renews leases, later on).
- The completion writer: a completion that cannot even be sent used to end the flusher, after
  which no completion of that worker was ever written again. It is now dropped (logged) and
  the others are written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, TaskCancelled
from blitzq.broker import Completion
from blitzq.worker import maintenance

from .proc_tasks import make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``bg`` in ``mode``, closed after the test."""
    q = make_queue(name="bg", mode=mode, visibility_timeout=1.5)  # maintenance every 0.5 s
    yield q
    await q.close()


async def test_a_revoked_member_that_is_not_utf8_stops_nothing(
    queue: Queue, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "REVOCATION_SYNC", 0.3)  # re-read it often
    revoked = queue.broker.state.keys.revoked  # type: ignore[attr-defined]
    await raw_redis.zadd(revoked, {b"\xff\xfe not utf-8": time.time() + 3600})
    started = asyncio.Event()

    @queue.task(name="bg.sleepy")
    async def sleepy() -> str:
        started.set()
        await asyncio.sleep(60)
        return "not cancelled"

    @queue.task(name="bg.double")
    async def double(x: int) -> int:
        return 2 * x

    async with running(make_worker(queue, concurrency=2)):
        assert await (await double.enqueue(21)).result(timeout=30) == 42
        handle = await sleepy.enqueue()
        await asyncio.wait_for(started.wait(), 30)
        await asyncio.sleep(0.7)  # a couple of resynchronisations went by
        await handle.cancel()
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=30)
        assert await (await double.enqueue(4)).result(timeout=30) == 8


async def test_a_completion_that_cannot_be_sent_is_dropped_and_the_writer_goes_on(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    @queue.task(name="bg.double")
    async def double(x: int) -> int:
        return 2 * x

    caplog.set_level(logging.ERROR, logger="blitzq.worker")
    worker = make_worker(queue, concurrency=2)
    async with running(worker):
        assert await (await double.enqueue(1)).result(timeout=30) == 2
        # A completion whose record is not bytes: it cannot be encoded for the script.
        bad = Completion("bg", None, "bg-bad", record=object(), record_ttl=60)  # type: ignore[arg-type]
        worker._flusher.add(bad)
        handles = [await double.enqueue(i) for i in range(5)]
        assert [await h.result(timeout=30) for h in handles] == [0, 2, 4, 6, 8]
    assert any("bg-bad" in r.getMessage() for r in caplog.records)
