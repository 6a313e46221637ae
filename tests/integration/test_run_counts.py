"""Each run counts once in the namespace's ``processed`` / ``failed`` counters, whichever way
it reaches them: with its completion's writes (reliable mode, fast mode with results), or
through the worker's registrations (fast mode without results: nothing is written for a
success); a worker's registrations and its exit add nothing its completions counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from blitzq import Queue

from .proc_tasks import eventually, make_worker, running

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_servers]

#: Tasks that succeed and that fail.
SUCCEED, FAIL = 20, 5


async def _counts(queue: Queue) -> tuple[int, int]:
    counters = await queue.broker.counters()
    return counters.get("processed", 0), counters.get("failed", 0)


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "reliable"},
        {"mode": "fast"},
        {"mode": "fast", "store_results": False},
    ],
    ids=["reliable", "fast", "fast-without-results"],
)
async def test_each_run_counts_once_also_after_registrations_and_exit(
    make_queue: Callable[..., Queue], options: dict[str, Any]
) -> None:
    queue = make_queue(**options)

    @queue.task(name="counted", retries=0)
    async def counted(i: int) -> int:
        if i < FAIL:
            raise ValueError(f"run {i}")
        return i

    worker = make_worker(queue, concurrency=4)
    async with running(worker):
        await counted.enqueue_many([((i,), {}) for i in range(SUCCEED + FAIL)])
        # A registration written after every run ended (the counts refresh, within a
        # second) adds nothing its completions counted.
        await eventually(lambda: _registered(queue), lambda c: c == (SUCCEED, FAIL), 30.0)
        assert await _counts(queue) == (SUCCEED, FAIL)
    # Its exit (the last registration's counts) adds nothing more.
    assert await _counts(queue) == (SUCCEED, FAIL)


async def _registered(queue: Queue) -> tuple[int, int] | None:
    """The (processed, failed) of the one worker's registration, ``None`` when none."""
    infos = list((await queue.broker.workers()).values())
    if len(infos) != 1:
        return None
    info = msgspec.msgpack.decode(infos[0])
    return info["processed"], info["failed"]
