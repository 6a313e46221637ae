"""Unique tasks against a real Redis, in both modes.

A duplicate call inside the window returns the existing task's handle and publishes nothing;
racing producers in several processes enqueue exactly one task; ``unique_until="start"``
frees the key as the task starts, ``"completion"`` when it is final.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue

from .control_app import build_queue, obs
from .proc_tasks import eventually, make_worker, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue], mode: str) -> Any:
    """A Queue named ``uq`` in ``mode``, closed after the test."""
    q = make_queue(name="uq", mode=mode)
    yield q
    await q.close()


async def waiting(queue: Queue) -> int:
    """Messages waiting on the ``uq`` queue."""
    stats = await queue.broker.queue_stats(["uq"])
    return stats["uq"]["waiting"]


async def test_a_duplicate_returns_the_existing_handle_and_publishes_nothing(
    queue: Queue,
) -> None:
    @queue.task(name="u.send", unique=True)
    async def send(to: str, subject: str = "hi") -> str:
        return to

    first = await send.enqueue("a@example.com", subject="x")
    again = await send.enqueue("a@example.com", subject="x")
    other = await send.enqueue("a@example.com", subject="y")
    assert first.duplicate is False
    assert again.duplicate is True
    assert again.id == first.id
    assert other.duplicate is False
    assert other.id != first.id
    assert await waiting(queue) == 2
    many = await send.enqueue_many([(("a@example.com",), {"subject": "x"}), ("b@example.com",)])
    assert [h.duplicate for h in many] == [True, False]
    assert many[0].id == first.id
    assert await waiting(queue) == 3


async def test_keyword_order_does_not_change_the_key(queue: Queue) -> None:
    @queue.task(name="u.kw", unique=True)
    async def kw(a: int = 0, b: int = 0) -> None:
        return None

    first = await kw.enqueue(a=1, b=2)
    again = await kw.enqueue(b=2, a=1)
    assert again.duplicate
    assert again.id == first.id


async def test_the_order_of_a_dict_arguments_keys_does_not_change_the_key(queue: Queue) -> None:
    @queue.task(name="u.dict", unique=True)
    async def config(settings: dict[str, object]) -> None:
        return None

    first = await config.enqueue({"a": 1, "b": {"y": 2, "x": [1, {"q": 1, "p": 2}]}})
    again = await config.enqueue({"b": {"x": [1, {"p": 2, "q": 1}], "y": 2}, "a": 1})
    assert again.duplicate
    assert again.id == first.id
    other = await config.enqueue({"a": 1, "b": {"y": 2, "x": [1, {"q": 1, "p": 3}]}})
    assert not other.duplicate


async def test_unique_key_option_overrides_the_argument_hash(queue: Queue) -> None:
    @queue.task(name="u.report", unique=True)
    async def report(day: str, requested_by: str) -> None:
        return None

    first = await report.options(unique_key="report:2026-11-30").enqueue("2026-11-30", "ann")
    again = await report.options(unique_key="report:2026-11-30").enqueue("2026-11-30", "bob")
    assert again.duplicate
    assert again.id == first.id

    @queue.task(name="u.plain")
    async def plain() -> None:
        return None

    with pytest.raises(ConfigurationError):
        await plain.options(unique_key="k").enqueue()


async def test_until_completion_keeps_the_key_while_running(queue: Queue) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @queue.task(name="u.long", unique=True, unique_until="completion")
    async def long(x: int) -> int:
        started.set()
        await release.wait()
        return x

    first = await long.enqueue(1)
    async with running(make_worker(queue, concurrency=4)):
        await asyncio.wait_for(started.wait(), 5)
        during = await long.enqueue(1)
        assert during.duplicate
        assert during.id == first.id
        release.set()
        assert await first.result(timeout=5) == 1
        after = await eventually(lambda: long.enqueue(1), lambda h: not h.duplicate, 30.0)
        assert after.id != first.id
        assert await after.result(timeout=5) == 1


async def test_until_start_frees_the_key_as_the_task_starts(queue: Queue) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @queue.task(name="u.starting", unique=True, unique_until="start")
    async def starting(x: int) -> int:
        started.set()
        await release.wait()
        return x

    first = await starting.enqueue(1)
    assert (await starting.enqueue(1)).duplicate  # still queued: a duplicate
    async with running(make_worker(queue, concurrency=4)):
        await asyncio.wait_for(started.wait(), 5)
        # Running: the key was freed at the start, so the same call is accepted again.
        second = await eventually(lambda: starting.enqueue(1), lambda h: not h.duplicate, 30.0)
        assert second.id != first.id
        release.set()
        assert await first.result(timeout=5) == 1
        assert await second.result(timeout=5) == 1


async def test_a_failed_task_frees_its_key(queue: Queue) -> None:
    @queue.task(name="u.fails", unique=True, retries=0)
    async def fails() -> None:
        raise ValueError("boom")

    first = await fails.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        with pytest.raises(Exception, match="boom"):
            await first.result(timeout=5)
        again = await eventually(lambda: fails.enqueue(), lambda h: not h.duplicate, 30.0)
        assert again.id != first.id


def test_racing_producers_in_four_processes_run_exactly_one_task(
    redis_url: str, namespace: str, mode: str, tmp_path: Path
) -> None:
    import redis

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [redis_url, namespace, mode, "1.5", "60"]
    producers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration.control_app", "enqueue", *args, "20", "same"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(4)
    ]
    for p in producers:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out.decode(errors="replace")
    client = redis.Redis.from_url(redis_url)
    answers = [a.decode() for a in client.lrange(obs(namespace, "answers"), 0, -1)]
    assert len(answers) == 80
    new = [a for a in answers if a.startswith("new:")]
    assert len(new) == 1
    task_id = new[0].removeprefix("new:")
    assert all(a.split(":", 1)[1] == task_id for a in answers)

    queue = build_queue(redis_url, namespace, mode, 1.5, 60)

    async def run() -> None:
        async with running(make_worker(queue, concurrency=8)):
            assert await queue.get_result(task_id, timeout=10) == "same"
        await queue.close()

    asyncio.run(run())
    assert client.hget(obs(namespace, "runs"), "same") == b"1"
    client.close()


async def test_cancelling_a_unique_task_frees_its_key_at_once(queue: Queue) -> None:
    """A cancelled task may never reach a worker, so the cancel itself frees the key."""

    @queue.task(name="u.cancelled", unique=True)
    async def once(x: int) -> int:
        return x

    delayed = await once.options(delay=30).enqueue(2)
    assert await delayed.cancel() == "scheduled"
    queued = await once.enqueue(3)
    assert await queued.cancel() in ("pending", "queued")
    again_delayed = await once.enqueue(2)
    again_queued = await once.enqueue(3)
    assert again_delayed.duplicate is False
    assert again_delayed.id != delayed.id
    assert again_queued.duplicate is False
    assert again_queued.id != queued.id


async def test_a_duplicate_leaves_no_record_with_track_state(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """The ``queued`` record is written before the claim (a fast worker cannot overtake it);
    a duplicate's is deleted after it: only the holder's record stays."""
    q = make_queue(name="uq", mode=mode, track_state=True)
    try:

        @q.task(name="u.tracked", unique=True)
        async def tracked(x: int) -> int:
            return x

        first = await tracked.enqueue(1)
        again = await tracked.options(task_id="u-dup-1").enqueue(1)
        assert again.duplicate
        assert again.id == first.id
        assert await q.broker.get_record("u-dup-1") is None
        assert await q.broker.get_record(first.id) is not None
    finally:
        await q.close()
