"""``max_tasks_per_child`` inside one worker, against a real Redis, in both modes.

A worker whose concurrency is far above the limit fetches more deliveries than it may start:
exactly ``max_tasks_per_child`` runs start, the rest (the end of a fetch batch, deliveries
still in their start checks) go back to the queue untouched, and the next worker runs them.
A task lock place taken by the start check of a handed-back delivery is given back with it
(not left to lapse with its lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue

from .proc_tasks import make_worker

pytestmark = pytest.mark.timeout(60)

LIMIT, TASKS = 5, 40


@pytest.mark.parametrize("mode", ["reliable", "fast"])
@pytest.mark.parametrize("checks", [False, True], ids=["no-checks", "lock-check"])
async def test_exactly_max_tasks_per_child_runs_start_in_each_worker(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, mode: str, checks: bool
) -> None:
    queue = make_queue(name="mt", mode=mode)
    current: list[int] = [0]
    ran: list[tuple[int, int]] = []  # (worker index, task number)
    # With the lock, every start goes through a start check (20 places: never locked out).
    options: dict[str, Any] = {"lock": "pool", "lock_limit": 20} if checks else {}

    @queue.task(name="mt.step", **options)
    async def step(n: int) -> int:
        ran.append((current[0], n))
        await asyncio.sleep(0.05)
        return n

    try:
        handles = [await step.enqueue(n) for n in range(TASKS)]
        for index in range(TASKS // LIMIT):
            current[0] = index
            worker = make_worker(queue, concurrency=20, max_tasks_per_child=LIMIT)
            await asyncio.wait_for(worker.run(), 30)
            assert worker.restart_requested
            assert sum(1 for w, _ in ran if w == index) == LIMIT, ran
        assert [await h.result(timeout=10) for h in handles] == list(range(TASKS))
        assert sorted(n for _, n in ran) == list(range(TASKS))  # none lost, none twice
        lock_key = "{" + namespace + "}:lk:pool"  # the lock's holders (sorted set)
        assert await raw_redis.zcard(lock_key) == 0  # every place given back
    finally:
        await queue.close()
