"""The dashboard's rates, worker count and running count with several real worker
processes (``blitzq worker --workers 2``), also when they are recycled
(``--max-tasks-per-child``): each process registers under its own id, and the rates add up
every process's increments, including processes that appeared after the oldest sample or
went away since: every registration adds what its worker counted since the previous one to the
namespace's counters, and the rates are their differences between two samples."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import Queue
from blitzq.dashboard import data

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(260)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="plain"),
        pytest.param(["--max-tasks-per-child", "300"], id="recycling"),
    ],
)
async def test_rates_and_workers_with_two_processes(
    make_queue: Callable[..., Queue], server_url: str, namespace: str, extra: list[str]
) -> None:
    """Nine tasks in ten succeed (every tenth fails for good): the rates' window counts
    exactly that many completed, never more, also when each process is recycled every 300
    tasks (a child's registrations and its unregistration add its counts to the namespace's
    counters, whenever the samples are taken). Recycled children start slowly on a busy
    machine: that case runs fewer tasks and polls less often (the sampler keeps 256
    samples, which must cover the whole run)."""
    total, interval = (1500, 0.9) if extra else (4000, 0.4)
    succeeded = total * 9 // 10
    queue = make_queue()

    @queue.task(name="nap")
    async def nap(i: int) -> int:
        return i

    for start in range(0, total, 500):
        await nap.enqueue_many([((i,), {}) for i in range(start, start + 500)])
    env = dict(
        os.environ,
        BLITZQ_REDIS_URL=server_url,
        BLITZQ_NAMESPACE=namespace,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    argv = [sys.executable, "-m", "blitzq", "worker", "tests.integration.rates_app:queue"]
    proc = subprocess.Popen(  # noqa: ASYNC220 - one start, not on a hot path
        [*argv, "--workers", "2", "-c", "10", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # A window over the whole run: 256 samples (the most kept), one every `interval`.
    sampler = data.RateSampler(window=600.0)
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 220
        while time.monotonic() < deadline:
            doc = await data.queues_doc(queue, sampler)
            seen.append(doc)
            assert (doc["rates"]["completed"] or 0) <= succeeded, seen[-3:]
            if doc["rates"]["completed"] == succeeded:
                break
            await asyncio.sleep(interval)  # the poll interval of a deadline loop
    finally:
        proc.terminate()
        proc.wait(30)
    trace = [(d["workers"], d["running"], d["rates"]["completed"]) for d in seen]
    assert seen[-1]["rates"]["completed"] == succeeded, trace
    if not extra:  # a recycled child may live shorter than a poll: both need not be seen
        assert any(d["workers"] == 2 and d["running"] > 0 for d in seen), trace
    assert any((d["rates"]["completed_per_s"] or 0) > 0 for d in seen), seen[-3:]
    assert any((d["rates"]["failed_per_s"] or 0) > 0 for d in seen), seen[-3:]
    # while backlog drains the depth change is not positive
    assert all((d["queues"][0]["depth_per_s"] or 0) <= 0 for d in seen if d["queues"]), [
        d["queues"] for d in seen
    ]


async def test_a_worker_that_starts_and_stops_between_two_samples_counts_all_it_did(
    make_queue: Callable[..., Queue],
) -> None:
    """What the recycling case lost under load, made certain: between two samples a worker
    starts, registers counts, runs more tasks and stops (a recycled child that lives shorter
    than a poll). Every run counts, also those its last registration already reported
    (counting only what followed that registration lost 8 of 16 here)."""
    queue = make_queue()

    @queue.task(name="step", retries=0)
    async def step(i: int) -> int:
        if i % 5 == 0:
            raise ValueError(f"step {i}")
        return i

    sampler = data.RateSampler(window=600.0)
    first = await data.queues_doc(queue, sampler)
    assert first["workers"] == 0
    await step.enqueue_many([((i,), {}) for i in range(10)])
    worker = make_worker(queue, concurrency=4)

    async def registered() -> dict[str, Any]:
        docs = await data.workers_doc(queue)
        return docs[0] if docs else {}

    async with running(worker):
        # Its registration shows the first ten (8 succeeded, 2 failed): counts the old
        # sampler never saw (no sample in between), and not in the counts at its exit.
        await eventually(registered, lambda d: (d.get("processed"), d.get("failed")) == (8, 2))
        await step.enqueue_many([((i,), {}) for i in range(10, 20)])
        await eventually(_async(lambda: (worker.processed, worker.failed)), lambda c: c == (16, 4))

    async def later() -> dict[str, Any]:
        return await data.queues_doc(queue, sampler)

    doc = await eventually(later, lambda d: d["rates"]["window"] is not None)
    assert doc["workers"] == 0
    assert (doc["rates"]["completed"], doc["rates"]["failed"]) == (16, 4), doc


def _async(read: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """``read`` as a coroutine function (a probe of :func:`eventually`)."""

    async def probe() -> Any:
        return read()

    return probe
