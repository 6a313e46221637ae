"""Hung thread tasks do not starve the worker (issue 7, section 7).

A sync task past its hard timeout has its failure recorded and its slot freed at once; its
thread is *abandoned* (Python cannot kill it) and the thread pool grows by one thread while it
runs, so the slots the worker counts always find a thread. Abandoned threads are counted
(``Worker.abandoned_threads``); past ``max_abandoned_threads`` the worker stops gracefully and
asks to be restarted (``blitzq worker`` exits with ``EXIT_RESTART``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blitzq import Queue, TaskFailed, TaskState
from blitzq.worker.worker import EXIT_RESTART

from .proc_tasks import eventually, make_worker, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so hung task threads return."""
    event = threading.Event()
    yield event
    event.set()


async def test_a_quick_task_starts_while_hung_thread_tasks_block(
    make_queue: Callable[..., Queue], mode: str, release: threading.Event
) -> None:
    """Issue input: four sync tasks that pass their hard timeout but keep blocking take all
    four slots of a ``-c 4`` worker. A quick task must still start while they block, and the
    tasks the worker counts stay within its concurrency."""
    queue = make_queue(mode=mode)
    lock = threading.Lock()
    counted = {"now": 0, "peak": 0}

    @queue.task(name="a.hung", timeout=0.3, retries=0)
    def hung() -> str:
        release.wait(60)
        return "late"

    @queue.task(name="a.quick")
    def quick(i: int) -> int:
        with lock:
            counted["now"] += 1
            counted["peak"] = max(counted["peak"], counted["now"])
        time.sleep(0.02)
        with lock:
            counted["now"] -= 1
        return i

    hung_handles = await hung.enqueue_many([() for _ in range(4)])
    worker = make_worker(queue, concurrency=4)
    async with running(worker):
        for h in hung_handles:
            with pytest.raises(TaskFailed) as info:
                await h.result(timeout=20)
            assert info.value.error_type is not None
            assert info.value.error_type.endswith("TaskTimeout")
        assert worker.abandoned_threads == 4
        quick_handles = await quick.enqueue_many([(i,) for i in range(12)])
        results = [await h.result(timeout=20) for h in quick_handles]
        assert not release.is_set(), "the hung threads were still blocked"
        assert results == list(range(12))
        assert 1 <= counted["peak"] <= 4
        stats = await queue.broker.workers()
        assert b"abandoned_threads" in stats[worker.id]
        # Once the hung calls return, they are no longer counted.
        release.set()
        await eventually(lambda: asyncio.sleep(0, worker.abandoned_threads), lambda n: n == 0)
        assert worker.abandoned_threads_total == 4
        assert not worker.restart_requested
    for h in hung_handles:
        record = await h.status()
        assert record is not None
        assert record.state is TaskState.DEAD_LETTERED


async def test_past_max_abandoned_threads_the_worker_stops_to_be_restarted(
    make_queue: Callable[..., Queue], release: threading.Event
) -> None:
    """One abandoned thread over ``max_abandoned_threads`` stops the worker gracefully (it
    ends on its own, no stop() call) and marks it for a restart."""
    queue = make_queue()

    @queue.task(name="a.hung", timeout=0.2, retries=0)
    def hung() -> None:
        release.wait(60)

    await hung.enqueue_many([(), ()])
    worker = make_worker(queue, concurrency=2, max_abandoned_threads=1)
    await asyncio.wait_for(worker.run(), 30.0)
    assert worker.restart_requested
    assert worker.restart_reason is not None
    assert "abandoned" in worker.restart_reason
    assert worker.abandoned_threads == 2


def test_blitzq_worker_exits_with_exit_restart_past_the_bound(
    server_url: str, namespace: str, tmp_path: Path, release: threading.Event
) -> None:
    """``blitzq worker --max-abandoned-threads 0``: the first hung thread task makes the
    process exit with EXIT_RESTART (the supervisor restarts it) within a few seconds, though
    the thread still blocks."""
    queue = Queue("hang", redis_url=server_url, namespace=namespace)
    try:
        queue.send_sync("tests.integration.hang_app.hang", [60.0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        cmd = [sys.executable, "-m", "blitzq", "worker", "tests.integration.hang_app:queue"]
        cmd += ["--redis-url", server_url, "--namespace", namespace, "-c", "2"]
        cmd += ["--max-abandoned-threads", "0", "--shutdown-timeout", "1"]
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        output = log.read_text(errors="replace")
        assert code == EXIT_RESTART, output[-3000:]
        assert "abandoned" in output
    finally:
        queue.close_sync()
