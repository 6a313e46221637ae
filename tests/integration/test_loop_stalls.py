"""A worker says when its event loop stalled long enough for its leases to lapse.

A user-style test ran a plain function doing ``sum(range(2 * 10**8))`` (one C call: the GIL
held for 15 s, the event loop of the worker starved) with ``visibility_timeout=6``: the task
ran five times and was dead-lettered as "probably crashed", and the only hint in the log
blamed a paused process. ``worker/stalls.py`` now says what happened and what to do.
"""

from __future__ import annotations

import logging

import pytest

from blitzq import Queue

from .proc_tasks import make_worker, running


def gil_hog(n: int) -> int:
    """Hold the GIL for the whole of one C call (a sum over a range is never interrupted)."""
    return sum(range(n))


@pytest.mark.timeout(120)
async def test_a_thread_task_holding_the_gil_is_named_as_a_stall(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue(redis_url=redis_url, namespace=namespace, visibility_timeout=2)
    hog = queue.task(name="stalls.hog")(gil_hog)
    n = 3 * 10**8  # seconds of one C call, more on a loaded machine: over the 1 s bound
    try:
        with caplog.at_level(logging.WARNING, logger="blitzq.worker"):
            async with running(make_worker(queue, concurrency=1)) as worker:
                handle = await hog.enqueue(n)
                assert await handle.result(timeout=100) == n * (n - 1) // 2
                stalls = worker._maintenance.stalls.stalls
    finally:
        await queue.close()
    warned = [r.getMessage() for r in caplog.records if "event loop did not run" in r.getMessage()]
    assert stalls >= 1
    assert warned, [r.getMessage() for r in caplog.records]
    assert "holding the GIL" in warned[0]
    assert "executor='cpu'" in warned[0]
