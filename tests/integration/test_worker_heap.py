"""The objects alive when a worker starts fetching are frozen out of the garbage collector's
passes while it runs (``Worker(freeze_gc=True)``, the default), and thawed when the last
worker that froze them stops; ``freeze_gc=False`` leaves the collector alone."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

from blitzq import Queue
from blitzq.exceptions import BrokerError, ConfigurationError

from .proc_tasks import make_worker, running


@pytest.fixture(autouse=True)
def _thawed() -> None:
    gc.unfreeze()  # whatever an earlier test left frozen


async def test_the_heap_is_frozen_while_workers_run_and_thawed_after(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()

    @queue.task(name="heap.echo")
    async def echo(x: int) -> int:
        return x

    try:
        first, second = make_worker(queue), make_worker(queue)
        async with running(first):
            assert await (await echo.enqueue(1)).result(timeout=30) == 1
            assert gc.get_freeze_count() > 0
            async with running(second):
                assert await (await echo.enqueue(2)).result(timeout=30) == 2
            # The first worker still runs: the heap stays frozen.
            assert gc.get_freeze_count() > 0
            assert await (await echo.enqueue(3)).result(timeout=30) == 3
        assert gc.get_freeze_count() == 0
    finally:
        await queue.close()


async def test_freeze_gc_false_leaves_the_collector_alone(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()

    @queue.task(name="heap.echo")
    async def echo(x: int) -> int:
        return x

    try:
        async with running(make_worker(queue, freeze_gc=False)):
            assert await (await echo.enqueue(1)).result(timeout=30) == 1
            assert gc.get_freeze_count() == 0
    finally:
        await queue.close()


async def test_a_worker_that_fails_to_start_freezes_nothing(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(redis_url="redis://127.0.0.1:1/0")  # nothing listens there
    try:
        worker = make_worker(queue)
        with pytest.raises(BrokerError):
            await asyncio.wait_for(worker.run(), 60)
        assert gc.get_freeze_count() == 0
    finally:
        await queue.close()


def test_freeze_gc_must_be_a_bool(make_queue: Callable[..., Queue]) -> None:
    with pytest.raises(ConfigurationError, match="freeze_gc"):
        make_worker(make_queue(), freeze_gc="yes")  # type: ignore[arg-type]
