"""Recycling process-pool children (:class:`blitzq.worker.executors.ProcessPool`): replaced after
``max_tasks_per_child`` calls, and the whole pool replaced once a child is past
``max_memory_per_child`` after a call (the calls running there finish)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from pathlib import Path

import pytest

from blitzq.worker.executors import ProcessPool
from blitzq.worker.recycling import rss_bytes
from tests.integration.proc_tasks import eventually, process_id, sleep_with_pid_file, square
from tests.procfs import proc_state
from tests.reliability.test_process_control import pool_hog

pytestmark = pytest.mark.timeout(60)


async def test_a_child_is_replaced_after_max_tasks_per_child_calls() -> None:
    pool = ProcessPool(1, max_tasks_per_child=2)
    try:
        pids = [await pool.submit(process_id, [], {}) for _ in range(4)]
    finally:
        pool.shutdown()
    assert pids[0] == pids[1]
    assert pids[2] == pids[3]
    assert pids[1] != pids[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_the_pool_is_replaced_once_a_child_is_past_max_memory() -> None:
    assert rss_bytes() is not None
    pool = ProcessPool(1, max_memory_per_child=150)
    try:
        small = await pool.submit(process_id, [], {})
        assert await pool.submit(process_id, [], {}) == small  # under the limit: kept
        fat = await pool.submit(pool_hog.fn, [200], {})
        assert fat == small
        after = await pool.submit(process_id, [], {})
    finally:
        pool.shutdown()
    assert after != fat  # a fresh pool


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_kill_reaches_the_calls_still_running_in_a_retired_pool(tmp_path: Path) -> None:
    """A pool replaced past ``max_memory_per_child`` forgets its processes when it is shut
    down, while calls may still run there. A kill (a hard timeout, a cancel) must reach
    them: the call fails at once and its process is returned to be reaped, so the worker
    frees the call's slot only once it is gone; before, it ran on past its timeout."""
    pool = ProcessPool(2, max_memory_per_child=1)  # every process is over 1 MiB
    pid_file = tmp_path / "pid"
    try:
        hung = pool.submit(sleep_with_pid_file, [str(pid_file), 120.0], {})
        await eventually(lambda: asyncio.to_thread(pid_file.exists), bool)
        pid = int(pid_file.read_text())
        assert await pool.submit(square, [4], {}) == 16  # its end retires the pool
        assert await pool.submit(process_id, [], {}) != pid  # a fresh pool took it
        killed = pool.shutdown(kill=True)
        assert pid in [p.pid for p in killed]
        with pytest.raises(concurrent.futures.process.BrokenProcessPool):
            await asyncio.wait_for(hung, 30)
        for process in killed:
            await asyncio.to_thread(process.join, 30)
        assert proc_state(pid) is None  # reaped
    finally:
        pool.shutdown(kill=True)
