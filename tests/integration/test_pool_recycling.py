"""Recycling process-pool children (:class:`blitzq.worker.executors.ProcessPool`): replaced after
``max_tasks_per_child`` calls, and the whole pool replaced once a child is past
``max_memory_per_child`` after a call (the calls running there finish)."""

from __future__ import annotations

import sys

import pytest

from blitzq.worker.executors import ProcessPool
from blitzq.worker.recycling import rss_bytes
from tests.integration.proc_tasks import process_id
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
