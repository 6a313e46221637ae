"""The worker's event listener survives any payload on ``{ns}:events`` (issue 7, section 8).

Anyone can publish on the namespace's event channel. A malformed push is logged and skipped;
the listener goes on, so ``cancel()`` of a running task still stops it. A cancellation whose
push was lost is caught up by the periodic resynchronisation, which now also cancels running
tasks (before, it only updated the list of ids to skip).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, TaskCancelled, TaskState, current_task
from blitzq.worker import maintenance

from .proc_tasks import eventually, make_worker, running

#: Payloads that are not valid events (the listener must skip every one of them).
MALFORMED = [
    b"s:garbage",
    b"s:",
    b"s:nan",
    b"s:1e999",
    b"\xff\xfe\x00\x81",
    b"",
    b"no colon at all",
    b"x:unknown kind",
    b"r",
    b"s:" + b"9" * 100_000,
    "s:\u00e9\u4e2d".encode(),
]


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``ev`` in ``mode``, closed after the test."""
    q = make_queue(name="ev", mode=mode)
    yield q
    await q.close()


async def subscribers(raw_redis: Any, channel: str) -> int:
    """Connections subscribed to ``channel``."""
    answer = await raw_redis.pubsub_numsub(channel)
    return int(answer[0][1])


async def test_malformed_pushes_do_not_stop_the_listener(
    queue: Queue, raw_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()
    thread_started = threading.Event()

    @queue.task(name="ev.sleepy")
    async def sleepy() -> str:
        started.set()
        await asyncio.sleep(60)
        return "not cancelled"

    @queue.task(name="ev.spin")
    def spin() -> str:
        context = current_task()
        assert context is not None
        thread_started.set()
        return "cancelled" if context.wait_cancelled(60) else "not cancelled"

    channel = queue.broker.state.keys.events  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    async with running(make_worker(queue, concurrency=4)):
        await eventually(lambda: subscribers(raw_redis, channel), lambda n: n >= 1, 30.0)
        for payload in MALFORMED:
            await raw_redis.publish(channel, payload)
        handle = await sleepy.enqueue()
        thread_handle = await spin.enqueue()
        await asyncio.wait_for(started.wait(), 30)
        await eventually(lambda: asyncio.sleep(0, thread_started.is_set()), bool, 30.0)
        # A well-formed schedule push after the garbage is still acted on (no error).
        await raw_redis.publish(channel, f"s:{time.time() + 3600!r}")
        await handle.cancel()
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=30)
        await thread_handle.cancel()
        with pytest.raises(TaskCancelled):
            await thread_handle.result(timeout=30)
        assert await subscribers(raw_redis, channel) >= 1  # still subscribed
    record = await handle.status()
    assert record is not None
    assert record.state is TaskState.CANCELLED
    warnings = [r for r in caplog.records if "malformed push" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not once per push


async def test_a_lost_cancel_push_is_caught_up_by_the_resynchronisation(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resynchronisation runs in the maintenance loop: every max(REVOCATION_SYNC,
    # visibility_timeout / 3) seconds; both made short here.
    monkeypatch.setattr(maintenance, "REVOCATION_SYNC", 0.3)
    queue = make_queue(name="ev", mode=mode, visibility_timeout=1.5)
    started = asyncio.Event()

    @queue.task(name="ev.sleepy")
    async def sleepy() -> str:
        started.set()
        await asyncio.sleep(60)
        return "not cancelled"

    async with running(make_worker(queue, concurrency=2)):
        handle = await sleepy.enqueue()
        await asyncio.wait_for(started.wait(), 30)
        # The mark cancel() leaves, without its push (as if the listener missed it).
        revoked = queue.broker.state.keys.revoked  # type: ignore[attr-defined]
        await raw_redis.zadd(revoked, {handle.id: time.time() + 3600})
        with pytest.raises(TaskCancelled):
            await handle.result(timeout=30)
    await queue.close()
